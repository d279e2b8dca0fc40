//! The reports of several engine processes merged into one, field by field: each report type
//! merges its own fields, so a field added to a report is merged (or the build says where
//! not). `kvsched stress --engines N` prints the merge of its engines' reports as `total`.
//!
//! # Rules
//!
//! * counts are summed (saturating), and so are rates (`*_per_s`) and CPU seconds;
//! * `elapsed_s` and every percentile (`p50` … `max`) are the largest engine's (an upper
//!   bound, not the percentile of the pooled samples); a percentile's `count` is summed;
//! * `timed_out` is any engine's; `invariants.ok` and `reconciled` every engine's, and the
//!   violations are every engine's, prefixed `e{i}: `;
//! * an optional counter (`null` when the engine's store has none) is the sum of the engines
//!   that have it, `null` if none has; `cpu.us_per_finished` is the summed CPU over the
//!   summed finished requests; `kv.store_full_at` the largest; `kv.save_error` the first
//!   engine's that has one, prefixed `e{i}: `.

use super::cpu::CpuReport;
use super::prompt_sources::PromptTokens;
use super::report::{
    EngineEvents, Events, FaultCounts, Invariants, KvCounts, LoadCounts, Percentiles,
    RequestCounts, RunReport,
};
use super::step_cost::StepCost;

/// Sums with saturation.
fn add(a: u64, b: u64) -> u64 {
    a.saturating_add(b)
}

/// `a` and `b` merged by `f`, or whichever is present.
fn either<T>(a: Option<T>, b: Option<T>, f: impl FnOnce(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(f(a, b)),
        (a, b) => a.or(b),
    }
}

impl RequestCounts {
    /// Both counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        RequestCounts {
            submitted: add(self.submitted, o.submitted),
            finished: add(self.finished, o.finished),
            failed: add(self.failed, o.failed),
            cancelled: add(self.cancelled, o.cancelled),
            cancelled_at_shutdown: add(self.cancelled_at_shutdown, o.cancelled_at_shutdown),
        }
    }
}

impl StepCost {
    /// Both runs' times summed; the step CPU per finished request over the `finished`
    /// requests of both.
    pub(super) fn merge(&self, o: &Self, finished: u64) -> Self {
        let sum = |a: Option<f64>, b: Option<f64>| either(a, b, |a, b| a + b);
        let step_cpu_s = sum(self.step_cpu_s, o.step_cpu_s);
        StepCost {
            step_wall_s: self.step_wall_s + o.step_wall_s,
            step_cpu_s,
            step_cpu_us_per_finished: step_cpu_s
                .filter(|_| finished > 0)
                .map(|s| s * 1e6 / finished as f64),
            engine_cpu_s: sum(self.engine_cpu_s, o.engine_cpu_s),
            other_threads_cpu_s: sum(self.other_threads_cpu_s, o.other_threads_cpu_s),
        }
    }
}

impl PromptTokens {
    /// Both counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        PromptTokens {
            requests: add(self.requests, o.requests),
            total: add(self.total, o.total),
            device_hit: add(self.device_hit, o.device_hit),
            tier_hit: add(self.tier_hit, o.tier_hit),
            computed: add(self.computed, o.computed),
            computed_after_failed_load: add(
                self.computed_after_failed_load,
                o.computed_after_failed_load,
            ),
        }
    }
}

impl LoadCounts {
    /// Both counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        LoadCounts {
            ok: add(self.ok, o.ok),
            failed: add(self.failed, o.failed),
            stale: add(self.stale, o.stale),
            dispatched: add(self.dispatched, o.dispatched),
            stale_blocks: add(self.stale_blocks, o.stale_blocks),
            sync_run: add(self.sync_run, o.sync_run),
        }
    }
}

impl Percentiles {
    /// Each percentile the larger, the sample counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        Percentiles {
            p50: self.p50.max(o.p50),
            p90: either(self.p90, o.p90, f64::max),
            p99: self.p99.max(o.p99),
            p999: self.p999.max(o.p999),
            max: self.max.max(o.max),
            count: add(self.count, o.count),
        }
    }
}

impl FaultCounts {
    /// Both counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        FaultCounts {
            deadline: add(self.deadline, o.deadline),
            panic: add(self.panic, o.panic),
            late: add(self.late, o.late),
            duplicate: add(self.duplicate, o.duplicate),
            stale: add(self.stale, o.stale),
            cancel: add(self.cancel, o.cancel),
            corrupt: add(self.corrupt, o.corrupt),
            truncate: add(self.truncate, o.truncate),
            evict: add(self.evict, o.evict),
            slow: add(self.slow, o.slow),
        }
    }
}

