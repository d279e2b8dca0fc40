//! [`Tier`] for [`DiskTier`].

use super::{pack, ChunkKey, DiskTier, TierError};
use crate::connector::CancelToken;
use crate::kv::tier::check_into_lens;
use crate::kv::Tier;
use crate::sync::Ordering;

impl Tier for DiskTier {
    fn name(&self) -> &str {
        "disk"
    }

    /// Refuses, from then on, a read of a value longer than the largest `bytes` said (never
    /// above `max_value_bytes`): a table someone else wrote may name values of up to it, and
    /// each would be read whole before its checks refuse it.
    fn expect_values_up_to(&self, bytes: usize) {
        // Relaxed: a bound, read once per value.
        self.expected_max
            .fetch_max((bytes as u64).max(1), Ordering::Relaxed);
    }

    /// An open (shared by consecutive chunks of one pack) and a read per chunk whatever the
    /// batch: nothing to save by batching, so a load reads it piece by piece and copies each
    /// piece out of cache.
    fn costs_per_call(&self) -> bool {
        false
    }

    /// From the index alone (no I/O): a hint, as the trait says.
    fn exists(&self, keys: &[ChunkKey], cancel: &CancelToken) -> Result<Vec<bool>, TierError> {
        if cancel.is_cancelled() {
            return Err(TierError::Cancelled);
        }
        let index = self.index.lock();
        Ok(keys.iter().map(|k| index.map.contains_key(k)).collect())
    }

    /// Reads each key's value on the calling thread, checking `cancel` before each.
    fn get(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
    ) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        let mut out = Vec::with_capacity(keys.len());
        let mut open = None;
        for &k in keys {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            let mut buf = Vec::new();
            let got = self.get_one(k, cancel, &mut buf, &mut open)?;
            out.push(got.then_some(buf));
        }
        Ok(out)
    }

    /// Reads each key's value into its buffer on the calling thread (the buffer's capacity
    /// reused: the kernel copies from the page cache straight into it), checking `cancel`
    /// before each; consecutive keys of one pack share one open of its file.
    fn get_into(
        &self,
        keys: &[ChunkKey],
        cancel: &CancelToken,
        bufs: &mut [Vec<u8>],
        held: &mut [bool],
    ) -> Result<(), TierError> {
        check_into_lens(keys.len(), bufs.len(), held.len())?;
        let mut open = None;
        for ((&k, buf), h) in keys.iter().zip(bufs.iter_mut()).zip(held.iter_mut()) {
            if cancel.is_cancelled() {
                return Err(TierError::Cancelled);
            }
            *h = self.get_one(k, cancel, buf, &mut open)?;
        }
        Ok(())
    }

    /// Writes the values in packs (temporary file, then a hard link into place), evicting as needed. Stops
    /// at the first I/O error, with the earlier packs stored. A value over the largest is
    /// skipped and reported as [`TierError::Refused`] after the rest are stored.
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        let limit = self.limit();
        // A capacity smaller than one value's table holds no pack, not even of an empty value.
        let holds_a_pack = self.cfg.capacity_bytes >= pack::table_len(1);
        let mut refused = None;
        let mut ok = Vec::with_capacity(chunks.len());
        for (k, v) in chunks {
            if v.len() as u64 > limit || !holds_a_pack {
                refused.get_or_insert((*k, v.len()));
            } else {
                ok.push((*k, v.as_slice()));
            }
        }
        self.put_chunks(&ok)?;
        match refused {
            None => Ok(()),
            Some((k, len)) => Err(TierError::Refused(format!(
                "value for key {k}: {len} bytes, more than the disk tier's largest value ({limit} \
                 bytes)"
            ))),
        }
    }
}
