//! [`Region`]: the host KV buffer vLLM hands a secondary tier (`primary_kv_view`), seen as
//! `num_blocks` slots of `block_bytes` each, read by store jobs and written by load jobs on the
//! tier's threads without the GIL.
//!
//! # Safety protocol
//!
//! The region holds a raw pointer into a Python buffer. Two things make using it sound:
//!
//! * **lifetime**: the buffer export (`PyUntypedBuffer`) is owned by the `NativeTier` that
//!   owns the worker threads, and `NativeTier` joins every worker (its `Drop` and `shutdown`)
//!   before the export is released; the pointer is never used after that (in a process
//!   forked from the one that started them there are no workers: none runs there);
//! * **no overlapping access to a slot**: vLLM's contract for `submit_store` / `submit_load`
//!   is that a job's primary-tier slots are pinned for the job's duration and that no one
//!   else writes a slot a load is filling. The region checks bounds; the slots' exclusivity
//!   is the caller's promise, as it is for any DMA engine.

/// A writable, C-contiguous byte buffer of `num_blocks` equal slots.
pub(crate) struct Region {
    base: *mut u8,
    len: usize,
    block_bytes: usize,
}

// Safety: the pointer is only dereferenced under the protocol above (the export outlives every
// thread holding the region; slots are accessed through bounds-checked copies).
unsafe impl Send for Region {}
// Safety: as for `Send`: shared references only copy bytes in or out of checked slots.
unsafe impl Sync for Region {}

impl Region {
    /// The region over `len` bytes at `base`, in slots of `block_bytes`.
    ///
    /// # Safety
    ///
    /// `base .. base + len` must be valid for reads and writes for as long as the region is
    /// used (see the module's protocol).
    pub(crate) unsafe fn new(base: *mut u8, len: usize, block_bytes: usize) -> Region {
        Region {
            base,
            len,
            block_bytes,
        }
    }

    /// Bytes per slot.
    pub(crate) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Number of slots.
    pub(crate) fn num_blocks(&self) -> usize {
        self.len.checked_div(self.block_bytes).unwrap_or(0)
    }

    fn offset(&self, block: u64) -> Option<usize> {
        let b = usize::try_from(block).ok()?;
        (b < self.num_blocks()).then(|| b * self.block_bytes)
    }

    /// A copy of slot `block` (`None`: out of range).
    pub(crate) fn read(&self, block: u64) -> Option<Vec<u8>> {
        let off = self.offset(block)?;
        let mut out = vec![0u8; self.block_bytes];
        // Safety: `off + block_bytes <= len` (checked by `offset`), the buffer is live (module
        // protocol), `out` is a fresh allocation so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(off), out.as_mut_ptr(), self.block_bytes)
        };
        Some(out)
    }

    /// Writes `bytes` (exactly one slot's worth) into slot `block`; false when out of range
    /// or of the wrong length.
    pub(crate) fn write(&self, block: u64, bytes: &[u8]) -> bool {
        let Some(off) = self.offset(block) else {
            return false;
        };
        if bytes.len() != self.block_bytes {
            return false;
        }
        // Safety: `off + block_bytes <= len` (checked), the buffer is live and writable (the
        // export was checked not read-only), `bytes` is a Rust allocation distinct from it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), self.block_bytes)
        };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounds_checked() {
        let mut buf = vec![0u8; 12];
        // Safety: `buf` outlives `r` and is not otherwise touched while `r` is used.
        let r = unsafe { Region::new(buf.as_mut_ptr(), buf.len(), 4) };
        assert_eq!(r.num_blocks(), 3);
        assert!(r.write(2, &[1, 2, 3, 4]));
        assert!(!r.write(3, &[1, 2, 3, 4]));
        assert!(!r.write(0, &[1, 2, 3]));
        assert_eq!(r.read(2), Some(vec![1, 2, 3, 4]));
        assert_eq!(r.read(3), None);
        assert_eq!(r.read(u64::MAX), None);
        assert_eq!(&buf[8..], &[1, 2, 3, 4]);
    }
}