impl Events {
    /// Both counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        Events {
            deadlines_expired: add(self.deadlines_expired, o.deadlines_expired),
            late_completions: add(self.late_completions, o.late_completions),
            connector_panics: add(self.connector_panics, o.connector_panics),
            stale_completions: add(self.stale_completions, o.stale_completions),
            stale_blocks: add(self.stale_blocks, o.stale_blocks),
            unknown_commands: add(self.unknown_commands, o.unknown_commands),
            duplicate_commands: add(self.duplicate_commands, o.duplicate_commands),
            loads_expired_unrun: add(self.loads_expired_unrun, o.loads_expired_unrun),
            retry_budget_skips: add(self.retry_budget_skips, o.retry_budget_skips),
            quarantine_skips: add(self.quarantine_skips, o.quarantine_skips),
            load_queue_skips: add(self.load_queue_skips, o.load_queue_skips),
            prefixes_quarantined: add(self.prefixes_quarantined, o.prefixes_quarantined),
            handoffs: add(self.handoffs, o.handoffs),
            foreign_blocks: add(self.foreign_blocks, o.foreign_blocks),
            unexpected_samples: add(self.unexpected_samples, o.unexpected_samples),
            missing_samples: add(self.missing_samples, o.missing_samples),
            lookup_panics: add(self.lookup_panics, o.lookup_panics),
            lost_outputs: add(self.lost_outputs, o.lost_outputs),
            lost_output_restarts: add(self.lost_output_restarts, o.lost_output_restarts),
            loads_dropped_unstarted: add(self.loads_dropped_unstarted, o.loads_dropped_unstarted),
            cross_shard_preemptions: add(self.cross_shard_preemptions, o.cross_shard_preemptions),
            no_progress_steps: add(self.no_progress_steps, o.no_progress_steps),
            late_load_stalls: add(self.late_load_stalls, o.late_load_stalls),
            aligned_chunk_tokens: add(self.aligned_chunk_tokens, o.aligned_chunk_tokens),
            parallel_steps: add(self.parallel_steps, o.parallel_steps),
        }
    }
}

impl EngineEvents {
    /// Both counts summed.
    pub(super) fn merge(&self, o: &Self) -> Self {
        EngineEvents {
            client_cancels: add(self.client_cancels, o.client_cancels),
            client_cancels_skipped: add(self.client_cancels_skipped, o.client_cancels_skipped),
            fault_cancels_after_end: add(self.fault_cancels_after_end, o.fault_cancels_after_end),
            late_cancels_ended: add(self.late_cancels_ended, o.late_cancels_ended),
            arrivals_held_back: add(self.arrivals_held_back, o.arrivals_held_back),
            samples_after_cancel: add(self.samples_after_cancel, o.samples_after_cancel),
            stale_named_in_sync_step: add(
                self.stale_named_in_sync_step,
                o.stale_named_in_sync_step,
            ),
        }
    }
}

impl KvCounts {
    /// Counts and times summed (optional ones over the engines that have them),
    /// `store_full_at` the larger, `save_error` the first one (already prefixed).
    pub(super) fn merge(&self, o: &Self) -> Self {
        let opt = |a: Option<u64>, b: Option<u64>| either(a, b, add);
        KvCounts {
            kv_bytes_loaded: add(self.kv_bytes_loaded, o.kv_bytes_loaded),
            kv_bytes_saved: add(self.kv_bytes_saved, o.kv_bytes_saved),
            kv_bytes_verified: add(self.kv_bytes_verified, o.kv_bytes_verified),
            kv_bytes_written: add(self.kv_bytes_written, o.kv_bytes_written),
            garbage_reads: opt(self.garbage_reads, o.garbage_reads),
            garbage_reads_discarded: opt(self.garbage_reads_discarded, o.garbage_reads_discarded),
            null_reads: opt(self.null_reads, o.null_reads),
            units_read: add(self.units_read, o.units_read),
            units_skipped: add(self.units_skipped, o.units_skipped),
            chunks_loaded: add(self.chunks_loaded, o.chunks_loaded),
            chunks_loaded_from_others: add(
                self.chunks_loaded_from_others,
                o.chunks_loaded_from_others,
            ),
            chunks_saved: add(self.chunks_saved, o.chunks_saved),
            chunks_warmed: add(self.chunks_warmed, o.chunks_warmed),
            warm_ms: self.warm_ms + o.warm_ms,
            checksum_failures: add(self.checksum_failures, o.checksum_failures),
            missing_chunks: add(self.missing_chunks, o.missing_chunks),
            key_mismatches: add(self.key_mismatches, o.key_mismatches),
            mac_failures: add(self.mac_failures, o.mac_failures),
            format_errors: add(self.format_errors, o.format_errors),
            tier_errors: add(self.tier_errors, o.tier_errors),
            saves_dropped: add(self.saves_dropped, o.saves_dropped),
            saves_dropped_at_end: add(self.saves_dropped_at_end, o.saves_dropped_at_end),
            save_errors: add(self.save_errors, o.save_errors),
            saves_failed: add(self.saves_failed, o.saves_failed),
            saves_skipped: add(self.saves_skipped, o.saves_skipped),
            save_pauses: add(self.save_pauses, o.save_pauses),
            save_error: self.save_error.clone().or_else(|| o.save_error.clone()),
            store_full_at: either(self.store_full_at, o.store_full_at, u64::max),
            loads_cancelled: add(self.loads_cancelled, o.loads_cancelled),
            writes_refused: add(self.writes_refused, o.writes_refused),
            transfer_damage: add(self.transfer_damage, o.transfer_damage),
            reconnects: opt(self.reconnects, o.reconnects),
            connect_failures: opt(self.connect_failures, o.connect_failures),
            redis: either(self.redis, o.redis, |a, b| a.merge(&b)),
            load_bandwidth: self.load_bandwidth.merge(
                &o.load_bandwidth,
                add(self.kv_bytes_loaded, o.kv_bytes_loaded),
            ),
        }
    }
}

