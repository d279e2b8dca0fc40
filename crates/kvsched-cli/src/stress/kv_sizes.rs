//! What a stress run's KV settings come to: the bytes of one KV memory block and the tag of
//! every chunk key.

use kvsched::rules::geometry::GroupKind;

use super::config::StressConfig;

impl StressConfig {
    /// Bytes of one KV memory block: the largest group's (attention `--kv-bytes-per-token` ×
    /// block size, Mamba `--mamba-state-bytes`).
    pub(super) fn kv_block_bytes(&self) -> u64 {
        self.groups
            .groups()
            .iter()
            .map(|g| match g.kind {
                GroupKind::Mamba { .. } => self.mamba_state_bytes,
                _ => self.kv_bytes_per_token.saturating_mul(g.block_size),
            })
            .max()
            .unwrap_or(0)
    }

    /// The layout/model tag of every chunk key and reference: the geometry and KV sizes, so
    /// a store holding chunks of another layout (a disk directory reused with other flags)
    /// never offers them.
    pub(super) fn kv_tag(&self) -> u64 {
        kvsched_testkit::hash_str(&format!(
            "kvsched-stress:{}:{}:{}",
            self.groups.name(),
            self.kv_bytes_per_token,
            self.mamba_state_bytes
        ))
    }
}
