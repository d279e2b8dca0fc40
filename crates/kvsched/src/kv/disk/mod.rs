//! [`DiskTier`]: the chunks of each put packed into one file in a directory (`pack`),
//! bounded in bytes by evicting whole packs, crash-safe for a killed process (write to a temporary
//! file, then a hard link into place), its index rebuilt by a scan of the packs' tables at open (`scan`).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::{ChunkKey, TierError};
use crate::sync::{AtomicU64, Mutex, Ordering};

mod config;
mod edit;
mod index;
mod pack;
mod read;
mod scan;
mod tier_impl;
mod write;

pub use config::DiskConfig;
use index::{file_id, same_file, Index};

const PACK_EXT: &str = "pack";
const TEMP_EXT: &str = "tmp";
/// The value bytes a pack holds at most (unless one value is larger): what a put's batch
/// is split at, and what eviction frees at a time.
const PACK_BYTES: u64 = 4 << 20;

/// What a [`DiskTier`] has done since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskCounts {
    /// Keys `get` found.
    pub hits: u64,
    /// Keys `get` did not find.
    pub misses: u64,
    /// Chunks deleted to make room, with the pack that held them (at open too, if the
    /// directory was over capacity).
    pub evictions: u64,
    /// Bytes of pack files held now (tables included, and the bytes of values a later put
    /// replaced while their pack still holds others).
    pub bytes: u64,
    /// Chunks held now.
    pub entries: u64,
    /// Temporary files of an earlier process removed at open.
    pub stale_temps_removed: u64,
    /// Files at a pack's path that the tier could never have written (longer than the
    /// largest pack): left alone at open, not indexed nor counted against the capacity.
    pub oversized_ignored: u64,
    /// Reads refused because the chunk's pack path held no regular file of at most the
    /// largest pack (a symbolic link, a FIFO, a device, an oversized file): each read as
    /// absent.
    pub refused_reads: u64,
    /// Pack writes that found the file system full (`ENOSPC`, `EDQUOT`) before the tier's
    /// capacity. Each lowers the capacity in force to the bytes held then, for 60 s (the
    /// space may be another writer's, and come back), and evicts the oldest packs to make
    /// room, then writes once more.
    pub full_writes: u64,
    /// Puts of a pack that failed (nothing stored for its chunks): the write after a full
    /// file system's eviction failed too, or another I/O error (a read-only file system, …).
    pub write_errors: u64,
    /// The capacity in force: [`DiskConfig::capacity_bytes`], or less once the file system
    /// was found full (see `full_writes`).
    pub capacity_bytes: u64,
    /// Files named like a pack whose table is not one the tier wrote (cut, damaged, entries
    /// outside the file or longer than the largest value), or that could not be opened or
    /// read (an I/O error of the file), found at open: left alone, not indexed nor counted.
    pub refused_packs: u64,
}