impl CpuReport {
    /// CPU seconds and CPU per wall second summed; `us_per_finished` left to the caller,
    /// which knows the requests finished.
    pub(super) fn merge(&self, o: &Self) -> Self {
        CpuReport {
            user_s: self.user_s + o.user_s,
            sys_s: self.sys_s + o.sys_s,
            per_wall_s: self.per_wall_s + o.per_wall_s,
            us_per_finished: None,
            engine_thread_s: either(self.engine_thread_s, o.engine_thread_s, |a, b| a + b),
        }
    }
}

impl Invariants {
    /// Held if both held; the violations of both.
    pub(super) fn merge(&self, o: &Self) -> Self {
        Invariants {
            ok: self.ok && o.ok,
            reconciled: self.reconciled && o.reconciled,
            violations: self
                .violations
                .iter()
                .chain(&o.violations)
                .cloned()
                .collect(),
        }
    }

    /// These invariants with every violation prefixed `e{engine}: `.
    fn of_engine(&self, engine: u8) -> Self {
        Invariants {
            violations: self
                .violations
                .iter()
                .map(|v| format!("e{engine}: {v}"))
                .collect(),
            ..self.clone()
        }
    }
}

impl RunReport {
    /// The reports of several engines, each with its engine index, merged by the rules in the
    /// module docs; `None` without reports.
    pub(super) fn merge_engines(reports: &[(u8, &RunReport)]) -> Option<RunReport> {
        let mut it = reports.iter().map(|(i, r)| r.of_engine(*i));
        let first = it.next()?;
        let mut total = it.fold(first, |a, b| a.merge(&b));
        if let Some(cpu) = &mut total.cpu {
            let finished = total.requests.finished;
            cpu.us_per_finished = (finished > 0).then(|| {
                let us = (cpu.user_s + cpu.sys_s) * 1e6 / finished as f64;
                (us * 10.0).round() / 10.0
            });
        }
        Some(total)
    }

    /// This report as engine `engine`'s: its violations and store error prefixed `e{engine}: `.
    fn of_engine(&self, engine: u8) -> RunReport {
        let mut r = self.clone();
        r.invariants = self.invariants.of_engine(engine);
        r.kv.save_error = self
            .kv
            .save_error
            .as_ref()
            .map(|e| format!("e{engine}: {e}"));
        r
    }

    /// Both runs merged field by field (see the module docs).
    fn merge(&self, o: &RunReport) -> RunReport {
        RunReport {
            scheduler: self.scheduler,
            requests: self.requests.merge(&o.requests),
            loads: self.loads.merge(&o.loads),
            tokens_recomputed: add(self.tokens_recomputed, o.tokens_recomputed),
            claims: add(self.claims, o.claims),
            handoffs: add(self.handoffs, o.handoffs),
            preemptions: add(self.preemptions, o.preemptions),
            completions_per_s: self.completions_per_s + o.completions_per_s,
            finished_per_s: self.finished_per_s + o.finished_per_s,
            output_tokens: add(self.output_tokens, o.output_tokens),
            output_tokens_per_s: self.output_tokens_per_s + o.output_tokens_per_s,
            cpu: either(self.cpu.clone(), o.cpu.clone(), |a, b| a.merge(&b)),
            step_overhead_us: self.step_overhead_us.merge(&o.step_overhead_us),
            submit_to_schedule_us: self.submit_to_schedule_us.merge(&o.submit_to_schedule_us),
            step_cpu_us: self.step_cpu_us.merge(&o.step_cpu_us),
            cost: self
                .cost
                .merge(&o.cost, add(self.requests.finished, o.requests.finished)),
            completion_to_runnable_us: self
                .completion_to_runnable_us
                .merge(&o.completion_to_runnable_us),
            steps: add(self.steps, o.steps),
            scheduled: add(self.scheduled, o.scheduled),
            scheduled_per_step: super::run_end::per_step(
                add(self.scheduled, o.scheduled),
                add(self.steps, o.steps),
            ),
            elapsed_s: self.elapsed_s.max(o.elapsed_s),
            timed_out: self.timed_out || o.timed_out,
            faults_injected: self.faults_injected.merge(&o.faults_injected),
            events: self.events.merge(&o.events),
            engine: self.engine.merge(&o.engine),
            kv: self.kv.merge(&o.kv),
            invariants: self.invariants.merge(&o.invariants),
            prompt_tokens: self.prompt_tokens.merge(&o.prompt_tokens),
            load_policy: self.load_policy.merge(&o.load_policy),
            // `--engine model` runs one engine process (`--engines` is refused with it).
            model: self.model.clone().or_else(|| o.model.clone()),
            curves: self.curves.clone(),
            has: self.has,
        }
    }
}
