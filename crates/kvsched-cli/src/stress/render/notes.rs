//! The notes under the human table's sections, where a figure needs one: whether the two
//! schedulers decided alike (and why not), what the throughput, CPU and latency figures
//! measure, and where the event counters came from.

use super::cells::{count, counted};
use super::decisions::decisions_notes;
use crate::stress::config::StressConfig;
use crate::stress::figures::{FigureSection, KV_SECTION};
use crate::stress::figures_prompt::PROMPT_SECTION;
use crate::stress::report::{RunReport, StressReport};
use crate::stress::values::Rate;
use kvsched::rules::recovery::Mode;

/// The notes under a section, where a figure needs one.
pub(super) fn notes(sec: &FigureSection, report: &StressReport) -> Vec<String> {
    let c = &report.config;
    let mut notes = Vec::new();
    match sec.title {
        t if t.starts_with("throughput") => {
            if let Some(t) = &c.trace.trace {
                notes.push(format!(
                    "open loop: requests arrive at the times of trace {}, {}× faster than recorded, whatever the scheduler does, so finished requests/s follows those arrivals unless a scheduler falls behind",
                    crate::stress::store::shown_path(t),
                    c.trace.trace_speed
                ));
                if let Some(note) = behind_note(report) {
                    notes.push(note);
                }
            } else if let Rate::PerSecond(rate) = c.rate {
                notes.push(format!(
                    "open loop: requests arrive at {rate}/s whatever the scheduler does, so finished requests/s follows that rate unless a scheduler falls behind"
                ));
            }
            notes.push("load completions/s counts asynchronous KV loads applied (ok + failed), not requests".to_owned());
            let held = report.run.engine.arrivals_held_back;
            if held > 0 {
                notes.push(format!(
                    "{} waited to arrive while the live requests' prompts held 67,108,864 tokens (the run's memory bound): the arrivals asked for were not all made",
                    super::cells::counted(held, "request", "requests")
                ));
            }
        }
        t if t.starts_with("CPU") => notes.push(
            "user + system time, first step to end of run: the simulated engine (its model wait spins the last 80 µs; idle, it polls every 200 µs) and the scheduler's threads".to_owned(),
        ),
        t if t.starts_with("step overhead") => notes.push(
            "schedule() + update() wall time per step, on the engine thread; the simulated model excluded. It includes every wait for a core the simulator's threads hold, and for the other shards".to_owned(),
        ),
        t if t.starts_with("step CPU") => notes.push(
            "the engine thread's CPU time in the same calls (CLOCK_THREAD_CPUTIME_ID): what the scheduler itself costs there, without the waits. A parallel step's other shards run on their own threads, counted under other threads below".to_owned(),
        ),
        t if t.starts_with("where the time went") => notes.push(
            "the engine thread's CPU split into the scheduler's calls and the simulated engine around them (warming, KV checks and writes, sync loads, the model's spin); other threads: the process's CPU less the engine thread's".to_owned(),
        ),
        t if t.starts_with("submit") => notes.push(submit_note(c)),
        t if t.starts_with("completion") => notes.push(
            "a load completion landing → the step that makes its request runnable".to_owned(),
        ),
        "run" => notes.extend(step_size_note(report)),
        "recovery" => decisions_notes(report, &mut notes),
        KV_SECTION => kv_notes(report, &mut notes),
        PROMPT_SECTION => super::prompt_notes::prompt_notes(report, &mut notes),
        "events" => events_notes(report, &mut notes),
        _ => {}
    }
    notes
}

/// With a baseline in a closed loop: whether the two schedulers' steps were of a size, since
/// each step schedules what is runnable when it starts, and a scheduler whose loop goes round
/// more slowly takes fewer, larger steps — whose percentiles then compare different steps.
fn step_size_note(report: &StressReport) -> Option<String> {
    let base = report.baseline.as_ref()?;
    if !matches!(report.config.rate, Rate::Max) || report.config.lockstep {
        return None;
    }
    let (k, b) = (report.run.scheduled_per_step, base.scheduled_per_step);
    if k <= 0.0 || b <= 0.0 {
        return None;
    }
    let ratio = k / b;
    let sizes = format!("{k:.1} requests a step against the baseline's {b:.1}");
    Some(if (0.95..=1.05).contains(&ratio) {
        format!("closed loop: kvsched's steps scheduled {sizes}, steps of about one size, so the step percentiles below compare like with like")
    } else {
        format!("closed loop: kvsched's steps scheduled {sizes} ({ratio:.2}×): each step schedules what is runnable when it starts, and the scheduler whose loop goes round more slowly takes fewer, larger steps, so the step percentiles below compare steps of different sizes — compare the CPU per finished request, or run --lockstep for the same steps")
    })
}

