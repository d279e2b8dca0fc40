//! The disk tier's pack file: the chunks of one `put` in one file, behind a table of
//! (key, offset, length) sealed by a checksum. The table is what the scan at open reads (the
//! values are the chunk codec's to check); see the repository's `docs/kv-format.md`, "Disk
//! tier".

use std::hash::Hasher;

use crate::kv::ChunkKey;

/// The bytes `K` `V` `P` `K`.
pub(super) const MAGIC: [u8; 4] = *b"KVPK";
/// The pack layout's version.
pub(super) const VERSION: u16 = 1;
/// Magic, version, reserved, entry count, reserved.
pub(super) const HEAD_LEN: u64 = 16;
/// Key (16), offset (8), length (8).
pub(super) const ENTRY_LEN: u64 = 32;
/// The xxh3-64 of the head and the entries.
pub(super) const SUM_LEN: u64 = 8;
/// Most chunks one pack holds (a larger batch takes several packs).
pub(super) const MAX_ENTRIES: usize = 1024;
/// The offset of an entry whose chunk was removed (a tombstone: not indexed at open).
pub(super) const REMOVED: u64 = u64::MAX;

/// The bytes before the first value of a pack of `n` chunks.
pub(super) const fn table_len(n: usize) -> u64 {
    HEAD_LEN + ENTRY_LEN * n as u64 + SUM_LEN
}

/// One entry of a pack's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub key: ChunkKey,
    /// From the start of the file; [`REMOVED`] for a tombstone.
    pub off: u64,
    pub len: u64,
}

/// The entries of a pack holding `values` one after the other, right after the table.
pub(super) fn layout(values: &[(ChunkKey, &[u8])]) -> Vec<Entry> {
    let mut off = table_len(values.len());
    values
        .iter()
        .map(|(key, v)| {
            // (Planted bug `pack-offset-past-table`, scripts/plants.sh: each value's offset
            // is recorded one checksum's width late, so a read returns the wrong bytes.)
            let at = if planted!("pack-offset-past-table") {
                off + SUM_LEN
            } else {
                off
            };
            off += v.len() as u64;
            Entry {
                key: *key,
                off: at,
                len: v.len() as u64,
            }
        })
        .collect()
}

/// The bytes of a table of `entries`: head, entries, checksum.
pub(super) fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut t = Vec::with_capacity(table_len(entries.len()) as usize);
    t.extend_from_slice(&MAGIC);
    t.extend_from_slice(&VERSION.to_le_bytes());
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    t.extend_from_slice(&0u32.to_le_bytes());
    for e in entries {
        t.extend_from_slice(&e.key.0.to_le_bytes());
        t.extend_from_slice(&e.off.to_le_bytes());
        t.extend_from_slice(&e.len.to_le_bytes());
    }
    let sum = checksum(&t);
    t.extend_from_slice(&sum.to_le_bytes());
    t
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut h = twox_hash::XxHash3_64::new();
    h.write(bytes);
    h.finish()
}

/// Why a file is not a pack the tier wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bad {
    /// Fewer bytes than the head says the table takes.
    Short,
    /// Not the magic, version or reserved fields a pack has, or more than
    /// [`MAX_ENTRIES`] entries.
    Head,
    /// The table's checksum does not match.
    Checksum,
    /// An entry's value lies outside the file or is longer than the largest value.
    Entry,
}

/// The entry count a pack's first [`HEAD_LEN`] bytes give.
pub(super) fn count(head: &[u8]) -> Result<usize, Bad> {
    if head.len() < HEAD_LEN as usize {
        return Err(Bad::Short);
    }
    let u16_at = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if head[..4] != MAGIC || u16_at(4) != VERSION || u16_at(6) != 0 || u32_at(12) != 0 {
        return Err(Bad::Head);
    }
    let n = u32_at(8) as usize;
    if n > MAX_ENTRIES {
        return Err(Bad::Head);
    }
    Ok(n)
}

/// The entries of the table `t` (at least [`table_len`] of its count bytes) of a file of
/// `file_len` bytes, each live value inside the file past the table and at most `limit`
/// bytes long; tombstones included.
pub(super) fn parse(t: &[u8], file_len: u64, limit: u64) -> Result<Vec<Entry>, Bad> {
    let n = count(t)?;
    let end = table_len(n) as usize;
    if t.len() < end || file_len < end as u64 {
        return Err(Bad::Short);
    }
    let body = end - SUM_LEN as usize;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&t[body..end]);
    if checksum(&t[..body]) != u64::from_le_bytes(sum) {
        return Err(Bad::Checksum);
    }
    let mut out = Vec::with_capacity(n);
    for e in t[HEAD_LEN as usize..body].chunks_exact(ENTRY_LEN as usize) {
        let mut k = [0u8; 16];
        k.copy_from_slice(&e[..16]);
        let mut o = [0u8; 8];
        o.copy_from_slice(&e[16..24]);
        let mut l = [0u8; 8];
        l.copy_from_slice(&e[24..32]);
        let entry = Entry {
            key: ChunkKey(u128::from_le_bytes(k)),
            off: u64::from_le_bytes(o),
            len: u64::from_le_bytes(l),
        };
        if entry.off != REMOVED {
            let inside = entry.off >= end as u64
                && entry.len <= limit
                && entry
                    .off
                    .checked_add(entry.len)
                    .is_some_and(|e| e <= file_len);
            if !inside {
                return Err(Bad::Entry);
            }
        }
        out.push(entry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_and_damage_is_refused() {
        let (a, b) = (vec![1u8; 10], vec![2u8; 5]);
        let t = encode(&layout(&[(ChunkKey(7), &a[..]), (ChunkKey(9), &b[..])]));
        assert_eq!(t.len() as u64, table_len(2));
        let file_len = table_len(2) + 15;
        let e = parse(&t, file_len, 100).unwrap_or_else(|e| panic!("{e:?}"));
        let first = table_len(2);
        assert_eq!(
            e,
            vec![
                Entry {
                    key: ChunkKey(7),
                    off: first,
                    len: 10
                },
                Entry {
                    key: ChunkKey(9),
                    off: first + 10,
                    len: 5
                }
            ]
        );
        assert_eq!(parse(&t, file_len - 1, 100), Err(Bad::Entry), "cut");
        assert_eq!(parse(&t, file_len, 9), Err(Bad::Entry), "over the limit");
        assert_eq!(parse(&t[..t.len() - 1], file_len, 100), Err(Bad::Short));
        let mut more = t.clone();
        more[8] ^= 1; // three entries: a longer table than there is
        assert_eq!(parse(&more, file_len, 100), Err(Bad::Short));
        for at in [0, 4, 6, 12] {
            let mut d = t.clone();
            d[at] ^= 1;
            assert_eq!(parse(&d, file_len, 100), Err(Bad::Head), "byte {at}");
        }
        for at in [16, 40, 60, t.len() - 1] {
            let mut d = t.clone();
            d[at] ^= 1;
            assert_eq!(parse(&d, file_len, 100), Err(Bad::Checksum), "byte {at}");
        }
        let mut many = t.clone();
        many[8..12].copy_from_slice(&(MAX_ENTRIES as u32 + 1).to_le_bytes());
        assert_eq!(count(&many), Err(Bad::Head));
    }

    #[test]
    fn a_tombstone_is_kept_and_not_bounds_checked() {
        let t = encode(&[Entry {
            key: ChunkKey(3),
            off: REMOVED,
            len: 4,
        }]);
        let e = parse(&t, table_len(1), 100).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(e[0].off, REMOVED);
    }
}
