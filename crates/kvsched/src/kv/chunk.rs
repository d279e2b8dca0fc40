//! The chunk format: what a tier's value holds — a fixed little-endian header naming the block
//! (key, group, token count, payload length), an xxh3-64 checksum, an optional keyed BLAKE3
//! MAC, then the payload. Specified byte by byte in the repository's `docs/kv-format.md`.
//!
//! The codec is tier-independent: every tier stores the encoded bytes as they are, and the
//! reader decodes with what it expects (key, group, payload length), so a torn, truncated,
//! flipped, misplaced or forged value is refused before its payload is used.

use std::hash::Hasher as _;

use super::ChunkKey;

mod copy;

/// The first four bytes of every chunk.
pub const CHUNK_MAGIC: [u8; 4] = *b"KVCH";
/// The format version this codec writes and reads.
pub const CHUNK_VERSION: u16 = 1;
/// Flag bit: a 32-byte keyed MAC follows the fixed header.
pub const FLAG_MAC: u16 = 0x0001;
/// Length of the fixed header (without MAC), in bytes.
pub const HEADER_LEN: usize = 48;
/// Length of the MAC, in bytes.
pub const MAC_LEN: usize = 32;

// Field offsets (docs/kv-format.md, "Layout").
const OFF_VERSION: usize = 4;
const OFF_FLAGS: usize = 6;
const OFF_KEY: usize = 8;
const OFF_GROUP: usize = 24;
const OFF_TOKENS: usize = 28;
const OFF_LEN: usize = 32;
const OFF_CHECKSUM: usize = 40;
const KNOWN_FLAGS: u16 = FLAG_MAC;

/// Why a value is not the chunk the reader expected. Every variant names the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// The value is shorter than its header, or than the header plus the payload length it
    /// declares (a torn or cut value).
    #[error("chunk truncated: {have} bytes, the header needs {need}")]
    Truncated {
        /// Bytes present.
        have: u64,
        /// Bytes the header (and its payload length) call for.
        need: u64,
    },
    /// The first four bytes are not [`CHUNK_MAGIC`].
    #[error("chunk magic: expected \"KVCH\", found {0:02x?}")]
    BadMagic([u8; 4]),
    /// The format version is not one this codec reads.
    #[error("chunk version: {0} is not supported (this codec reads version 1)")]
    UnsupportedVersion(u16),
    /// Flag bits this codec does not know are set.
    #[error("chunk flags: unknown bits {0:#06x} set")]
    UnsupportedFlags(u16),
    /// The stored key is not the one asked for.
    #[error("chunk key: expected {expected}, found {found}")]
    KeyMismatch {
        /// The key the reader asked for.
        expected: ChunkKey,
        /// The key in the header.
        found: ChunkKey,
    },
    /// The stored cache group is not the one asked for.
    #[error("chunk group: expected {expected}, found {found}")]
    GroupMismatch {
        /// The group the reader asked for.
        expected: u32,
        /// The group in the header.
        found: u32,
    },
    /// The payload length is not the one the reader expects, or the value holds bytes past
    /// the payload.
    #[error("chunk payload length: expected {expected}, found {found}")]
    LengthMismatch {
        /// The length the reader expected (or the header declares, for trailing bytes).
        expected: u64,
        /// The length found.
        found: u64,
    },
    /// The xxh3-64 checksum over the header fields and payload does not match.
    #[error("chunk checksum: stored {stored:#018x}, computed {computed:#018x}")]
    ChecksumMismatch {
        /// The checksum in the header.
        stored: u64,
        /// The checksum of the bytes read.
        computed: u64,
    },
    /// The codec has a MAC key and the value carries no MAC.
    #[error("chunk mac: missing (a MAC key is configured)")]
    MacMissing,
    /// The value's MAC is not the keyed hash of its header and payload under the codec's key.
    #[error("chunk mac: does not match")]
    MacMismatch,
}

