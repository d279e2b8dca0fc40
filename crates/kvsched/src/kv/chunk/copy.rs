//! [`ChunkCodec::decode_to`]: a chunk's decode and the copy of its payload in one pass over
//! its bytes. The payload is handed to the caller's sink in blocks of [`COPY_BLOCK`] bytes (with
//! a MAC key the first is short by the header, so the MAC hashes aligned blocks),
//! each right after the checksum (and the MAC, with a key) has read it, so the copy reads it
//! again from the core's cache instead of from memory: a load of a large chunk reads it from
//! memory once, not twice. The header checks (format, length, key, group, MAC present) come
//! first, so a chunk of the wrong block never reaches the sink; the checksum and MAC are
//! known only at the end, so the sink has by then been given every byte of a chunk that may
//! fail them — the caller writes into a destination it poisons on an error.

use std::hash::Hasher as _;

use super::{checksum_head, ChunkCodec, ChunkError, ChunkHeader, HEADER_LEN, MAC_LEN};
use crate::kv::ChunkKey;

/// Payload bytes checksummed, then given to the sink, at a time: well inside a core's L2
/// (and mostly inside its L1), and a multiple of BLAKE3's 1 KiB chunks wide enough for its
/// widest SIMD batch.
pub(crate) const COPY_BLOCK: usize = 16 << 10;