/// The chunks of each put packed into files under a root directory:
/// `ROOT/<16 hex digits>.pack`, numbered in the order they were written. A pack holds a
/// table — each chunk's key, offset and length, sealed by an xxh3-64 — and then the values
/// one after the other (at most 1,024 chunks and 4 MiB of values, or one larger value, per
/// pack; a larger put takes several). A save of 32 chunks of 2 KiB is one file created and
/// linked instead of 32: the file system's metadata work, which bounded how fast one file
/// per chunk could save, is paid once a batch.
///
/// **Crash safety.** A pack is written as `<n>.<r>.<pid>.tmp` (`r` 64 bits no other user of
/// the directory can foresee, so none can take the name first), then hard-linked as `<m>.pack`
/// (never replacing a pack already there: a number taken is skipped, and after a few taken
/// in a row the tier lists the directory and goes on from the first number free there) and
/// the temporary name
/// removed: a reader sees the whole pack or none of it. A process killed mid-put leaves at most a temporary
/// file, which the next [`open`] deletes; [`open`] leaves alone the temporary files of
/// processes still running (on Unix), puts in flight of other tiers on the directory. Torn or cut packs (a power loss without
/// [`DiskConfig::fsync`], damage at rest) are refused at open when their table is; a value
/// damaged or cut inside an intact table is returned as it is, and the chunk codec's length
/// and checksum checks refuse it at load.
///
/// **Index and eviction.** [`open`] reads every pack's table and rebuilds the index (key →
/// pack, offset, length) and the byte count, so a fresh process finds what the last one
/// saved; a key in several packs is the newest pack's. Eviction deletes whole packs, least
/// recently used first within a process (a put and a `get` hit are uses of the pack) and
/// oldest modification time first for what was found at open; a pack whose every chunk was
/// saved again later is deleted at once. Renames, index updates and eviction deletes happen
/// under one lock, so the index and the files agree; pack contents are written and read
/// outside it.
///
/// **Threads and sharing.** All I/O runs on the calling thread. Several `DiskTier`s may
/// share a directory (engines sharing a store): none replaces another's pack, and
/// [`rescan`](DiskTier::rescan) indexes what the others wrote since. A tier may reuse the
/// number of a pack another deleted; each keeps the file (device, inode, birth time) each of
/// its numbers named, so none reads another's pack at its own offsets or deletes it as its
/// own (where the file system keeps no birth time, an inode reused at once goes unseen). Each counts capacity on
/// its own, and an [`open`] deletes every temporary file, another tier's in-flight one too.
///
/// Files of the earlier one-file-per-chunk layout (`ROOT/ab/<key>.chunk`) are not read nor
/// counted, and left alone.
///
/// [`open`]: DiskTier::open
pub struct DiskTier {
    root: PathBuf,
    cfg: DiskConfig,
    index: Mutex<Index>,
    /// The number of the next pack.
    next_pack: AtomicU64,
    /// The number of the next temporary file (its name's first part).
    next_temp: AtomicU64,
    /// The largest value the tier's callers said they store ([`Tier::expect_values_up_to`]:
    /// the largest of their words), 0 before any said: a read of a longer value is refused.
    ///
    /// [`Tier::expect_values_up_to`]: crate::kv::Tier::expect_values_up_to
    expected_max: AtomicU64,
    pid: u32,
    /// Keys the middle part of a temporary file's name (`<n>.<this>.<pid>.tmp`): names another
    /// user of the directory cannot foresee, so cannot take first.
    temp_names: std::collections::hash_map::RandomState,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    refused_reads: AtomicU64,
    full_writes: AtomicU64,
    write_errors: AtomicU64,
    stale_temps_removed: u64,
    oversized_ignored: u64,
    refused_packs: u64,
    /// Tests: a file system that holds this many bytes of pack files (writes past it fail
    /// with `ENOSPC`), or that is read-only (`u64::MAX - 1`: every write fails with `EROFS`).
    #[cfg(test)]
    test_fs: AtomicU64,
    /// Tests: what runs at each [`Pause`] (taken out while it runs, so the tier's calls it
    /// makes do not run it again).
    #[cfg(test)]
    pause: Mutex<Option<PauseHook>>,
}

/// Tests: a hook run at a [`Pause`].
#[cfg(test)]
type PauseHook = Box<dyn FnMut(&DiskTier, Pause) + Send>;

/// Tests: the points where a test runs its hook (`DiskTier::pause`), to put another call of
/// the tier's in between two steps of one.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    /// A rescan copied the numbers it skips and has not yet walked the directory.
    RescanCopiedSeen,
    /// A rescan walked the directory and has not yet taken the lock to index what it found.
    RescanWalked,
    /// A read took its key's place from the index and has not yet opened the pack.
    ReadPlaced,
}

/// Whether `e` says the file system (or the user's quota) is full.
fn is_full(e: &io::Error) -> bool {
    #[cfg(unix)]
    if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
        return true;
    }
    e.kind() == io::ErrorKind::StorageFull
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("root", &self.root)
            .field("cfg", &self.cfg)
            .field("stats", &self.counts())
            .finish()
    }
}

fn io_err(what: &str, path: &Path, e: io::Error) -> TierError {
    TierError::Unavailable(format!("disk tier: {what} {}: {e}", path.display()))
}

fn sync_dir(path: &Path) -> Result<(), TierError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("sync directory", path, e))
}

/// What [`DiskTier::open`] found, for the counts.
#[derive(Clone, Copy, Default)]
struct Found {
    stale: u64,
    oversized: u64,
    refused: u64,
}

