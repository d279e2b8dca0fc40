//! The runtime's event counters.

/// Counters of a runtime since start. Each shard counts its events of a step into one of
/// these and the runtime sums them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Requests accepted by `submit`.
    pub submitted: u64,
    /// Ended finished.
    pub finished: u64,
    /// Ended failed.
    pub failed: u64,
    /// Ended cancelled.
    pub cancelled: u64,
    /// Loads dispatched (async and sync).
    pub loads_dispatched: u64,
    /// Async loads that completed ok.
    pub loads_ok: u64,
    /// Async loads that completed failed.
    pub loads_failed: u64,
    /// Completions for unknown, ended or superseded loads, ignored.
    pub stale_completions: u64,
    /// Reported blocks whose generation changed (freed and reused) or out of range, ignored.
    pub stale_blocks: u64,
    /// Blocks claimed for recompute.
    pub claims: u64,
    /// Owned blocks handed off because the owner ended first.
    pub handoffs: u64,
    /// Tokens rolled back by recovery.
    pub tokens_recomputed: u64,
    /// Requests preempted for lack of blocks.
    pub preemptions: u64,
    /// Connector panics caught by workers.
    pub connector_panics: u64,
    /// Commands (sampled, finish, cancel) naming no live request, ignored.
    pub unknown_commands: u64,
    /// Async loads that passed their deadline: not done by it, or finished past it whatever
    /// their completion said (counted in `loads_failed` too).
    pub deadlines_expired: u64,
    /// Completions of loads that had passed their deadline (counted in `stale_completions`).
    pub late_completions: u64,
    /// Sampled / finish commands repeated for one request in one step, applied once.
    pub duplicate_commands: u64,
    /// Queued loads whose deadline had passed when a worker took them: handed back unrun.
    pub loads_expired_unrun: u64,
    /// Loads still running when shutdown stopped waiting for them.
    pub loads_abandoned: u64,
    /// Admissions offered no external load because the request's retry budget was spent.
    pub retry_budget_skips: u64,
    /// Admissions offered no external load because the prefix was quarantined.
    pub quarantine_skips: u64,
    /// Admissions whose asynchronous load was not dispatched because the workers' queue had
    /// no room left for it (4,096 jobs no worker had taken, those the step dispatched before
    /// it included: the workers stuck in the connector); the request computes those tokens
    /// instead.
    pub load_queue_skips: u64,
    /// Times a prefix entered quarantine.
    pub prefixes_quarantined: u64,
    /// Steps run.
    pub steps: u64,
    /// Of those, steps run in parallel on the shard threads (the others ran inline on the
    /// engine thread: their work could not pay for the hand-off).
    pub parallel_steps: u64,
    /// Step outputs naming a step other than the latest plan's that carried samples or invalid
    /// blocks, ignored (one of finishes only, or an empty one, ignores nothing and is not
    /// counted; it answers no plan either way).
    pub stale_outputs: u64,
    /// Connector `lookup` calls that panicked (the request was offered nothing; also counted
    /// in `connector_panics`).
    pub lookup_panics: u64,
    /// Plans whose output never came back before the next `schedule` (their work re-offered).
    pub lost_outputs: u64,
    /// Requests of a lost plan that restarted from the prefix cache instead of being offered
    /// the step again: the step carried a sync load that may never have run, or may have
    /// advanced a Mamba state in place.
    pub lost_output_restarts: u64,
    /// Async loads dropped before any worker started them (their deadline passed or their
    /// request ended while they were queued): their blocks were freed at once.
    pub loads_dropped_unstarted: u64,
    /// Requests without a token limit (`max_new_tokens = 0`) finished because one more token
    /// would need more blocks than the pool holds.
    pub length_capped: u64,
    /// Requests preempted in another shard to let a stalled step make progress.
    pub cross_shard_preemptions: u64,
    /// Stalls the runtime could not resolve by preempting: after two steps in a row with live
    /// requests, no load in flight, nothing computed, ended or recovered, no running request
    /// to preempt, and no block parked for a late load. Counted once per such pair: a pool too
    /// small for any waiting request.
    pub no_progress_steps: u64,
    /// The same stalls while blocks are parked for loads past their deadline that a worker
    /// started: they come back when those loads return, so the pool waits for them
    /// (temporary, unless a load never returns; [`Metrics::deadlines_expired`] counts the
    /// loads). Counted once per pair of steps, apart from `no_progress_steps`.
    pub late_load_stalls: u64,
    /// Blocks a load's failure or a step output named that were not the load's own (another
    /// request's, or no sync load's destination in that step): ignored.
    pub foreign_blocks: u64,
    /// Samples for live requests the answered step did not schedule to sample: ignored
    /// (counted by the step that takes them; a sample naming no live request is an
    /// unknown command).
    pub unexpected_samples: u64,
    /// Requests the answered step scheduled to sample whose output left their sample out
    /// (and neither finished them nor was discarded): nothing says their part of the step
    /// ran, so it is taken as lost, as a lost output's (re-offered where it started, or
    /// restarted from the prefix cache).
    pub missing_samples: u64,
    /// Sync loads (run by the engine inside a step) that filled all their blocks.
    pub sync_loads_ok: u64,
    /// Sync loads the engine reported blocks of as failed.
    pub sync_loads_failed: u64,
    /// Prompt tokens a step's chunk gave back to the budget so that it ends on a block end
    /// (a Mamba `align` group's state is real only at a step's end; see
    /// `runtime::policy::alignment`).
    pub aligned_chunk_tokens: u64,
    /// Admissions whose lookup hit the `cost` load policy did not load whole: the tier's
    /// estimate made loading (part of) it slower than recomputing.
    pub cost_declined_requests: u64,
    /// Tokens of those hits recomputed instead of loaded.
    pub cost_declined_tokens: u64,
    /// Of those admissions, the ones that loaded part of their hit (up to where a longer load
    /// would risk more in failures than it saves) rather than none of it.
    pub cost_partial_requests: u64,
    /// Admissions that loaded a hit the estimate would have recomputed, to measure the tier
    /// again (one per `Settings::load_probe_interval` without a measured load).
    pub cost_probes: u64,
}

