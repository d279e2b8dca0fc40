//! A memory tier that damages the chunks it answers.

/// A memory tier that flips the last byte of chunks it answers (the chunk checksum catches
/// it): of every `every`-th chunk read, once armed.
pub struct Damaging {
    inner: kvsched::kv::MemoryTier,
    on: std::sync::atomic::AtomicBool,
    n: std::sync::atomic::AtomicU64,
    every: u64,
    /// Damages at most this many chunks.
    limit: std::sync::atomic::AtomicU64,
}

impl Damaging {
    /// Damages every `every`-th chunk read, from the first read on.
    pub fn every(inner: kvsched::kv::MemoryTier, every: u64) -> Self {
        Damaging {
            inner,
            on: std::sync::atomic::AtomicBool::new(true),
            n: std::sync::atomic::AtomicU64::new(1),
            every: every.max(1),
            limit: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }

    /// Damages every chunk read once [`Damaging::arm`] is called, none before.
    pub fn armed_later(inner: kvsched::kv::MemoryTier) -> Self {
        Damaging {
            on: std::sync::atomic::AtomicBool::new(false),
            ..Damaging::every(inner, 1)
        }
    }

    /// From now on, damages the chunks it answers.
    pub fn arm(&self) {
        self.on.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on, damages the next `n` chunks it answers, and no more.
    pub fn arm_for(&self, n: u64) {
        self.limit.store(n, std::sync::atomic::Ordering::SeqCst);
        self.arm();
    }
}

impl kvsched::kv::Tier for Damaging {
    fn name(&self) -> &str {
        "damaging"
    }
    fn exists(
        &self,
        keys: &[kvsched::kv::ChunkKey],
        c: &kvsched::connector::CancelToken,
    ) -> Result<Vec<bool>, kvsched::kv::TierError> {
        self.inner.exists(keys, c)
    }
    fn get(
        &self,
        keys: &[kvsched::kv::ChunkKey],
        c: &kvsched::connector::CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, kvsched::kv::TierError> {
        use std::sync::atomic::Ordering;
        let mut v = self.inner.get(keys, c)?;
        if self.on.load(Ordering::SeqCst) {
            for x in v.iter_mut().flatten() {
                if self.n.fetch_add(1, Ordering::Relaxed) % self.every == 0
                    && self
                        .limit
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                        .is_ok()
                {
                    if let Some(last) = x.last_mut() {
                        *last ^= 1;
                    }
                }
            }
        }
        Ok(v)
    }
    fn put(
        &self,
        chunks: &[(kvsched::kv::ChunkKey, Vec<u8>)],
    ) -> Result<(), kvsched::kv::TierError> {
        self.inner.put(chunks)
    }
    fn may_block(&self) -> bool {
        false
    }
}