/// For a trace replay: how long its arrivals took against the run, and when the run lasted
/// well past its last arrival, that the engine fell behind them — which is also why it served
/// less from cache than a prefix cache would (a request arriving while a prefix it shares is
/// still queued or being computed computes it too).
fn behind_note(report: &StressReport) -> Option<String> {
    let c = &report.config;
    let last = c.trace.loaded.as_ref()?.last()?;
    let span = crate::stress::trace::arrival(last, c.trace.trace_speed).as_secs_f64();
    let elapsed = report.run.elapsed_s;
    let behind = if elapsed > 1.5 * span + 1.0 {
        ": the engine fell behind its arrivals, so requests came while the prefixes they share were still queued or being computed, and computed them again — part of what it served less than the reference (a slower --trace-speed, or a faster engine, serves more)"
    } else {
        ""
    };
    Some(format!(
        "the requests arrived over {span:.1} s of replay and the run took {elapsed:.1} s{behind}"
    ))
}

/// The notes under the KV bytes: what verified and garbage mean, where the chunks came from
/// (warming and its cost, or the real store), and in mode `vllm` what the garbage was.
fn kv_notes(report: &StressReport, notes: &mut Vec<String>) {
    let c = &report.config;
    let runs: Vec<&RunReport> = std::iter::once(&report.run)
        .chain(report.baseline.as_ref())
        .collect();
    if c.engine == crate::stress::values::EngineKind::Model {
        notes.push("--engine model: the model's tokens are the check (each kept sample against the same request decoded alone: no prefix cache, no tier, no failure; its section below); the KV bytes are not compared read by read, so the garbage counts are n/a".to_owned());
    } else if c.verify.is_on() {
        notes.push("verified: every read unit (one token's KV in an attention group, one Mamba state) that a step's requests read through their block tables, compared with a reference computed from the request's own tokens; a garbage read differs from it or comes through a null entry. Garbage with the output kept must be 0 in mode safe; garbage with the output discarded was read in a step whose output update() said to drop (a sync load under it failed)".to_owned());
    } else {
        notes.push("--verify off: nothing is read or compared (garbage n/a); loads, computed writes and saves move the same bytes, so the step figures against a --verify on run show what verifying costs".to_owned());
    }
    let r = &report.run;
    if c.store.is_real() {
        notes.push(format!(
            "store {}: not warmed (--hit-ratio is for the sim store); {} and fills with the full prompt blocks the engine computes and saves{}",
            c.store.shown(),
            match c.store {
                crate::stress::store::StoreSpec::Memory => "it starts empty",
                crate::stress::store::StoreSpec::Redis if c.redis_cluster.is_some() => {
                    "kvsched's own cluster, every node emptied (FLUSHALL) before the run"
                }
                crate::stress::store::StoreSpec::Redis => "kvsched's own server, emptied (FLUSHALL) before the run",
                _ => "it starts with what it holds",
            },
            if matches!(c.store, crate::stress::store::StoreSpec::Disk(_)) {
                " (each scheduler in its own subdirectory, kvsched/ and mutex/: a later run on the directory loads what earlier ones saved, counted as saved by an earlier run)"
            } else {
                ""
            }
        ));
    } else if r.kv.chunks_warmed > 0 {
        let per = r.kv.warm_ms * 1000.0 / (r.requests.submitted.max(1) as f64);
        notes.push(format!(
            "warming (--hit-ratio {}): before each submit the engine thread stored the reference chunks of that share of the prompt in the sim store — {} chunks in {:.1} ms, {per:.0} µs per request — between steps, outside schedule() + update(), so never in step overhead",
            c.hit_ratio,
            count(r.kv.chunks_warmed),
            r.kv.warm_ms
        ));
    }
    notes.extend(super::store_notes::sim_unwarmed_note(c, r));
    if !c.store.is_real() && runs.iter().any(|r| r.kv.transfer_damage > 0) {
        notes.push(format!(
            "sim store: --failure-rate {} damaged {} loaded chunks in transfer (a flipped byte each); a damaged chunk fails the chunk's checks (a checksum failure, or a format error when the byte is in the header) and becomes a failed block, never KV",
            c.failure_rate,
            count(r.kv.transfer_damage)
        ));
    }
    let several = runs.len() > 1;
    for r in &runs {
        save_notes(r, several, notes);
        let who = if several {
            format!("{}: ", r.scheduler)
        } else {
            String::new()
        };
        notes.extend(super::store_notes::disk_drop_note(c, r, &who));
        notes.extend(super::store_notes::redis_note(r, &who));
    }
    if c.mode == Mode::Vllm {
        for r in &runs {
            let (Some(g), Some(nulls)) = (r.kv.garbage_reads, r.kv.null_reads) else {
                continue;
            };
            if g > 0 {
                notes.push(format!(
                    "{}: mode vllm read {} in steps whose output was kept; {} of all garbage (kept or discarded) came through a null entry (a rollback point from which a group cannot resume: no Mamba state, a null window entry), the rest differed from the reference (a sharer resumed at its pre-step length over a block its owner is recomputing). Mode safe waits for the owner and rolls back to a point every group can resume from",
                    r.scheduler,
                    counted(g, "garbage unit", "garbage units"),
                    count(nulls)
                ));
            }
        }
    }
}

