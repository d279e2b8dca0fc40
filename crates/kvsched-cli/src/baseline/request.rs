//! One live request's state, and the block hashes of its prompt.

use std::sync::Arc as StdArc;
use std::time::Instant;

use kvsched::connector::LoadJob;
use kvsched::pool::{BlockRef, Generation};
use kvsched::rules::geometry::{BlockId, Geometry};
use kvsched::runtime::policy::trust::load_blocks;
use kvsched::runtime::EndState;

/// Where a request is in its life: waiting for admission, loading its external prefix
/// asynchronously, or running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Waiting,
    Loading,
    Running,
}

/// One live request.
pub(super) struct Req {
    pub(super) id: StdArc<str>,
    pub(super) prompt: StdArc<[u32]>,
    pub(super) max_new_tokens: u32,
    pub(super) generated: u32,
    pub(super) hashes: Vec<Vec<u64>>,
    pub(super) tables: Vec<Vec<BlockId>>,
    pub(super) gens: Vec<Vec<Generation>>,
    pub(super) registered: Vec<usize>,
    pub(super) num_computed_tokens: u64,
    /// Tokens whose bytes are known written (as a shard's request): only entries below it
    /// enter the prefix cache.
    pub(super) written: u64,
    pub(super) last_scheduled: u64,
    pub(super) phase: Phase,
    pub(super) waits: Vec<BlockId>,
    /// The step whose recovery set `waits`: the request is not scheduled in it (as a shard).
    pub(super) waits_step: u64,
    pub(super) owned_pending: Vec<BlockId>,
    pub(super) attempt: u32,
    /// The in-flight load's range (tokens): its own blocks, the only ones its failure may name.
    pub(super) load_start: u64,
    pub(super) load_end: u64,
    pub(super) load_cap: u64,
    pub(super) load_done: Option<Instant>,
    pub(super) end_after_load: Option<EndState>,
    pub(super) sync_job: Option<LoadJob>,
    pub(super) submitted_at: Instant,
    pub(super) first_scheduled: bool,
    pub(super) sampled_pending: bool,
    pub(super) finish_pending: bool,
    pub(super) skip: bool,
}

impl Req {
    /// A request just submitted, waiting, with no blocks.
    pub(super) fn new(
        id: StdArc<str>,
        prompt: Vec<u32>,
        max_new_tokens: u32,
        hashes: Vec<Vec<u64>>,
        groups: usize,
    ) -> Self {
        Req {
            id,
            prompt: prompt.into(),
            max_new_tokens,
            generated: 0,
            hashes,
            tables: vec![Vec::new(); groups],
            gens: vec![Vec::new(); groups],
            registered: vec![0; groups],
            written: 0,
            num_computed_tokens: 0,
            last_scheduled: 0,
            phase: Phase::Waiting,
            waits: Vec::new(),
            waits_step: 0,
            owned_pending: Vec::new(),
            attempt: 0,
            load_start: 0,
            load_end: 0,
            load_cap: u64::MAX,
            load_done: None,
            end_after_load: None,
            sync_job: None,
            submitted_at: Instant::now(),
            first_scheduled: false,
            sampled_pending: false,
            finish_pending: false,
            skip: false,
        }
    }

    pub(super) fn seq_len(&self) -> u64 {
        self.prompt.len() as u64 + u64::from(self.generated)
    }

    /// The non-null blocks the in-flight load writes (its own: the only ones a failure of it
    /// may name), at the generations the request holds them.
    pub(super) fn load_blocks(&self, geo: &Geometry) -> Vec<BlockRef> {
        load_blocks(
            geo,
            &self.tables,
            &self.gens,
            self.load_start,
            self.load_end,
        )
    }
}

/// The chained hash of every full block of `prompt`, per cache group.
pub(super) fn prompt_hashes(geo: &Geometry, prompt: &[u32]) -> Vec<Vec<u64>> {
    geo.groups()
        .iter()
        .enumerate()
        .map(|(g, grp)| {
            let mut parent = 0;
            prompt
                .chunks_exact(grp.block_size as usize)
                .map(|c| {
                    parent = kvsched::pool::chain_hash(parent, g, c);
                    parent
                })
                .collect()
        })
        .collect()
}
