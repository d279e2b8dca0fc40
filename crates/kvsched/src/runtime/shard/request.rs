//! A request as the engine submits it, the commands that reach a shard between steps, and the
//! shard's record of each live request it owns.

use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use crate::connector::{CancelToken, KvConnector, LoadJob, Prepared};
use crate::panics::DropCaught;
use crate::pool::{BlockHash, BlockRef, Generation};
use crate::rules::geometry::{BlockId, Geometry};
use crate::rules::recovery::{RequestClass, RequestView};
use crate::runtime::claim::RequestKey;
use crate::runtime::{RuntimeError, SubmitRequest};

use super::{BlockTable, EndState};

/// A request as submitted.
#[derive(Clone, Debug)]
pub struct NewRequest {
    /// Request id.
    pub id: StdArc<str>,
    /// Prompt tokens.
    pub prompt: StdArc<[u32]>,
    /// Tokens to generate (0: no limit).
    pub max_new_tokens: u32,
    /// Its place in canonical order (async class).
    pub key: RequestKey,
    /// When it was submitted.
    pub submitted_at: Instant,
    /// Its own load deadline (overrides the settings').
    pub load_deadline: Option<Duration>,
    /// Per group: chained hashes of the prompt's full blocks (`prompt_hashes`), computed
    /// by the submitting thread so the step that takes the request does not hash it.
    pub hashes: Vec<Vec<BlockHash>>,
    /// What the connector prepared from the prompt at submit.
    pub prepared: PreparedPrompt,
}

/// What a connector prepared from a request's prompt at submit ([`KvConnector::prepare`]).
#[derive(Clone, Debug, Default)]
pub struct PreparedPrompt {
    /// What `prepare` returned (dropped where a panic of its `Drop` is caught).
    pub(crate) value: DropCaught<Prepared>,
    /// `prepare` panicked (counted when the request reaches its shard; `value` is `None`).
    pub panicked: bool,
}

impl PreparedPrompt {
    /// Runs `connector.prepare` on request `id`'s `prompt`, here, on the calling thread,
    /// catching a panic. The caller holds no lock: a slow connector delays only this call.
    pub fn by(connector: &dyn KvConnector, id: &str, prompt: &[u32]) -> PreparedPrompt {
        match crate::panics::caught(|| connector.prepare(id, prompt)) {
            Ok(value) => PreparedPrompt {
                value: DropCaught::new(value),
                panicked: false,
            },
            Err(_) => PreparedPrompt {
                value: DropCaught::default(),
                panicked: true,
            },
        }
    }
}

/// Per group: the chained hashes of `prompt`'s full blocks — computed once per request, at
/// submit, on the submitting thread.
pub(crate) fn prompt_hashes(geo: &Geometry, prompt: &[u32]) -> Vec<Vec<BlockHash>> {
    geo.groups()
        .iter()
        .enumerate()
        .map(|(g, grp)| {
            let mut parent = 0u64;
            prompt
                .chunks_exact(grp.block_size as usize)
                .map(|c| {
                    parent = crate::pool::chain_hash(parent, g, c);
                    parent
                })
                .collect()
        })
        .collect()
}