/// What became of the saves of run `r` that failed: how many chunks and why, the pauses of
/// saving and what they skipped, a disk that filled before its capacity (`several`: name the
/// scheduler).
fn save_notes(r: &RunReport, several: bool, notes: &mut Vec<String>) {
    let k = &r.kv;
    let who = if several {
        format!("{}: ", r.scheduler)
    } else {
        String::new()
    };
    if k.saves_failed > 0 || k.save_errors > 0 {
        notes.push(format!(
            "{who}saves failed {} ({}): chunks the store did not hold after their put failed ({})",
            count(k.saves_failed),
            k.save_error.as_deref().unwrap_or("no error recorded"),
            counted(k.save_errors, "failed put", "failed puts")
        ));
    }
    if k.save_pauses > 0 {
        let b = kvsched::kv::SaveBackoff::default();
        notes.push(format!(
            "{who}saving paused {} after {} failed puts in a row ({} s, doubling up to {} s while they kept failing): {} not tried",
            counted(k.save_pauses, "time", "times"),
            b.after_failed_batches,
            b.pause.as_secs_f64(),
            b.max_pause.as_secs_f64(),
            counted(k.saves_skipped, "chunk", "chunks")
        ));
    }
    if k.saves_dropped_at_end > 0 {
        notes.push(format!(
            "{who}saves dropped at the end: {} still queued 2 s after the run, when the report was taken (the store took them more slowly than the run offered them); counted in saves dropped",
            counted(k.saves_dropped_at_end, "chunk was", "chunks were")
        ));
    }
    if let Some(at) = k.store_full_at {
        notes.push(format!(
            "{who}the disk store's file system filled up before --store-capacity, at {} of chunk files (it counts blocks and directories too): the disk tier kept at most that from then on, evicting its oldest chunks to make room",
            counted(at, "byte", "bytes")
        ));
    }
}

/// The note under submit → first schedule: what the latency includes, for the arrivals run.
fn submit_note(c: &StressConfig) -> String {
    match c.rate {
        Rate::Max if c.live.min(c.requests as usize) > c.max_seqs => format!(
            "closed loop: up to {} requests live at once but at most {} scheduled per step (--max-seqs): mostly queueing behind max_seqs, not scheduler latency",
            count(c.live.min(c.requests as usize) as u64),
            count(c.max_seqs as u64)
        ),
        Rate::Max => "closed loop: from submission; includes the request's asynchronous KV load, if it has one".to_owned(),
        Rate::PerSecond(_) if c.store.is_real() => format!(
            "from the scheduled arrival (no coordinated omission); includes the request's asynchronous KV load from {}, if it has one",
            c.store.shown()
        ),
        Rate::PerSecond(_) => format!(
            "from the scheduled arrival (no coordinated omission); includes the request's asynchronous KV load, if it has one ({}–{} µs)",
            c.load_latency_us.min_us, c.load_latency_us.max_us
        ),
    }
}