/// The counter a [`ChunkError`] is reported under (the stress tool's integrity counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkErrorClass {
    /// `checksum_failures`: the bytes changed after they were written.
    Checksum,
    /// `key_mismatches`: an intact chunk of another key or group.
    KeyMismatch,
    /// `mac_failures`: a MAC missing or wrong.
    Mac,
    /// `format_errors`: truncation, bad magic, version, flags or length.
    Format,
}

impl ChunkErrorClass {
    /// The counter's name: `checksum_failures`, `key_mismatches`, `mac_failures` or
    /// `format_errors`.
    pub fn counter_name(self) -> &'static str {
        match self {
            ChunkErrorClass::Checksum => "checksum_failures",
            ChunkErrorClass::KeyMismatch => "key_mismatches",
            ChunkErrorClass::Mac => "mac_failures",
            ChunkErrorClass::Format => "format_errors",
        }
    }
}

impl ChunkError {
    /// Which integrity counter this error counts under. [`GroupMismatch`](Self::GroupMismatch)
    /// counts as a key mismatch (an intact chunk naming another block).
    pub fn class(&self) -> ChunkErrorClass {
        match self {
            ChunkError::ChecksumMismatch { .. } => ChunkErrorClass::Checksum,
            ChunkError::KeyMismatch { .. } | ChunkError::GroupMismatch { .. } => {
                ChunkErrorClass::KeyMismatch
            }
            ChunkError::MacMissing | ChunkError::MacMismatch => ChunkErrorClass::Mac,
            ChunkError::Truncated { .. }
            | ChunkError::BadMagic(_)
            | ChunkError::UnsupportedVersion(_)
            | ChunkError::UnsupportedFlags(_)
            | ChunkError::LengthMismatch { .. } => ChunkErrorClass::Format,
        }
    }
}

/// The fixed header fields of a chunk, as stored (parsed without any integrity check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Format version.
    pub version: u16,
    /// Flag bits ([`FLAG_MAC`]).
    pub flags: u16,
    /// The block's key.
    pub key: ChunkKey,
    /// The block's cache group.
    pub group: u32,
    /// Tokens in the block.
    pub tokens: u32,
    /// Payload length in bytes.
    pub payload_len: u64,
    /// The stored xxh3-64 checksum.
    pub checksum: u64,
}

impl ChunkHeader {
    /// Parses the fixed header of `value`: checks the length, magic, version and flags only,
    /// never the checksum or MAC. For inspection tools; readers use [`ChunkCodec::decode`].
    pub fn parse(value: &[u8]) -> Result<ChunkHeader, ChunkError> {
        let Some(h) = value.first_chunk::<HEADER_LEN>() else {
            return Err(ChunkError::Truncated {
                have: value.len() as u64,
                need: HEADER_LEN as u64,
            });
        };
        let magic = [h[0], h[1], h[2], h[3]];
        if magic != CHUNK_MAGIC {
            return Err(ChunkError::BadMagic(magic));
        }
        let version = u16_at(h, OFF_VERSION);
        if version != CHUNK_VERSION {
            return Err(ChunkError::UnsupportedVersion(version));
        }
        let flags = u16_at(h, OFF_FLAGS);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(ChunkError::UnsupportedFlags(flags & !KNOWN_FLAGS));
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&h[OFF_KEY..OFF_KEY + 16]);
        Ok(ChunkHeader {
            version,
            flags,
            key: ChunkKey::from_bytes(key),
            group: u32_at(h, OFF_GROUP),
            tokens: u32_at(h, OFF_TOKENS),
            payload_len: u64_at(h, OFF_LEN),
            checksum: u64_at(h, OFF_CHECKSUM),
        })
    }

    /// Whether the chunk carries a MAC.
    pub fn has_mac(&self) -> bool {
        self.flags & FLAG_MAC != 0
    }

    /// Bytes before the payload: the fixed header, plus the MAC if present.
    pub fn payload_offset(&self) -> usize {
        if self.has_mac() {
            HEADER_LEN + MAC_LEN
        } else {
            HEADER_LEN
        }
    }
}

fn u16_at(h: &[u8; HEADER_LEN], at: usize) -> u16 {
    u16::from_le_bytes([h[at], h[at + 1]])
}