impl ChunkCodec {
    /// The payload of `value`, checked exactly as [`decode`](Self::decode) checks it (same
    /// errors, same order), also given to `sink(offset, bytes)` block by block, in order,
    /// as it is checksummed.
    ///
    /// When the header does not match what is expected (an error `decode` finds before the
    /// checksum, or a key, group or length that is not the expected one) the sink is never
    /// called. When the checksum or MAC fails, the sink has been given the whole payload:
    /// the caller must discard what it wrote (a load poisons the destination block).
    /// Never panics and never allocates.
    pub(crate) fn decode_to<'v>(
        &self,
        value: &'v [u8],
        expected_key: ChunkKey,
        expected_group: u32,
        expected_payload_len: u64,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<&'v [u8], ChunkError> {
        let Some(h) =
            self.header_matches(value, expected_key, expected_group, expected_payload_len)
        else {
            // Something is wrong before the checksum: `decode` names it (it never succeeds
            // here, the checks above being the conditions of its success).
            return self
                .decode(value, expected_key, expected_group, expected_payload_len)
                .and(Err(ChunkError::LengthMismatch {
                    expected: expected_payload_len,
                    found: value.len().saturating_sub(HEADER_LEN) as u64,
                }));
        };
        let (head, payload) = value.split_at(h.payload_offset());
        let mut sum = checksum_head(head);
        // The MAC's hasher starts empty: the header goes in with the first block.
        let mut mac = self.mac_key.as_ref().map(blake3::Hasher::new_keyed);
        // The first block is short by the header, and the MAC hashes the two as one
        // contiguous 16 KiB (a copy in cache): BLAKE3 then takes its input (header, then
        // payload) in whole aligned 16 KiB subtrees, 16 chunks wide. Given the 48-byte header
        // alone first, it would hash the first 16 KiB in ever smaller pieces, at less than
        // half the speed (most of a 16 KiB chunk's MAC).
        // Without a MAC the blocks are whole 16 KiB from the start: a 16 KiB chunk is one
        // block, one call of the sink (one write into KV memory), not a block and a 48-byte tail.
        let first = if mac.is_some() {
            COPY_BLOCK - HEADER_LEN
        } else {
            COPY_BLOCK
        };
        let (mut at, mut rest, mut take) = (0, payload, first);
        if mac.is_some() && rest.is_empty() {
            // No payload: the header is the MAC's whole input.
            if let Some(m) = &mut mac {
                m.update(&head[..HEADER_LEN]);
            }
        }
        while !rest.is_empty() {
            let (block, tail) = rest.split_at(take.min(rest.len()));
            sum.write(block);
            if let Some(m) = &mut mac {
                if at == 0 {
                    let mut joined = [0u8; COPY_BLOCK];
                    let n = HEADER_LEN + block.len();
                    joined[..HEADER_LEN].copy_from_slice(&head[..HEADER_LEN]);
                    joined[HEADER_LEN..n].copy_from_slice(block);
                    m.update(&joined[..n]);
                } else {
                    m.update(block);
                }
            }
            sink(at, block);
            (at, rest, take) = (at + block.len(), tail, COPY_BLOCK);
        }
        let stored = h.checksum;
        let computed = sum.finish();
        if computed != stored {
            return Err(ChunkError::ChecksumMismatch { stored, computed });
        }
        if let Some(m) = mac {
            let mut at_rest = [0u8; MAC_LEN];
            at_rest.copy_from_slice(&head[HEADER_LEN..HEADER_LEN + MAC_LEN]);
            // `blake3::Hash` compares in constant time.
            if m.finalize() != blake3::Hash::from_bytes(at_rest) {
                return Err(ChunkError::MacMismatch);
            }
        }
        Ok(payload)
    }

    /// The header of `value` when it is intact as far as can be told without the checksum
    /// and names what is expected: magic, version and flags; exactly the declared payload
    /// after the header; the expected key, group and payload length; a MAC when the codec
    /// has a key. `None` otherwise.
    fn header_matches(
        &self,
        value: &[u8],
        key: ChunkKey,
        group: u32,
        payload_len: u64,
    ) -> Option<ChunkHeader> {
        let h = ChunkHeader::parse(value).ok()?;
        let whole = h.payload_len.checked_add(h.payload_offset() as u64)? == value.len() as u64;
        let mac = h.has_mac() || self.mac_key.is_none();
        (whole && mac && h.key == key && h.group == group && h.payload_len == payload_len)
            .then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 37 + (i >> 9)) as u8).collect()
    }

    /// What `decode_to` gives and what its sink saw.
    fn run(
        codec: &ChunkCodec,
        v: &[u8],
        key: ChunkKey,
        group: u32,
        len: u64,
    ) -> (Result<Vec<u8>, ChunkError>, Vec<u8>) {
        let mut seen = Vec::new();
        let got = codec.decode_to(v, key, group, len, &mut |at, b| {
            assert_eq!(at, seen.len(), "blocks come in order");
            assert!(b.len() <= COPY_BLOCK);
            seen.extend_from_slice(b);
        });
        (got.map(<[u8]>::to_vec), seen)
    }

    #[test]
    fn checksum_is_xxh3_64_of_the_header_fields_and_payload() {
        let head = [0x3cu8; HEADER_LEN];
        for n in [0, 3, 200, 241, 1000, 4096, 2 * COPY_BLOCK + 5] {
            let p = payload(n);
            let whole = [&head[..40], &p[..]].concat();
            assert_eq!(
                super::super::checksum(&head, &p),
                xxhash_rust::xxh3::xxh3_64(&whole),
                "{n} bytes"
            );
        }
    }

    #[test]
    fn agrees_with_decode_on_every_damage() {
        let key = ChunkKey(0xfeed);
        for mac in [None, Some([5u8; 32])] {
            let codec = ChunkCodec::new(mac);
            for n in [0, 1, COPY_BLOCK - 1, COPY_BLOCK, 3 * COPY_BLOCK + 17] {
                let p = payload(n);
                let good = codec.encode(key, 2, 16, &p);
                let (got, seen) = run(&codec, &good, key, 2, n as u64);
                assert_eq!(got.as_deref(), Ok(&p[..]));
                assert_eq!(seen, p, "the sink saw the payload, whole");
                let mut cases: Vec<(Vec<u8>, ChunkKey, u32, u64)> = vec![
                    (good.clone(), ChunkKey(1), 2, n as u64),
                    (good.clone(), key, 3, n as u64),
                    (good.clone(), key, 2, n as u64 + 1),
                    (good[..good.len() - 1].to_vec(), key, 2, n as u64),
                    ([&good[..], b"x"].concat(), key, 2, n as u64),
                    (
                        ChunkCodec::new(None).encode(key, 2, 16, &p),
                        key,
                        2,
                        n as u64,
                    ),
                ];
                for at in [0, 5, 7, 9, 30, 35, 41, 50, good.len() - 1] {
                    let mut bad = good.clone();
                    bad[at.min(good.len() - 1)] ^= 0x10;
                    cases.push((bad, key, 2, n as u64));
                }
                for (v, k, g, len) in cases {
                    let want = codec.decode(&v, k, g, len).map(<[u8]>::to_vec);
                    let (got, seen) = run(&codec, &v, k, g, len);
                    assert_eq!(got, want, "mac {} len {n}", mac.is_some());
                    let header_error = !matches!(
                        want,
                        Ok(_) | Err(ChunkError::ChecksumMismatch { .. } | ChunkError::MacMismatch)
                    );
                    if header_error {
                        assert!(seen.is_empty(), "a header error reaches no sink: {want:?}");
                    }
                }
            }
        }
    }
}