impl DiskTier {
    /// Opens (creating it if needed) the tier in `root`: deletes stale temporary files,
    /// indexes every pack, and evicts the oldest if they exceed the capacity. Entries that
    /// are not the tier's are left alone and not counted.
    pub fn open(root: impl Into<PathBuf>, cfg: DiskConfig) -> Result<DiskTier, TierError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| io_err("create directory", &root, e))?;
        let probe = DiskTier::unscanned(root, cfg, Found::default());
        let scan::Scan {
            mut found,
            stale,
            oversized,
            refused,
            ignored,
            ..
        } = scan::scan(&probe.root, probe.pack_limit(), probe.limit(), None)?;
        // The higher number is the later put: it wins a key both hold. Eviction goes by
        // modification time, oldest first.
        found.sort_unstable_by_key(|p| p.id);
        let next = found.last().map_or(0, |p| p.id.saturating_add(1));
        let mut by_age: Vec<_> = found.iter().map(|p| (p.mtime, p.id)).collect();
        let mut index = Index::default();
        index.seen.extend(ignored);
        let mut superseded = Vec::new();
        for p in found {
            index.files.insert(p.id, p.file);
            let live = p.entries.iter().filter(|e| e.off != pack::REMOVED);
            let entries = live.map(|e| (e.key, e.off, e.len));
            superseded.extend(index.insert_pack(p.id, p.len, entries));
        }
        by_age.sort_unstable();
        for (_, id) in by_age {
            index.use_pack(id);
        }
        if stale > 0 && cfg.fsync {
            sync_dir(&probe.root)?;
        }
        let tier = DiskTier::unscanned(
            probe.root,
            cfg,
            Found {
                stale,
                oversized,
                refused,
            },
        );
        tier.next_pack.store(next, Ordering::Relaxed);
        for id in superseded {
            tier.delete_pack(&mut index, id);
        }
        tier.evict_to_fit(&mut index, None, 0);
        *tier.index.lock() = index;
        Ok(tier)
    }

    /// Indexes the packs written to the directory since open by another `DiskTier` on it
    /// (another engine's, sharing the directory): what a probe for chunks this tier did not
    /// store calls first. Reads the directory and the tables of the new packs without the
    /// lock, then indexes under it those whose file is still the one read (not one this tier
    /// deleted meanwhile); a key both hold becomes the new pack's. Returns how many packs
    /// were indexed.
    ///
    /// # Errors
    ///
    /// An I/O error reading the directory or a table.
    pub fn rescan(&self) -> Result<usize, TierError> {
        let seen = self.index.lock().seen.clone();
        #[cfg(test)]
        self.test_pause(Pause::RescanCopiedSeen);
        let s = scan::scan(&self.root, self.pack_limit(), self.limit(), Some(&seen))?;
        #[cfg(test)]
        self.test_pause(Pause::RescanWalked);
        let mut found = s.found;
        found.sort_unstable_by_key(|p| p.id);
        let mut index = self.index.lock();
        // A number left alone whose file is gone (another tier evicted or removed it) is
        // forgotten, so `seen` holds at most the packs in the directory and this tier's own:
        // refused packs come and go as long as engines share the directory. (Planted bug
        // `seen-never-pruned`, scripts/plants.sh: it grows with every one.)
        if !planted!("seen-never-pruned") {
            let Index { seen, packs, .. } = &mut *index;
            seen.retain(|id| s.listed.contains(id) || packs.contains_key(id));
        }
        index.seen.extend(s.ignored);
        let mut added = 0;
        for p in found {
            // Relaxed: only uniqueness of the number matters.
            self.next_pack
                .fetch_max(p.id.saturating_add(1), Ordering::Relaxed);
            if index.seen.contains(&p.id) {
                continue;
            }
            // The walk ran without the lock: a pack this tier wrote after `seen` was copied
            // may have been deleted since (its keys saved again, or evicted), and indexing
            // it would move its keys back onto a file that is gone, count its bytes, and
            // delete the pack that holds those keys now. Only a pack whose file the walk read
            // is still at its path is indexed: this tier deletes its packs under the lock,
            // so such a file stays while the lock is held. (Planted bug
            // `rescan-indexes-deleted-packs`, scripts/plants.sh.)
            if !self.still_at_its_path(&p) && !planted!("rescan-indexes-deleted-packs") {
                continue;
            }
            index.files.insert(p.id, p.file);
            let live = p.entries.iter().filter(|e| e.off != pack::REMOVED);
            let entries = live.map(|e| (e.key, e.off, e.len));
            for old in index.insert_pack(p.id, p.len, entries) {
                self.delete_pack(&mut index, old);
            }
            added += 1;
        }
        self.evict_to_fit(&mut index, None, 0);
        Ok(added)
    }

    /// The tier with an empty index, its open's counts `found`.
    fn unscanned(root: PathBuf, cfg: DiskConfig, found: Found) -> DiskTier {
        DiskTier {
            root,
            cfg,
            index: Mutex::new(Index::default()),
            next_pack: AtomicU64::new(0),
            next_temp: AtomicU64::new(0),
            expected_max: AtomicU64::new(0),
            pid: std::process::id(),
            temp_names: std::collections::hash_map::RandomState::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            refused_reads: AtomicU64::new(0),
            full_writes: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            stale_temps_removed: found.stale,
            oversized_ignored: found.oversized,
            refused_packs: found.refused,
            #[cfg(test)]
            test_fs: AtomicU64::new(u64::MAX),
            #[cfg(test)]
            pause: Mutex::new(None),
        }
    }

    /// Tests: runs the hook set for `at`, if any.
    #[cfg(test)]
    fn test_pause(&self, at: Pause) {
        let hook = self.pause.lock().take();
        if let Some(mut hook) = hook {
            hook(self, at);
            let mut slot = self.pause.lock();
            if slot.is_none() {
                *slot = Some(hook);
            }
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The pack file that holds the chunk of `key`, if the index holds it.
    pub fn pack_path(&self, key: ChunkKey) -> Option<PathBuf> {
        let pack = self.index.lock().map.get(&key)?.pack;
        Some(self.path_of(pack))
    }

    /// Whether the file a walk read as pack `p` is still at its path (not deleted, nor
    /// replaced by another file under its number).
    fn still_at_its_path(&self, p: &scan::Found) -> bool {
        fs::symlink_metadata(self.path_of(p.id)).is_ok_and(|m| same_file(file_id(&m), p.file))
    }

    /// The file of pack `id`.
    fn path_of(&self, id: u64) -> PathBuf {
        self.root.join(format!("{id:016x}.{PACK_EXT}"))
    }

    /// The bytes of a pack file holding values of the lengths `value_lens`, in one put.
    pub fn pack_bytes(value_lens: &[u64]) -> u64 {
        pack::table_len(value_lens.len()) + value_lens.iter().sum::<u64>()
    }

    /// Every key indexed now, in no particular order.
    pub fn keys(&self) -> Vec<ChunkKey> {
        self.index.lock().map.keys().copied().collect()
    }

    /// Counters so far, and what the index holds now.
    pub fn counts(&self) -> DiskCounts {
        let (bytes, entries, capacity_bytes) = {
            let i = self.index.lock();
            (
                i.bytes,
                i.map.len() as u64,
                i.capacity(self.cfg.capacity_bytes),
            )
        };
        // Relaxed: statistics only.
        DiskCounts {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes,
            entries,
            stale_temps_removed: self.stale_temps_removed,
            oversized_ignored: self.oversized_ignored,
            refused_reads: self.refused_reads.load(Ordering::Relaxed),
            full_writes: self.full_writes.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            capacity_bytes,
            refused_packs: self.refused_packs,
        }
    }

    /// Deletes the least recently used packs (never `keep`) until the index, with `room`
    /// bytes more, fits the capacity in force. Called with the index lock held (or on the
    /// index before it is shared).
    fn evict_to_fit(&self, index: &mut Index, keep: Option<u64>, room: u64) {
        let cap = index.capacity(self.cfg.capacity_bytes);
        while index.bytes.saturating_add(room) > cap {
            let Some(victim) = index.oldest() else {
                break;
            };
            if Some(victim) == keep {
                // Only the newest pack is left, and it fits by the put's size check.
                break;
            }
            let chunks = index.drop_pack(victim);
            // Relaxed: statistics only.
            self.evictions.fetch_add(chunks as u64, Ordering::Relaxed);
            self.delete_pack(index, victim);
        }
    }

    /// Deletes the file of pack `id` (no longer indexed). Once the file is gone a rescan
    /// cannot meet it (one whose walk read it before finds it gone, and skips it), so `index`
    /// forgets its number; a file that could not be deleted stays
    /// among the numbers a rescan skips. A file at the pack's path that is not the one this
    /// tier wrote or indexed there (another tier's pack under a number whose file was
    /// deleted) is left alone, and its number forgotten so that a rescan indexes it.
    fn delete_pack(&self, index: &mut Index, id: u64) {
        let path = self.path_of(id);
        let want = index.files.remove(&id).flatten();
        let now = fs::symlink_metadata(&path).ok().as_ref().and_then(file_id);
        if now.is_some() && !same_file(now, want) && !planted!("disk-pack-identity-unchecked") {
            index.seen.remove(&id);
            return;
        }
        match fs::remove_file(&path) {
            Ok(()) => {
                index.seen.remove(&id);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                index.seen.remove(&id);
            }
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "disk tier: delete pack"),
        }
    }

    /// Whether `meta` is the file pack `id` named when this tier wrote or indexed it (see
    /// `Index::files`).
    fn is_own_file(&self, index: &Index, id: u64, meta: &fs::Metadata) -> bool {
        planted!("disk-pack-identity-unchecked")
            || same_file(file_id(meta), index.files.get(&id).copied().flatten())
    }

    /// The largest value accepted: `max_value_bytes`, or what a pack of one value within
    /// the capacity holds if that is less.
    fn limit(&self) -> u64 {
        self.cfg
            .max_value_bytes
            .min(self.cfg.capacity_bytes.saturating_sub(pack::table_len(1)))
    }

    /// The value bytes a pack of several values takes at most: [`PACK_BYTES`], or what the
    /// capacity holds beside the largest table if that is less, so that every pack fits the
    /// capacity. (A pack of one value takes up to the largest value.)
    fn pack_budget(&self) -> u64 {
        PACK_BYTES.min(
            self.cfg
                .capacity_bytes
                .saturating_sub(pack::table_len(pack::MAX_ENTRIES)),
        )
    }

    /// The largest pack file written, read or indexed.
    fn pack_limit(&self) -> u64 {
        pack::table_len(pack::MAX_ENTRIES).saturating_add(self.pack_budget().max(self.limit()))
    }
}

#[cfg(test)]
mod tests;