fn u32_at(h: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

fn u64_at(h: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

/// xxh3-64 over the header's first 40 bytes (everything before the checksum) and the payload.
fn checksum(head: &[u8], payload: &[u8]) -> u64 {
    let mut h = checksum_head(head);
    h.write(payload);
    h.finish()
}

/// The checksum's state: xxh3-64 with the default seed and secret, the secret borrowed from
/// the crate's static copy. (`XxHash3_64::new()` computes the same hash but allocates a copy
/// of the secret on the heap: an allocation and a free per chunk on the load path.)
type Checksum =
    twox_hash::xxhash3_64::RawHasher<&'static [u8; twox_hash::xxhash3_64::DEFAULT_SECRET_LENGTH]>;

/// The checksum's state after the header's first 40 bytes; the payload comes next (`write`,
/// then `finish`). Allocates nothing.
fn checksum_head(head: &[u8]) -> Checksum {
    let mut h = Checksum::new(twox_hash::xxhash3_64::SecretBuffer::default());
    h.write(&head[..OFF_CHECKSUM]);
    h
}

/// Keyed BLAKE3 over the 48-byte header (checksum included) and the payload.
fn mac(key: &[u8; 32], head: &[u8], payload: &[u8]) -> blake3::Hash {
    let mut h = mac_hasher(key, head);
    h.update(payload);
    h.finalize()
}

/// The MAC's state after the 48-byte header; the payload comes next.
fn mac_hasher(key: &[u8; 32], head: &[u8]) -> blake3::Hasher {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&head[..HEADER_LEN]);
    h
}

/// Encodes and decodes chunks. With a MAC key (shared by every engine that reads and writes
/// the store) it writes a MAC on every chunk and refuses chunks without one or with a wrong
/// one; without a key it writes none and checks chunks by checksum alone, MAC or not.
///
/// The checksum catches accidental damage (a torn write, a flipped bit, a cut file); only the
/// MAC stops a writer without the key from planting a chunk that decodes.
#[derive(Clone, Default)]
pub struct ChunkCodec {
    mac_key: Option<[u8; 32]>,
}

impl std::fmt::Debug for ChunkCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("ChunkCodec")
            .field("mac", &self.mac_key.is_some())
            .finish()
    }
}

impl ChunkCodec {
    /// A codec that writes MACs under `mac_key` and requires them (`None`: checksum only).
    pub fn new(mac_key: Option<[u8; 32]>) -> Self {
        ChunkCodec { mac_key }
    }

    /// Whether a MAC key is configured.
    pub fn has_mac_key(&self) -> bool {
        self.mac_key.is_some()
    }

    /// The encoded length of a chunk with a payload of `payload_len` bytes.
    pub fn encoded_len(&self, payload_len: usize) -> usize {
        let mac = if self.mac_key.is_some() { MAC_LEN } else { 0 };
        HEADER_LEN + mac + payload_len
    }

    /// Bytes before the payload in the chunks this codec writes: [`HEADER_LEN`], plus
    /// [`MAC_LEN`] with a MAC key.
    pub fn payload_offset(&self) -> usize {
        self.encoded_len(0)
    }

    /// Makes `chunk` the chunk of the payload it holds, in place: `chunk` is
    /// [`payload_offset`](Self::payload_offset) bytes of room followed by the payload (a save
    /// copies a block's bytes from KV memory straight to that offset of a reused buffer), and
    /// the header and MAC are written into the room. The result is byte for byte what
    /// [`encode`](Self::encode) makes of the payload.
    ///
    /// # Errors
    ///
    /// [`ChunkError::Truncated`] when `chunk` is shorter than the room; nothing is written.
    pub fn seal(
        &self,
        chunk: &mut [u8],
        key: ChunkKey,
        group: u32,
        tokens: u32,
    ) -> Result<(), ChunkError> {
        let off = self.payload_offset();
        if chunk.len() < off {
            return Err(ChunkError::Truncated {
                have: chunk.len() as u64,
                need: off as u64,
            });
        }
        let (room, payload) = chunk.split_at_mut(off);
        let head = self.header(key, group, tokens, payload);
        room[..HEADER_LEN].copy_from_slice(&head);
        if let Some(k) = &self.mac_key {
            room[HEADER_LEN..].copy_from_slice(mac(k, &head, payload).as_bytes());
        }
        Ok(())
    }

