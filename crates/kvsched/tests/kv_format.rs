//! The chunk format: round trips, and every kind of damage refused with the right error.

use kvsched::kv::{ChunkCodec, ChunkError, ChunkErrorClass, ChunkHeader, ChunkKey, FLAG_MAC};
use proptest::prelude::*;

const KEY: ChunkKey = ChunkKey(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff);
const MAC_KEY: [u8; 32] = [0x5a; 32];

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}

fn plain() -> ChunkCodec {
    ChunkCodec::new(None)
}

fn keyed() -> ChunkCodec {
    ChunkCodec::new(Some(MAC_KEY))
}

proptest! {
    #[test]
    fn round_trip(key in any::<u128>(), group in any::<u32>(), tokens in any::<u32>(),
                  len in prop_oneof![0usize..300, 16_000usize..17_000], mac in any::<bool>()) {
        let codec = if mac { keyed() } else { plain() };
        let p = payload(len);
        let v = codec.encode(ChunkKey(key), group, tokens, &p);
        prop_assert_eq!(v.len(), codec.encoded_len(len));
        prop_assert_eq!(codec.decode(&v, ChunkKey(key), group, len as u64), Ok(&p[..]));
        let h = ChunkHeader::parse(&v).unwrap();
        prop_assert_eq!((h.key, h.group, h.tokens, h.payload_len), (ChunkKey(key), group, tokens, len as u64));
        prop_assert_eq!(h.has_mac(), mac);
        // A checksum-only reader accepts a MAC'd chunk (it checks the checksum).
        prop_assert_eq!(plain().decode(&v, ChunkKey(key), group, len as u64), Ok(&p[..]));
        // encode_into appends.
        let mut buf = vec![1, 2, 3];
        codec.encode_into(&mut buf, ChunkKey(key), group, tokens, &p);
        prop_assert_eq!(&buf[3..], &v[..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = plain().decode(&bytes, KEY, 0, 10);
        let _ = keyed().decode(&bytes, KEY, 0, 10);
        let _ = ChunkHeader::parse(&bytes);
    }

    /// Any set of byte changes yields the original payload or an error, never another payload.
    #[test]
    fn damage_never_decodes_to_another_payload(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..), 1..6),
        mac in any::<bool>(),
    ) {
        let codec = if mac { keyed() } else { plain() };
        let p = payload(100);
        let mut v = codec.encode(KEY, 3, 16, &p);
        for (at, x) in &edits {
            let i = at.index(v.len());
            v[i] ^= x;
        }
        if let Ok(got) = codec.decode(&v, KEY, 3, 100) {
            prop_assert_eq!(got, &p[..]);
        }
    }
}

/// The error every single-bit flip of byte `i` must give, by header region.
fn expect_flip(codec: &ChunkCodec, v: &[u8], i: usize, bit: u8) {
    let mut d = v.to_vec();
    d[i] ^= 1 << bit;
    let got = codec.decode(&d, KEY, 3, 100);
    let ok = match i {
        0..=3 => matches!(got, Err(ChunkError::BadMagic(_))),
        4..=5 => matches!(got, Err(ChunkError::UnsupportedVersion(_))),
        // The MAC bit changes where the payload starts: the checksum (or length) fails.
        6 if bit == 0 => matches!(
            got,
            Err(ChunkError::ChecksumMismatch { .. } | ChunkError::Truncated { .. })
        ),
        6..=7 => matches!(got, Err(ChunkError::UnsupportedFlags(_))),
        // Payload length: a larger one is a truncation, a smaller one fails the checksum.
        32..=39 => matches!(
            got,
            Err(ChunkError::ChecksumMismatch { .. } | ChunkError::Truncated { .. })
        ),
        48..=79 if codec.has_mac_key() => matches!(got, Err(ChunkError::MacMismatch)),
        // Key, group, tokens, checksum, payload.
        _ => matches!(got, Err(ChunkError::ChecksumMismatch { .. })),
    };
    assert!(ok, "flip of byte {i} bit {bit}: {got:?}");
}

#[test]
fn every_bit_flip_is_caught_by_the_field_it_hits() {
    for codec in [plain(), keyed()] {
        let v = codec.encode(KEY, 3, 16, &payload(100));
        for i in 0..v.len() {
            for bit in 0..8 {
                expect_flip(&codec, &v, i, bit);
            }
        }
    }
}

#[test]
fn a_damaged_mac_is_harmless_to_a_checksum_only_reader() {
    // The checksum covers the header fields and payload, not the MAC: the payload is intact.
    let mut v = keyed().encode(KEY, 3, 16, &payload(100));
    v[60] ^= 0xff;
    assert_eq!(plain().decode(&v, KEY, 3, 100), Ok(&payload(100)[..]));
    assert_eq!(
        keyed().decode(&v, KEY, 3, 100),
        Err(ChunkError::MacMismatch)
    );
}

#[test]
fn truncation_at_every_length_is_caught() {
    for codec in [plain(), keyed()] {
        let v = codec.encode(KEY, 3, 16, &payload(100));
        for n in 0..v.len() {
            match codec.decode(&v[..n], KEY, 3, 100) {
                Err(e @ ChunkError::Truncated { have, .. }) => {
                    assert_eq!(have, n as u64);
                    assert_eq!(e.class(), ChunkErrorClass::Format);
                }
                other => panic!("cut to {n}: {other:?}"),
            }
        }
    }
}

