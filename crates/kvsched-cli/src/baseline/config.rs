//! The baseline's settings.

use std::sync::Arc as StdArc;

use kvsched::connector::{KvConnector, NoConnector};
use kvsched::rules::geometry::CacheGroup;
use kvsched::rules::recovery::{Mode, Policy};
use kvsched::runtime::LoadPolicy;

/// Settings of a [`MutexScheduler`](super::MutexScheduler) (the same meaning as the runtime
/// builder's).
#[derive(Clone)]
pub struct BaselineConfig {
    /// Cache groups.
    pub groups: Vec<CacheGroup>,
    /// Pool size in blocks, the null block included.
    pub pool_blocks: usize,
    /// Worker threads (1–256).
    pub workers: usize,
    /// Recovery mode.
    pub mode: Mode,
    /// Recovery policy.
    pub policy: Policy,
    /// Tokens per step.
    pub token_budget: u64,
    /// Sequences per step (also the admission limit per step).
    pub max_seqs: usize,
    /// The KV connector.
    pub connector: StdArc<dyn KvConnector>,
    /// How much of a lookup hit to load (the runtime's `Settings::load_policy`).
    pub load_policy: LoadPolicy,
    /// The engine's compute rate, tokens/s (`Settings::compute_rate`).
    pub compute_rate: Option<f64>,
}

impl std::fmt::Debug for BaselineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (groups, blocks, workers) = (&self.groups, self.pool_blocks, self.workers);
        write!(f, "BaselineConfig {{ groups: {groups:?}, pool_blocks: {blocks}, workers: {workers}, .. }}")
    }
}

impl Default for BaselineConfig {
    fn default() -> Self {
        BaselineConfig {
            groups: vec![CacheGroup::full_attention(16)],
            pool_blocks: 4096,
            workers: 2,
            mode: Mode::Safe,
            policy: Policy::Recompute,
            token_budget: 8192,
            max_seqs: 256,
            connector: StdArc::new(NoConnector),
            load_policy: LoadPolicy::Always,
            compute_rate: None,
        }
    }
}
