//! [`Buffers`]: the connector's reused chunk buffers, so a load reads a chunk into memory it
//! already owns (and has already touched) instead of a fresh allocation per chunk, and a save
//! copies a block's bytes into one.
//!
//! # Limits
//!
//! At most `keep` idle buffers are kept (about 64 MiB of them, at least 8); more are dropped
//! when given back, as is any buffer that grew past twice the chunk size (a value that large
//! fails its decode anyway, and its memory is not worth keeping). A load or a save in flight
//! holds its own buffers; a tier call that never returns keeps those of its load.

use crate::sync::Mutex;

/// Idle bytes kept at most (rounded to whole buffers, at least 8 of them).
const KEEP_BYTES: usize = 64 << 20;

/// A bounded stack of reusable buffers of one chunk size.
pub(crate) struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
    /// The chunk size buffers are made for (and pre-faulted at).
    size: usize,
    keep: usize,
}

impl Buffers {
    /// Buffers for chunks of `size` bytes (the encoded size of the largest block).
    pub(crate) fn new(size: usize) -> Buffers {
        Buffers {
            free: Mutex::new(Vec::new()),
            size,
            keep: (KEEP_BYTES / size.max(1)).clamp(8, 1024),
        }
    }

    /// One buffer: a reused one, or a new one whose `size` bytes are already touched (so the
    /// first chunk read into it pays no page faults on the hot path). Its length and bytes
    /// are whatever its last user left; callers set both.
    pub(crate) fn take(&self) -> Vec<u8> {
        if let Some(b) = self.free.lock().pop() {
            return b;
        }
        vec![0u8; self.size]
    }

    /// `n` buffers (see [`take`](Self::take)).
    pub(crate) fn take_n(&self, n: usize) -> Vec<Vec<u8>> {
        let mut out = {
            let mut free = self.free.lock();
            let at = free.len().saturating_sub(n);
            free.split_off(at)
        };
        while out.len() < n {
            out.push(vec![0u8; self.size]);
        }
        out
    }

    /// Gives buffers back for reuse (within the bounds of the module's limits).
    pub(crate) fn give(&self, bufs: impl IntoIterator<Item = Vec<u8>>) {
        let mut free = self.free.lock();
        for b in bufs {
            if free.len() >= self.keep {
                break;
            }
            if b.capacity() <= self.size.saturating_mul(2) && b.capacity() >= self.size {
                free.push(b);
            }
        }
    }

    /// Idle buffers held now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.free.lock().len()
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    #[test]
    fn reuses_within_bounds_and_drops_grown_buffers() {
        let b = Buffers::new(1 << 20);
        assert_eq!(b.keep, 64);
        let mut v = b.take_n(3);
        assert!(v.iter().all(|x| x.len() == 1 << 20));
        let ptr = v[0].as_ptr();
        v[1].reserve(4 << 20); // grown past twice the size: not kept
        b.give(v);
        assert_eq!(b.idle(), 2);
        let again = b.take_n(2);
        assert!(
            again.iter().any(|x| x.as_ptr() == ptr),
            "a buffer given back is reused"
        );
        b.give((0..1000).map(|_| vec![0u8; 1 << 20]));
        assert_eq!(b.idle(), 64);
        assert_eq!(Buffers::new(32 << 20).keep, 8);
    }
}
