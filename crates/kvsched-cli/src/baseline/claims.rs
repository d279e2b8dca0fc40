//! The baseline's claim words and pending-recompute marks: the [`Claims`] of its strategy,
//! plain `Cell`s behind the global lock where the runtime has atomics. With one shard and
//! one thread, a claim is a plain minimum and a mark a plain store.

use std::cell::Cell;

use kvsched::rules::geometry::BlockId;
use kvsched::runtime::claim::{RequestKey, Scan, ORPHANED};
use kvsched::runtime::shard::strategy::Claims;

/// `pending` value of a block nobody has to recompute.
const NOT_PENDING: u64 = 0;

/// One claim word per scan and one pending mark per block.
pub(super) struct ClaimWords {
    async_words: Vec<Cell<u64>>,
    sync_words: Vec<Cell<u64>>,
    pending: Vec<Cell<u64>>,
}

impl ClaimWords {
    /// Words for block ids `0..capacity`, none claimed or pending.
    pub(super) fn new(capacity: usize) -> Self {
        ClaimWords {
            async_words: vec![Cell::new(RequestKey::EMPTY); capacity],
            sync_words: vec![Cell::new(RequestKey::EMPTY); capacity],
            pending: vec![Cell::new(NOT_PENDING); capacity],
        }
    }

    fn word(&self, id: BlockId, scan: Scan) -> Option<&Cell<u64>> {
        let words = match scan {
            Scan::Async => &self.async_words,
            Scan::Sync => &self.sync_words,
        };
        usize::try_from(id).ok().and_then(|i| words.get(i))
    }

    fn mark(&self, id: BlockId) -> Option<&Cell<u64>> {
        usize::try_from(id).ok().and_then(|i| self.pending.get(i))
    }
}

impl Claims for ClaimWords {
    fn reset(&self, id: BlockId) {
        for scan in [Scan::Async, Scan::Sync] {
            if let Some(w) = self.word(id, scan) {
                w.set(RequestKey::EMPTY);
            }
        }
    }
    fn claim(&self, id: BlockId, scan: Scan, key: RequestKey) {
        if let Some(w) = self.word(id, scan) {
            w.set(w.get().min(key.raw()));
        }
    }
    fn winner(&self, id: BlockId, scan: Scan) -> Option<RequestKey> {
        let raw = self.word(id, scan)?.get();
        (raw != RequestKey::EMPTY).then(|| RequestKey::from_raw(raw))
    }
    fn set_pending(&self, id: BlockId, owner: RequestKey) {
        if let Some(m) = self.mark(id) {
            m.set(owner.raw());
        }
    }
    fn orphan(&self, id: BlockId, owner: RequestKey) {
        if let Some(m) = self.mark(id).filter(|m| m.get() == owner.raw()) {
            m.set(ORPHANED);
        }
    }
    fn clear_pending(&self, id: BlockId, owner: RequestKey) -> bool {
        match self.mark(id).filter(|m| m.get() == owner.raw()) {
            Some(m) => {
                m.set(NOT_PENDING);
                true
            }
            None => false,
        }
    }
    fn forget(&self, id: BlockId) {
        if let Some(m) = self.mark(id) {
            m.set(NOT_PENDING);
        }
    }
    fn pending_owner(&self, id: BlockId) -> Option<u64> {
        let v = self.mark(id)?.get();
        (v != NOT_PENDING).then_some(v)
    }
}
