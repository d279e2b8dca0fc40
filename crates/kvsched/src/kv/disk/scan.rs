//! The walk of a disk tier's directory at open: which files are chunks, which are stale
//! temporary files (deleted), and what is left alone.

use std::fs;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use super::io_err;
use crate::kv::{ChunkKey, TierError};

/// What the walk found.
pub(super) struct Scan {
    /// Each chunk file in its own directory: (modification time, key, length), unordered.
    pub found: Vec<(SystemTime, ChunkKey, u64)>,
    /// Temporary files deleted.
    pub stale: u64,
    /// Chunk files longer than the largest value, left alone and not listed.
    pub oversized: u64,
}

/// Walks `ROOT/ab/`: deletes every `*.tmp` file, lists every `<key>.chunk` regular file
/// whose directory matches its key (only those can be found by `get`) and whose length is at
/// most `limit` (a longer one the tier never wrote: counted in `oversized`), skips anything
/// else (the `ROOT/ab/cd/` subdirectories of the earlier two-level layout among them).
pub(super) fn scan(root: &Path, limit: u64) -> Result<Scan, TierError> {
    let mut found = Vec::new();
    let mut stale = 0u64;
    let mut oversized = 0u64;
    for a in read_dir(root)? {
        let a = a.map_err(|e| io_err("read directory", root, e))?;
        let an = a.file_name();
        let Some(hi) = an.to_str().and_then(hex_pair) else {
            continue;
        };
        let dir = a.path();
        if !dir.is_dir() {
            continue;
        }
        for f in read_dir(&dir)? {
            let f = f.map_err(|e| io_err("read directory", &dir, e))?;
            let path = f.path();
            let name = f.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".tmp") {
                match fs::remove_file(&path) {
                    Ok(()) => stale += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("remove stale temporary", &path, e)),
                }
                continue;
            }
            // Only a chunk in its own directory can be found by `get`.
            let Some(key) = chunk_name_key(name) else {
                continue;
            };
            if (key.0 >> 120) as u8 != hi {
                continue;
            }
            let meta = f.metadata().map_err(|e| io_err("stat", &path, e))?;
            if !meta.is_file() {
                continue;
            }
            if meta.len() > limit {
                oversized += 1;
                continue;
            }
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((mtime, key, meta.len()));
        }
    }
    Ok(Scan {
        found,
        stale,
        oversized,
    })
}

/// `Some(byte)` if `s` is two lowercase hex digits.
fn hex_pair(s: &str) -> Option<u8> {
    if s.len() != 2 || !s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u8::from_str_radix(s, 16).ok()
}

/// The key of a file named `<32 lowercase hex digits>.chunk`.
fn chunk_name_key(name: &str) -> Option<ChunkKey> {
    let hex = name.strip_suffix(".chunk")?;
    if hex.len() != 32 || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(ChunkKey)
}

fn read_dir(path: &Path) -> Result<fs::ReadDir, TierError> {
    fs::read_dir(path).map_err(|e| io_err("read directory", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_parse_only_when_exact() {
        let k = ChunkKey(0xabcd_0000_0000_0000_0000_0000_0000_0001);
        assert_eq!(chunk_name_key(&format!("{k}.chunk")), Some(k));
        assert_eq!(chunk_name_key(&format!("{k}.chunkx")), None);
        assert_eq!(chunk_name_key(&format!("{k}0.chunk")), None);
        assert_eq!(
            chunk_name_key("ABCD0000000000000000000000000001.chunk"),
            None
        );
        assert_eq!(
            chunk_name_key("+bcd0000000000000000000000000001.chunk"),
            None
        );
        assert_eq!(hex_pair("ab"), Some(0xab));
        assert_eq!(hex_pair("a"), None);
        assert_eq!(hex_pair("+1"), None);
        assert_eq!(hex_pair("AB"), None);
    }
}