#[test]
fn trailing_bytes_are_caught() {
    let mut v = plain().encode(KEY, 3, 16, &payload(100));
    v.push(0);
    assert!(matches!(
        plain().decode(&v, KEY, 3, 100),
        Err(ChunkError::ChecksumMismatch { .. })
    ));
}

#[test]
fn wrong_key_group_or_length_is_refused() {
    for codec in [plain(), keyed()] {
        let v = codec.encode(KEY, 3, 16, &payload(100));
        let other = ChunkKey(KEY.0 ^ 1);
        let e = codec.decode(&v, other, 3, 100).unwrap_err();
        assert_eq!(
            e,
            ChunkError::KeyMismatch {
                expected: other,
                found: KEY
            }
        );
        assert_eq!(e.class(), ChunkErrorClass::KeyMismatch);
        let e = codec.decode(&v, KEY, 4, 100).unwrap_err();
        assert_eq!(
            e,
            ChunkError::GroupMismatch {
                expected: 4,
                found: 3
            }
        );
        assert_eq!(e.class(), ChunkErrorClass::KeyMismatch);
        let e = codec.decode(&v, KEY, 3, 99).unwrap_err();
        assert_eq!(
            e,
            ChunkError::LengthMismatch {
                expected: 99,
                found: 100
            }
        );
        assert_eq!(e.class(), ChunkErrorClass::Format);
        assert!(e.to_string().contains("payload length"), "{e}");
    }
}

#[test]
fn other_versions_and_flags_are_refused() {
    let mut v = plain().encode(KEY, 3, 16, &payload(10));
    v[4..6].copy_from_slice(&2u16.to_le_bytes());
    assert_eq!(
        plain().decode(&v, KEY, 3, 10),
        Err(ChunkError::UnsupportedVersion(2))
    );
    let mut v = plain().encode(KEY, 3, 16, &payload(10));
    v[6..8].copy_from_slice(&(0x8000u16 | FLAG_MAC).to_le_bytes());
    assert_eq!(
        plain().decode(&v, KEY, 3, 10),
        Err(ChunkError::UnsupportedFlags(0x8000))
    );
    assert!(matches!(
        plain().decode(b"KVCX", KEY, 3, 10),
        Err(ChunkError::Truncated { have: 4, need: 48 })
    ));
}

/// Rewrites the checksum of `v` (no MAC) the way anyone without the MAC key can.
fn reseal(v: &mut [u8]) {
    let sum = xxhash_rust::xxh3::xxh3_64(&[&v[..40], &v[48..]].concat());
    v[40..48].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn mac_missing_wrong_or_forged_is_refused() {
    let p = payload(100);
    // Missing: a checksum-only chunk read by a keyed codec.
    let v = plain().encode(KEY, 3, 16, &p);
    let e = keyed().decode(&v, KEY, 3, 100).unwrap_err();
    assert_eq!(
        (e.clone(), e.class()),
        (ChunkError::MacMissing, ChunkErrorClass::Mac)
    );
    // Wrong: written under another key.
    let v = ChunkCodec::new(Some([1; 32])).encode(KEY, 3, 16, &p);
    assert_eq!(
        keyed().decode(&v, KEY, 3, 100),
        Err(ChunkError::MacMismatch)
    );
    // Forged: a changed payload with a correct checksum and the old MAC.
    let mut v = keyed().encode(KEY, 3, 16, &p);
    v[90] ^= 1;
    let sum = xxhash_rust::xxh3::xxh3_64(&[&v[..40], &v[80..]].concat());
    v[40..48].copy_from_slice(&sum.to_le_bytes());
    assert!(
        plain().decode(&v, KEY, 3, 100).is_ok(),
        "the forgery passes the checksum"
    );
    assert_eq!(
        keyed().decode(&v, KEY, 3, 100),
        Err(ChunkError::MacMismatch)
    );
    // Forged: the MAC stripped and the flag cleared, checksum resealed.
    let mut v = keyed().encode(KEY, 3, 16, &p);
    v.drain(48..80);
    v[6..8].copy_from_slice(&0u16.to_le_bytes());
    reseal(&mut v);
    assert_eq!(plain().decode(&v, KEY, 3, 100), Ok(&p[..]));
    assert_eq!(keyed().decode(&v, KEY, 3, 100), Err(ChunkError::MacMissing));
    // Forged: another block's identity on a real chunk, checksum resealed.
    let mut v = keyed().encode(KEY, 3, 16, &p);
    v[24..28].copy_from_slice(&4u32.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&[&v[..40], &v[80..]].concat());
    v[40..48].copy_from_slice(&sum.to_le_bytes());
    assert_eq!(
        keyed().decode(&v, KEY, 4, 100),
        Err(ChunkError::MacMismatch)
    );
}

#[test]
fn errors_name_the_field() {
    let v = plain().encode(KEY, 3, 16, &payload(10));
    let msgs = [
        plain()
            .decode(&v[..20], KEY, 3, 10)
            .unwrap_err()
            .to_string(),
        plain()
            .decode(&v, ChunkKey(1), 3, 10)
            .unwrap_err()
            .to_string(),
        plain().decode(&v, KEY, 9, 10).unwrap_err().to_string(),
        keyed().decode(&v, KEY, 3, 10).unwrap_err().to_string(),
    ];
    for (m, field) in msgs.iter().zip(["truncated", "key", "group", "mac"]) {
        assert!(m.contains(field), "{m:?} should name {field}");
    }
}