    /// The 48-byte header of `payload`, checksum included.
    fn header(&self, key: ChunkKey, group: u32, tokens: u32, payload: &[u8]) -> [u8; HEADER_LEN] {
        let flags = if self.mac_key.is_some() { FLAG_MAC } else { 0 };
        let mut head = [0u8; HEADER_LEN];
        head[..4].copy_from_slice(&CHUNK_MAGIC);
        head[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&CHUNK_VERSION.to_le_bytes());
        head[OFF_FLAGS..OFF_FLAGS + 2].copy_from_slice(&flags.to_le_bytes());
        head[OFF_KEY..OFF_KEY + 16].copy_from_slice(&key.to_bytes());
        head[OFF_GROUP..OFF_GROUP + 4].copy_from_slice(&group.to_le_bytes());
        head[OFF_TOKENS..OFF_TOKENS + 4].copy_from_slice(&tokens.to_le_bytes());
        head[OFF_LEN..OFF_LEN + 8].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let sum = checksum(&head, payload);
        head[OFF_CHECKSUM..OFF_CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
        head
    }

    /// The chunk of `payload`: block `key` of cache group `group`, holding `tokens` tokens.
    pub fn encode(&self, key: ChunkKey, group: u32, tokens: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len(payload.len()));
        self.encode_into(&mut out, key, group, tokens, payload);
        out
    }

    /// Appends the chunk of `payload` to `out` (see [`encode`](Self::encode)).
    pub fn encode_into(
        &self,
        out: &mut Vec<u8>,
        key: ChunkKey,
        group: u32,
        tokens: u32,
        payload: &[u8],
    ) {
        let head = self.header(key, group, tokens, payload);
        out.reserve(self.encoded_len(payload.len()));
        out.extend_from_slice(&head);
        if let Some(k) = &self.mac_key {
            out.extend_from_slice(mac(k, &head, payload).as_bytes());
        }
        out.extend_from_slice(payload);
    }