impl NewRequest {
    /// Checks `req` as a submission is checked before it is queued: an id, a prompt, a
    /// `load_deadline` that is `None` or above zero, and a length a pool of `pool_blocks`
    /// blocks (the null block included) can ever hold.
    pub fn check(
        geo: &Geometry,
        pool_blocks: usize,
        req: &SubmitRequest,
    ) -> Result<(), RuntimeError> {
        if req.id.is_empty() {
            return Err(RuntimeError::EmptyId);
        }
        if req.prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt(req.id.clone()));
        }
        if req.load_deadline.is_some_and(|d| d.is_zero()) {
            return Err(RuntimeError::ZeroLoadDeadline(req.id.clone()));
        }
        let total = req.prompt.len() as u64 + u64::from(req.max_new_tokens.max(1));
        let needed: u64 = geo
            .groups()
            .iter()
            .map(|g| g.blocks_for_tokens(total))
            .sum();
        let usable = (pool_blocks as u64).saturating_sub(1);
        if needed > usable {
            return Err(RuntimeError::TooLong {
                id: req.id.clone(),
                needed,
                usable,
            });
        }
        Ok(())
    }

    /// The checked submission `req`, live as `id`, at `key` in canonical order, its prompt
    /// hashed by `geo` (here, on the submitting thread: never inside a step).
    pub fn new(geo: &Geometry, req: SubmitRequest, id: StdArc<str>, key: RequestKey) -> NewRequest {
        let hashes = prompt_hashes(geo, &req.prompt);
        NewRequest {
            id,
            prompt: req.prompt.into(),
            max_new_tokens: req.max_new_tokens,
            key,
            submitted_at: Instant::now(),
            load_deadline: req.load_deadline,
            hashes,
            prepared: PreparedPrompt::default(),
        }
    }

    /// The request with what the connector prepared from its prompt.
    pub fn with_prepared(mut self, prepared: PreparedPrompt) -> NewRequest {
        self.prepared = prepared;
        self
    }
}