impl std::ops::AddAssign<&Metrics> for Metrics {
    fn add_assign(&mut self, other: &Metrics) {
        self.submitted += other.submitted;
        self.finished += other.finished;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        self.loads_dispatched += other.loads_dispatched;
        self.loads_ok += other.loads_ok;
        self.loads_failed += other.loads_failed;
        self.stale_completions += other.stale_completions;
        self.stale_blocks += other.stale_blocks;
        self.claims += other.claims;
        self.handoffs += other.handoffs;
        self.tokens_recomputed += other.tokens_recomputed;
        self.preemptions += other.preemptions;
        self.connector_panics += other.connector_panics;
        self.unknown_commands += other.unknown_commands;
        self.deadlines_expired += other.deadlines_expired;
        self.late_completions += other.late_completions;
        self.duplicate_commands += other.duplicate_commands;
        self.loads_expired_unrun += other.loads_expired_unrun;
        self.loads_abandoned += other.loads_abandoned;
        self.retry_budget_skips += other.retry_budget_skips;
        self.quarantine_skips += other.quarantine_skips;
        self.load_queue_skips += other.load_queue_skips;
        self.prefixes_quarantined += other.prefixes_quarantined;
        self.steps += other.steps;
        self.parallel_steps += other.parallel_steps;
        self.stale_outputs += other.stale_outputs;
        self.lookup_panics += other.lookup_panics;
        self.lost_outputs += other.lost_outputs;
        self.lost_output_restarts += other.lost_output_restarts;
        self.loads_dropped_unstarted += other.loads_dropped_unstarted;
        self.length_capped += other.length_capped;
        self.cross_shard_preemptions += other.cross_shard_preemptions;
        self.no_progress_steps += other.no_progress_steps;
        self.late_load_stalls += other.late_load_stalls;
        self.foreign_blocks += other.foreign_blocks;
        self.unexpected_samples += other.unexpected_samples;
        self.missing_samples += other.missing_samples;
        self.sync_loads_ok += other.sync_loads_ok;
        self.sync_loads_failed += other.sync_loads_failed;
        self.aligned_chunk_tokens += other.aligned_chunk_tokens;
        self.cost_declined_requests += other.cost_declined_requests;
        self.cost_declined_tokens += other.cost_declined_tokens;
        self.cost_partial_requests += other.cost_partial_requests;
        self.cost_probes += other.cost_probes;
    }
}
