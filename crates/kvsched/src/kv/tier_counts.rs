//! [`TierCounts`]: the counters of a [`TierConnector`](super::TierConnector).

/// What a [`TierConnector`](super::TierConnector) has done, as counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierCounts {
    /// Lookups answered.
    pub lookups: u64,
    /// Lookups that offered tokens.
    pub lookup_hits: u64,
    /// Loads run.
    pub loads: u64,
    /// Chunks verified and written into KV memory.
    pub chunks_loaded: u64,
    /// Of `chunks_loaded`, those under keys this connector neither saved nor stored itself:
    /// written by another engine sharing the tier (or an earlier process). It counts keys,
    /// not writers: a key this connector saved, whose value another engine of the same model
    /// and layout stored again since, counts as its own (both values are the same KV).
    pub chunks_loaded_from_others: u64,
    /// Payload bytes written into KV memory by loads.
    pub kv_bytes_loaded: u64,
    /// Wall time inside loads, summed over loads (ns; loads running at once each count
    /// theirs): `kv_bytes_loaded / load_ns` is the load bandwidth one load sees, failed
    /// chunks' time included.
    pub load_ns: u64,
    /// Chunks the tier did not have at load time.
    pub missing_chunks: u64,
    /// Chunks whose bytes changed after they were written (checksum).
    pub checksum_failures: u64,
    /// Intact chunks of another key or group.
    pub key_mismatches: u64,
    /// Chunks with a missing or wrong MAC.
    pub mac_failures: u64,
    /// Chunks truncated or with a bad header.
    pub format_errors: u64,
    /// Tier calls that failed as a whole (every block of the call invalid). A call the load's
    /// own cancellation ended (`TierError::Cancelled` once its token fired) is not one: the
    /// load counts in `loads_cancelled`.
    pub tier_errors: u64,
    /// Destinations the load was no longer allowed to write (its fill ended): left alone.
    pub writes_refused: u64,
    /// Loads that saw their cancellation token fired.
    pub loads_cancelled: u64,
    /// Loads whose tier answer did not come before the load's deadline: failed whole, nothing
    /// of them written.
    pub loads_late: u64,
    /// Tier gets running now on the connector's get threads (a hung tier's among them).
    pub gets_busy: u64,
    /// Chunks stored by the write-behind.
    pub chunks_saved: u64,
    /// Encoded bytes stored by the write-behind.
    pub kv_bytes_saved: u64,
    /// Save offers dropped: the queue was full, or they were still queued when
    /// [`TierConnector::drop_queued_saves`](super::TierConnector::drop_queued_saves) or the
    /// connector's drop dropped them.
    pub saves_dropped: u64,
    /// Tier `put` calls that failed (batches of up to `save_batch` chunks).
    pub save_errors: u64,
    /// Chunks of those failed puts that the tier does not hold (asked after the failure: a
    /// put may store part of its batch).
    pub saves_failed: u64,
    /// Chunks not tried because saving was paused after puts kept failing
    /// ([`SaveBackoff`](super::SaveBackoff)).
    pub saves_skipped: u64,
    /// Pauses of saving started.
    pub save_pauses: u64,
    /// The last failed put's error (no credentials), if any failed.
    pub last_save_error: Option<String>,
    /// Background existence probes run (tier calls, each of up to 2,048 keys), and keys they
    /// found held (put into the index, so a later lookup offers them).
    pub probes: u64,
    /// See `probes`.
    pub probe_hits: u64,
    /// Keys the probes asked about.
    pub probe_keys: u64,
    /// Runs of a prompt's keys not asked about because their first key was asked within
    /// `probe_miss_ttl`.
    pub probes_skipped: u64,
    /// Runs not asked about because the probe queue was full.
    pub probes_dropped: u64,
}