/// What the engine thread sends a shard between steps.
#[derive(Debug)]
pub enum Command {
    /// A request to admit.
    Submit(Box<NewRequest>),
    /// End a request (once its in-flight load stops, if it is loading).
    Cancel(StdArc<str>),
    /// A sampled token for a request scheduled in the last step.
    Sampled(StdArc<str>),
    /// A sampled token for every request this shard scheduled to sample in the last step:
    /// the engine's samples were the plan's own ids, each once, in plan order
    /// ([`HandedOut::sampled_as_planned`](crate::runtime::discard::HandedOut::sampled_as_planned)).
    /// Applied as a [`Sampled`](Command::Sampled) of each, found by admission sequence, not
    /// by id.
    SampledAll,
    /// `update` told the engine to discard this request's output of the last step (its step
    /// read a block one of the step's sync loads failed to fill): its sample, if one came,
    /// never counts. Every other sample that came, the engine kept.
    Discarded(StdArc<str>),
    /// The engine finished this request (stop token, …).
    Finish(StdArc<str>),
    /// The output of the shard's last step never came back: its scheduled work is re-offered.
    OutputLost,
    /// Preempt this request (by admission sequence) to let a stalled runtime progress.
    Preempt(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Waiting,
    Loading,
    Running,
}

#[derive(Debug)]
pub(super) struct Req {
    pub(super) id: StdArc<str>,
    /// Async-class key; the sync-class key is `key.with_sync(true)`.
    pub(super) key: RequestKey,
    pub(super) prompt: StdArc<[u32]>,
    pub(super) max_new_tokens: u32,
    pub(super) generated: u32,
    /// Per group: chained hashes of the prompt's full blocks.
    pub(super) hashes: Vec<Vec<BlockHash>>,
    /// What the connector prepared at submit, for lookups until the request is admitted.
    pub(super) prepared: DropCaught<Prepared>,
    pub(super) tables: Vec<Vec<BlockId>>,
    pub(super) gens: Vec<Vec<Generation>>,
    /// Per group: entries below this index are registered in the prefix cache (or null).
    pub(super) registered: Vec<usize>,
    pub(super) num_computed_tokens: u64,
    /// Tokens whose bytes are known written in every group: the local prefix at admission, a
    /// landed load, a step whose output was applied. Only entries below it may enter the
    /// prefix cache (`register_and_trim`); a sync load's range joins it only once the step
    /// that carried the load is answered.
    pub(super) written: u64,
    /// Tokens scheduled in the last step (0 when not scheduled).
    pub(super) last_scheduled: u64,
    /// The shard step that last scheduled it (0: none): a request this step has put in its
    /// plan is never preempted by the same step.
    pub(super) scheduled_step: u64,
    /// Computed tokens before the step that last scheduled it.
    pub(super) pre_step: u64,
    /// Its last step's output was lost: roll back to `pre_step`, apply nothing.
    pub(super) output_lost: bool,
    pub(super) phase: Phase,
    /// Blocks this request must not read until their owner recomputes them (mode `safe`).
    pub(super) waits: Vec<BlockId>,
    /// `waits` was set by this step's decision: owners in other shards may not have set their
    /// pending marks yet (no barrier separates deciding from scheduling), so the request is not
    /// scheduled before the next step, whose start orders those marks before its reads.
    pub(super) waits_step: u64,
    /// Blocks this request owns and has not recomputed yet.
    pub(super) owned_pending: Vec<BlockId>,
    /// Mode `vllm` rolled it back to a multiple of `S` (a new hit) without asking whether each
    /// group can resume there: a window or Mamba `align` entry it needs may be the null block
    /// until its blocks are released (`Shard::unbacked_entries` then checks only the groups
    /// that keep every entry).
    pub(super) rounded_down: bool,
    pub(super) attempt: u32,
    /// Admissions so far (a restart admits the request again, from what the prefix cache
    /// holds): `unconfirmed` tells a registration's own admission from a later one.
    pub(super) admissions: u32,
    /// Start of the in-flight load (tokens).
    pub(super) load_start: u64,
    /// End of the in-flight load (tokens).
    pub(super) load_end: u64,
    /// When the in-flight async load was dispatched.
    pub(super) load_dispatched_at: Option<Instant>,
    /// The in-flight async load's deadline, if it has one: a completion the worker finished
    /// past it fails the load, whatever it returned.
    pub(super) load_deadline_at: Option<Instant>,
    /// The in-flight load passed its deadline: treated as failed for all its blocks.
    pub(super) timed_out: bool,
    /// External loads of this request that failed (completion or deadline).
    pub(super) load_failures: u32,
    /// Prefix key of the external range, for quarantine.
    pub(super) prefix_key: Option<u64>,
    /// Where a prefill chunk stops to leave a Mamba `align` state (0: nowhere;
    /// `policy::alignment::branch_point`).
    pub(super) branch: u64,
    /// Per-request load deadline (overrides the settings').
    pub(super) load_deadline: Option<Duration>,
    /// Recovery's cap on the computed length when the in-flight load lands.
    pub(super) load_cap: u64,
    /// The load completed this step: `Some(true)` ok, `Some(false)` failed.
    pub(super) load_done: Option<(bool, Instant)>,
    /// An end decided while a load was in flight; applied when it lands.
    pub(super) end_after_load: Option<EndState>,
    /// A sync load to run in the step that first schedules the request.
    pub(super) sync_job: Option<LoadJob>,
    /// The in-flight async load's cancellation token, fired when the shard stops waiting.
    pub(super) cancel: Option<CancelToken>,
    /// The tables as last handed to the engine; `None` once they changed since.
    pub(super) snapshot: Option<StdArc<[BlockTable]>>,
    pub(super) submitted_at: Instant,
    pub(super) first_scheduled: bool,
    pub(super) sampled_pending: bool,
    /// `update` named it among the outputs to discard ([`Command::Discarded`]).
    pub(super) discard_told: bool,
    pub(super) finish_pending: bool,
    pub(super) skip: bool,
}

impl Req {
    /// The record of a submitted request: waiting, holding no blocks, with the block hashes
    /// its submit computed.
    pub(super) fn new(geo: &Geometry, n: NewRequest) -> Req {
        let groups = geo.groups();
        let hashes = n.hashes;
        Req {
            id: n.id,
            key: n.key,
            prompt: n.prompt,
            max_new_tokens: n.max_new_tokens,
            generated: 0,
            hashes,
            prepared: n.prepared.value,
            tables: vec![Vec::new(); groups.len()],
            gens: vec![Vec::new(); groups.len()],
            registered: vec![0; groups.len()],
            num_computed_tokens: 0,
            written: 0,
            last_scheduled: 0,
            scheduled_step: 0,
            pre_step: 0,
            output_lost: false,
            phase: Phase::Waiting,
            waits: Vec::new(),
            waits_step: 0,
            owned_pending: Vec::new(),
            rounded_down: false,
            attempt: 0,
            admissions: 0,
            load_start: 0,
            load_end: 0,
            load_dispatched_at: None,
            load_deadline_at: None,
            timed_out: false,
            load_failures: 0,
            prefix_key: None,
            branch: 0,
            load_deadline: n.load_deadline,
            load_cap: u64::MAX,
            load_done: None,
            end_after_load: None,
            sync_job: None,
            cancel: None,
            snapshot: None,
            submitted_at: n.submitted_at,
            first_scheduled: false,
            sampled_pending: false,
            discard_told: false,
            finish_pending: false,
            skip: false,
        }
    }