/// The notes under the events: where the unknown commands, skipped client cancels and stale
/// blocks came from.
fn events_notes(report: &StressReport, notes: &mut Vec<String>) {
    super::load_policy::load_policy_notes(report, notes);
    let c = &report.config;
    let runs: Vec<&RunReport> = std::iter::once(&report.run)
        .chain(report.baseline.as_ref())
        .collect();
    let unknown = runs.iter().any(|r| r.events.unknown_commands > 0);
    let all_samples = runs
        .iter()
        .all(|r| r.events.unknown_commands == r.engine.samples_after_cancel);
    if unknown && all_samples {
        notes.push("unknown commands: each a sample of a request the client had just cancelled (the cancel reached the scheduler first), ignored as it should be".to_owned());
    } else if unknown {
        notes.extend(runs.iter().filter_map(|r| unknown_commands_note(r)));
    }
    if runs.iter().any(|r| r.engine.client_cancels_skipped > 0) {
        notes.push("client cancels (--cancel-ratio) fall 1–64 steps after submission; one falling after its request ended is not sent".to_owned());
    }
    if runs.iter().any(|r| r.events.stale_blocks > 0) {
        notes.push(if c.fault_rates().stale > 0.0 {
            "stale blocks: blocks a report named at an older generation than the step's sync load handed out (freed and reused since), dropped: the stale fault's named in a step that loaded that block, plus hand-offs and failed blocks whose holders ended first; the fault's other blocks (steps without a sync load of them, ids past the pool) are foreign blocks, dropped too".to_owned()
        } else {
            "stale blocks: hand-offs or failed blocks freed before the report named them (their last holder ended first), dropped as they should be".to_owned()
        });
    }
}

/// What one run's unknown commands were, as far as the engine can tell.
fn unknown_commands_note(r: &RunReport) -> Option<String> {
    let unknown = r.events.unknown_commands;
    if unknown == 0 {
        return None;
    }
    let e = &r.engine;
    let mut parts = Vec::new();
    if e.samples_after_cancel > 0 {
        parts.push(format!(
            "{} of a request the client cancelled just before (the cancel arrived first)",
            counted(e.samples_after_cancel, "sample", "samples")
        ));
    }
    if e.fault_cancels_after_end > 0 {
        parts.push(format!(
            "{} for a request already ended",
            counted(e.fault_cancels_after_end, "cancel fault", "cancel faults")
        ));
    }
    let known = e.samples_after_cancel + e.fault_cancels_after_end;
    if unknown > known {
        parts.push(format!(
            "{} crossing its request's end",
            counted(unknown - known, "other command", "other commands")
        ));
    }
    Some(format!(
        "{}: {} naming no live request, ignored: {}",
        r.scheduler,
        counted(unknown, "unknown command", "unknown commands"),
        parts.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The note of a run where kvsched's steps scheduled `k` requests on average and the
    /// baseline's `b`, with the settings `config`.
    fn note_of(k: f64, b: f64, config: StressConfig) -> Option<String> {
        let run = |s| RunReport {
            scheduled_per_step: s,
            ..RunReport::default()
        };
        let report = StressReport::of(vec![run(k)], vec![run(b)], config).expect("a report");
        step_size_note(&report)
    }

    fn closed() -> StressConfig {
        StressConfig {
            rate: Rate::Max,
            ..StressConfig::default()
        }
    }

    #[test]
    fn steps_of_different_sizes_are_named_with_their_ratio() {
        let note = note_of(160.0, 142.1, closed()).expect("a note");
        assert!(
            note.contains("160.0 requests a step against the baseline's 142.1 (1.13×)"),
            "{note}"
        );
        assert!(note.contains("compare steps of different sizes"), "{note}");
        let level = note_of(146.5, 149.3, closed()).expect("a note");
        assert!(level.contains("steps of about one size"), "{level}");
    }

    #[test]
    fn no_note_without_a_baseline_in_an_open_loop_or_in_lockstep() {
        assert_eq!(note_of(160.0, 142.1, StressConfig::default()), None);
        let lockstep = StressConfig {
            lockstep: true,
            ..closed()
        };
        assert_eq!(note_of(160.0, 142.1, lockstep), None);
        let run = RunReport {
            scheduled_per_step: 160.0,
            ..RunReport::default()
        };
        let alone = StressReport::of(vec![run], Vec::new(), closed()).expect("a report");
        assert_eq!(step_size_note(&alone), None);
    }
}