    /// The payload of `value` if it is an intact chunk of block `expected_key`, cache group
    /// `expected_group`, with a payload of `expected_payload_len` bytes.
    ///
    /// Checks, in this order: length and magic, version, flags (format errors); the declared
    /// payload length against the bytes present ([`ChunkError::Truncated`]); the checksum, so
    /// damage anywhere past the flags counts as a checksum failure; the MAC (when the codec has
    /// a key); then the key, group and payload length against the expected ones. Never panics
    /// and never allocates: the payload is a slice of `value`.
    pub fn decode<'v>(
        &self,
        value: &'v [u8],
        expected_key: ChunkKey,
        expected_group: u32,
        expected_payload_len: u64,
    ) -> Result<&'v [u8], ChunkError> {
        let h = ChunkHeader::parse(value)?;
        let off = h.payload_offset();
        let have = value.len() as u64;
        // `off` ≤ 80, so the sum overflows only for declared lengths no value can have.
        let need = h.payload_len.saturating_add(off as u64);
        if have < need {
            return Err(ChunkError::Truncated { have, need });
        }
        let (head, rest) = value.split_at(off);
        // The checksum covers every byte present, so bytes past the declared payload (or a
        // shrunk length field) fail it as well.
        let computed = checksum(head, rest);
        if computed != h.checksum {
            return Err(ChunkError::ChecksumMismatch {
                stored: h.checksum,
                computed,
            });
        }
        if have != need {
            return Err(ChunkError::LengthMismatch {
                expected: h.payload_len,
                found: rest.len() as u64,
            });
        }
        if let Some(k) = &self.mac_key {
            if !h.has_mac() {
                return Err(ChunkError::MacMissing);
            }
            let mut stored = [0u8; MAC_LEN];
            stored.copy_from_slice(&head[HEADER_LEN..HEADER_LEN + MAC_LEN]);
            // `blake3::Hash` compares in constant time.
            if mac(k, head, rest) != blake3::Hash::from_bytes(stored) {
                return Err(ChunkError::MacMismatch);
            }
        }
        if h.key != expected_key {
            return Err(ChunkError::KeyMismatch {
                expected: expected_key,
                found: h.key,
            });
        }
        if h.group != expected_group {
            return Err(ChunkError::GroupMismatch {
                expected: expected_group,
                found: h.group,
            });
        }
        if h.payload_len != expected_payload_len {
            return Err(ChunkError::LengthMismatch {
                expected: expected_payload_len,
                found: h.payload_len,
            });
        }
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_sit_at_their_documented_offsets() {
        let codec = ChunkCodec::new(None);
        let key = ChunkKey(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let v = codec.encode(key, 0xAABB_CCDD, 0x1122_3344, &[9, 8, 7]);
        assert_eq!(&v[0..4], b"KVCH");
        assert_eq!(&v[4..6], &1u16.to_le_bytes());
        assert_eq!(&v[6..8], &0u16.to_le_bytes());
        assert_eq!(&v[8..24], &key.0.to_le_bytes());
        assert_eq!(&v[24..28], &0xAABB_CCDDu32.to_le_bytes());
        assert_eq!(&v[28..32], &0x1122_3344u32.to_le_bytes());
        assert_eq!(&v[32..40], &3u64.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&[&v[..40], &v[48..]].concat());
        assert_eq!(&v[40..48], &sum.to_le_bytes());
        assert_eq!(&v[48..], &[9, 8, 7]);
        let h = ChunkHeader::parse(&v).unwrap();
        assert_eq!(
            (h.key, h.group, h.tokens, h.payload_len),
            (key, 0xAABB_CCDD, 0x1122_3344, 3)
        );
    }

    #[test]
    fn mac_covers_the_header_and_payload_under_the_key() {
        let k = [7u8; 32];
        let codec = ChunkCodec::new(Some(k));
        let v = codec.encode(ChunkKey(5), 1, 16, b"payload");
        assert_eq!(&v[6..8], &FLAG_MAC.to_le_bytes());
        let want = blake3::keyed_hash(&k, &[&v[..48], &v[80..]].concat());
        assert_eq!(&v[48..80], want.as_bytes());
        assert_eq!(codec.decode(&v, ChunkKey(5), 1, 7), Ok(&b"payload"[..]));
        assert_eq!(v.len(), codec.encoded_len(7));
    }

    #[test]
    fn seal_in_place_is_encode() {
        for codec in [ChunkCodec::new(None), ChunkCodec::new(Some([9; 32]))] {
            let payload: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
            let off = codec.payload_offset();
            let mut buf = vec![0xEE; off + payload.len()];
            buf[off..].copy_from_slice(&payload);
            assert_eq!(codec.seal(&mut buf, ChunkKey(77), 2, 16), Ok(()));
            assert_eq!(buf, codec.encode(ChunkKey(77), 2, 16, &payload));
            let mut short = vec![0; off - 1];
            assert!(matches!(
                codec.seal(&mut short, ChunkKey(77), 2, 16),
                Err(ChunkError::Truncated { .. })
            ));
            // Exactly the room: an empty payload seals.
            let mut room = vec![0; off];
            assert_eq!(codec.seal(&mut room, ChunkKey(1), 0, 0), Ok(()));
            assert_eq!(room, codec.encode(ChunkKey(1), 0, 0, &[]));
        }
    }

    #[test]
    fn every_error_has_a_class() {
        assert_eq!(
            ChunkError::MacMissing.class().counter_name(),
            "mac_failures"
        );
        let e = ChunkError::ChecksumMismatch {
            stored: 1,
            computed: 2,
        };
        assert_eq!(e.class().counter_name(), "checksum_failures");
        let e = ChunkError::GroupMismatch {
            expected: 1,
            found: 2,
        };
        assert_eq!(e.class().counter_name(), "key_mismatches");
        assert_eq!(
            ChunkError::BadMagic(*b"XXXX").class().counter_name(),
            "format_errors"
        );
        assert!(!format!("{:?}", ChunkCodec::new(Some([3; 32]))).contains('3'));
    }
}