    /// The tables with their generations, shared with the last plan while unchanged.
    pub(super) fn block_tables(&mut self) -> StdArc<[BlockTable]> {
        if let Some(s) = &self.snapshot {
            return StdArc::clone(s);
        }
        let s: StdArc<[BlockTable]> = self
            .tables
            .iter()
            .zip(&self.gens)
            .map(|(t, g)| {
                t.iter()
                    .zip(g)
                    .map(|(&id, &generation)| BlockRef { id, generation })
                    .collect()
            })
            .collect();
        self.snapshot = Some(StdArc::clone(&s));
        s
    }

    /// Whether a worker may still be writing this request's load destinations: the load is in
    /// flight, or it passed its deadline and its blocks are not parked yet. Such a request is
    /// ended only once its load lands (`end_after_load`), never by releasing its blocks now.
    pub(super) fn load_may_be_running(&self) -> bool {
        self.phase == Phase::Loading && (self.load_done.is_none() || self.timed_out)
    }

    /// Whether attempt `attempt` of its asynchronous load is still in flight with nothing
    /// taken from it: what its deadline, when due, fails.
    pub(super) fn awaits_load(&self, attempt: u32) -> bool {
        self.phase == Phase::Loading && self.attempt == attempt && self.load_done.is_none()
    }

    /// Ends the shard's wait for the in-flight load: a cooperative connector stops early.
    pub(super) fn cancel_load(&mut self) {
        if let Some(c) = self.cancel.take() {
            c.cancel();
        }
    }

    /// Ends the shard's wait for the in-flight load and, if no worker has started it, drops
    /// it: `true` when the load is then known never to write its destinations.
    pub(super) fn drop_load(&mut self) -> bool {
        self.cancel.take().is_some_and(|c| c.drop_unstarted())
    }

    pub(super) fn seq_len(&self) -> u64 {
        self.prompt.len() as u64 + u64::from(self.generated)
    }

    /// Whether the step that last scheduled it computes its last token, so that the engine
    /// samples one (`ScheduledRequest::samples`), until that step's output is applied: that
    /// schedule set the computed length it reached, and the length of the sequence changes
    /// only when the output is applied (a preemption clears `last_scheduled`).
    pub(super) fn samples_last_step(&self) -> bool {
        self.phase == Phase::Running
            && self.last_scheduled > 0
            && self.num_computed_tokens == self.seq_len()
    }
    pub(super) fn class(&self) -> Option<RequestClass> {
        match self.phase {
            Phase::Loading => Some(RequestClass::Async),
            Phase::Running => Some(RequestClass::Sync),
            Phase::Waiting => None,
        }
    }
    pub(super) fn view(&self) -> Option<RequestView<'_>> {
        let class = self.class()?;
        Some(RequestView {
            class,
            num_computed_tokens: self.num_computed_tokens,
            num_scheduled_tokens: if class == RequestClass::Sync {
                self.last_scheduled
            } else {
                0
            },
            block_tables: &self.tables,
        })
    }
}
