//! Sharers of a failed block, made on purpose: mode `vllm` caches a sync loader's
//! destinations at admission, so a request admitted after it in the same step shares them;
//! the load fails (the store damages every chunk) and the engine switches to mode `safe`
//! before the recovery. From then on sharers must wait for the owner, take over when it
//! ends first, and never keep an output that read a wrong byte.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use kvsched::kv::MemoryTier;
use kvsched::{CacheGroup, MambaMode, Mode, Policy, Settings};

#[derive(Clone, Copy, Debug)]
enum OwnerEnd {
    Stays,
    Cancelled,
    Finished,
}

fn sharers(
    groups: Vec<CacheGroup>,
    owner_end: OwnerEnd,
    n_sharers: u32,
) -> (Engine, kvsched::Report) {
    sharers_with(groups, owner_end, n_sharers, Policy::Recompute)
}

/// `policy`: the policy switched to with mode `safe`.
fn sharers_with(
    groups: Vec<CacheGroup>,
    owner_end: OwnerEnd,
    n_sharers: u32,
    policy: Policy,
) -> (Engine, kvsched::Report) {
    sharers_on(groups, owner_end, n_sharers, policy, Shape::default())
}

/// What a run of [`sharers_on`] looks like besides its geometry and sharers.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Prompts of `len` tokens whose first `shared` (a multiple of every block size) are the
    /// same for all: the owner's load.
    shared: usize,
    len: usize,
    /// More requests with that prefix submitted right after the switch to mode `safe`, so
    /// the first step in mode `safe` admits them (each shard its own: their ids spread them
    /// over both).
    late: u32,
    /// The owner's id.
    owner: &'static str,
    /// The output of the step whose sync load failed is lost, never passed to `update`.
    lose_failed_step: bool,
    /// Steps in mode `vllm` after the one whose sync load failed, before the switch.
    more_vllm_steps: u32,
    /// The owner is cancelled at the switch.
    cancel_owner_at_switch: bool,
    /// The step's token budget.
    token_budget: u64,
    /// The sharers' prompts share this much with the seed (at least `shared`): they load the
    /// part past `shared` themselves, and are as much longer than `len`.
    sharer_shared: usize,
    /// Shards.
    shards: usize,
    /// Chunks the tier damages once armed (the owner's load is read first).
    damaged: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            shared: 96,
            len: 100,
            late: 0,
            owner: "owner",
            lose_failed_step: false,
            more_vllm_steps: 0,
            cancel_owner_at_switch: false,
            token_budget: 8192,
            sharer_shared: 0,
            shards: 2,
            damaged: u64::MAX,
        }
    }
}

/// Sharers of the owner's failed sync load, made in mode `vllm`, recovered in mode `safe`
/// after a live switch: see [`Shape`].
fn sharers_on(
    groups: Vec<CacheGroup>,
    owner_end: OwnerEnd,
    n_sharers: u32,
    policy: Policy,
    shape: Shape,
) -> (Engine, kvsched::Report) {
    let Shape {
        shared,
        len,
        late,
        owner,
        ..
    } = shape;
    let pool = 512;
    let tier = Arc::new(Damaging::armed_later(MemoryTier::new(64 << 20, 4)));
    let mut eng = Engine::new(groups.clone(), pool).with_tier(tier.clone(), 0.0);
    let mut rt = builder(&groups, pool)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    // The seed's last full block ends where the shared prefix does, so the tier holds every
    // group's entries there (a Mamba `align` state only where a step ended).
    let seeded = shared.max(shape.sharer_shared);
    eng.submit(&rt, "seed", prompt(0, seeded, 1, seeded + 4), 1);
    assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    eng.flush();
    rt.shutdown();

    tier.arm_for(shape.damaged);
    let s = Settings::default().with_mode(Mode::Vllm);
    let mut rt = builder(&groups, pool)
        .shards(shape.shards)
        .token_budget(shape.token_budget)
        .settings(s)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    eng.submit(&rt, owner, prompt(0, shared, 2, len), 4);
    for i in 0..n_sharers {
        let s = shared.max(shape.sharer_shared);
        eng.submit(
            &rt,
            &format!("sharer{i}"),
            prompt(0, s, 3 + i, len + s - shared),
            4,
        );
    }
    let mut switched = false;
    let mut failed_at = None;
    let mut ended_owner = false;
    // The engine sleeps whenever a plan is empty: a hand-off must wake it.
    let dog = Watchdog::start(rt.handle(), Duration::from_secs(5));
    while rt.live() > 0 && !dog.fired() {
        let plan = rt.schedule().unwrap();
        let safe_step = rt.settings().mode == Mode::Safe;
        let (mut out, checks) = eng.run_plan(&plan);
        let checks_dbg =
            |_: &Engine, sr: &kvsched::ScheduledRequest| format!("{:?}", checks[&*sr.id]);
        if switched && !ended_owner && plan.recovery.recovered.len() > 1 {
            ended_owner = true;
            match owner_end {
                OwnerEnd::Stays => {}
                OwnerEnd::Cancelled => rt.cancel(owner),
                OwnerEnd::Finished => out.finished.push(owner.into()),
            }
        }
        if std::env::var("COLD_VERBOSE").is_ok() {
            for rr in &plan.recovery.recovered {
                eprintln!("step {} recovered {} {:?}", plan.step, rr.id, rr.decision);
            }
            for sr in &plan.scheduled {
                let c = &checks_dbg(&eng, sr);
                eprintln!(
                    "step {} safe={safe_step} {} n={} k={} tables={:?} {}",
                    plan.step,
                    sr.id,
                    sr.num_computed_tokens,
                    sr.num_tokens,
                    sr.block_tables
                        .iter()
                        .map(|t| t.iter().map(|b| b.id).collect::<Vec<_>>())
                        .collect::<Vec<_>>(),
                    c
                );
            }
        }
        let failed_sync = !out.invalid_blocks.is_empty();
        if failed_sync && failed_at.is_none() {
            failed_at = Some(plan.step);
        }
        let before = eng.tally.garbage_kept.len();
        if shape.lose_failed_step && failed_at == Some(plan.step) {
            // Lost: the engine never answers the plan (its garbage is mode vllm's).
        } else {
            eng.answer(&mut rt, &plan, out, checks);
        }
        // The runtime's between-step invariants (the test hook docs/runtime.md names).
        for v in rt.check_invariants() {
            eng.tally
                .invariant_violations
                .push(format!("after step {}: {v}", plan.step));
        }
        if !safe_step {
            // Mode vllm keeps what its sharers read (documented): only safe steps count.
            eng.tally.garbage_kept.truncate(before);
        }
        let switch_now =
            failed_at.is_some_and(|f| plan.step >= f + u64::from(shape.more_vllm_steps));
        if switch_now && !switched {
            if shape.cancel_owner_at_switch {
                rt.cancel(owner);
            }
            for i in 0..late {
                eng.submit(&rt, &format!("late{i}"), prompt(0, shared, 30 + i, len), 4);
            }
            rt.update_settings(
                Settings::default()
                    .with_mode(Mode::Safe)
                    .with_policy(policy),
            )
            .unwrap();
            switched = true;
        }
        if plan.scheduled.is_empty() && rt.live() > 0 {
            rt.wait_for_work(Duration::from_secs(3600));
        }
    }
    assert!(
        !dog.fired(),
        "the engine slept past work: {:?}",
        rt.metrics()
    );
    assert!(switched, "no sync load failed");
    assert_eq!(rt.live(), 0, "requests never ended: {:?}", rt.metrics());
    let r = rt.shutdown();
    (eng, r)
}

/// The run kept no wrong byte, broke no between-step invariant and left a clean report;
/// `what` names the case in a failure.
fn clean(eng: &Engine, r: &kvsched::Report, what: &str) {
    eng.assert_clean();
    assert!(
        eng.tally.invariant_violations.is_empty(),
        "{what}: {:?}",
        eng.tally.invariant_violations
    );
    assert_report_clean(r, 512);
}

fn check(groups: Vec<CacheGroup>, owner_end: OwnerEnd) {
    let (eng, r) = sharers(groups, owner_end, 3);
    clean(&eng, &r, &format!("{owner_end:?}"));
    assert!(
        r.metrics.claims > 0,
        "{owner_end:?}: nothing claimed: {:?}",
        r.metrics
    );
    if !matches!(owner_end, OwnerEnd::Stays) {
        assert_eq!(r.metrics.finished + r.metrics.cancelled, 4, "{r}");
    }
}

#[test]
fn sharers_of_a_failed_sync_load_wait_dense() {
    for e in [OwnerEnd::Stays, OwnerEnd::Cancelled, OwnerEnd::Finished] {
        check(vec![CacheGroup::full_attention(16)], e);
    }
}

#[test]
fn sharers_of_a_failed_sync_load_wait_hybrid() {
    for m in [MambaMode::Align, MambaMode::All] {
        for e in [OwnerEnd::Stays, OwnerEnd::Cancelled, OwnerEnd::Finished] {
            check(
                vec![CacheGroup::full_attention(12), CacheGroup::mamba(24, m)],
                e,
            );
        }
    }
}

/// Sliding window: the owner stays or finishes after recomputing, sharers then resume.
#[test]
fn sharers_of_a_failed_sync_load_wait_window_owner_recomputes() {
    for e in [OwnerEnd::Stays, OwnerEnd::Finished] {
        check(
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(16, 20),
            ],
            e,
        );
        check(
            vec![
                CacheGroup::full_attention(12),
                CacheGroup::sliding_window(8, 20),
                CacheGroup::mamba(24, MambaMode::Align),
            ],
            e,
        );
    }
}

/// Switched to mode `safe` with policy `fail`: whoever read the failed block fails, nobody
/// keeps a wrong byte, every request ends.
#[test]
fn sharers_under_policy_fail_end_without_garbage() {
    for g in [
        vec![CacheGroup::full_attention(16)],
        vec![
            CacheGroup::full_attention(12),
            CacheGroup::sliding_window(8, 20),
            CacheGroup::mamba(24, MambaMode::Align),
        ],
    ] {
        for e in [OwnerEnd::Stays, OwnerEnd::Cancelled] {
            let (eng, r) = sharers_with(g.clone(), e, 3, Policy::Fail);
            clean(&eng, &r, "");
            assert!(r.metrics.failed > 0, "{e:?}: nobody failed: {r}");
        }
    }
}

/// The owner is cancelled before recomputing: its blocks are handed off, the first sharer
/// claims them and rolls back to 0. Its sliding-window entries wholly outside the window at
/// its (prefix-hit) admission are the null block: the step that recomputes `[0, 96)` must
/// give each of them a fresh block before the engine writes there (`grow`'s
/// `fill_written_entries`), or the engine writes KV into the null block and reads the
/// chunk's window from it, and the blocks it then confirms are what the other sharers wait
/// for. `Report::violations` would stay empty (the state is gone by shutdown); the
/// between-step `check_invariants` hook flags it: "group 1 entry 0 holds no real block".
/// Pure mode `safe` never has a sharer of a failed block, so it takes a live switch from
/// `vllm`, whose step order made the sharers, to `safe` (the settings the fault matrix
/// switches live).
#[test]
fn handoff_to_a_window_sharer_rolls_back_into_null_entries() {
    let (eng, r) = sharers(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 20),
        ],
        OwnerEnd::Cancelled,
        1,
    );
    assert!(r.metrics.handoffs > 0, "no hand-off: {:?}", r.metrics);
    assert!(
        eng.tally.invariant_violations.is_empty(),
        "between steps: {:?}",
        eng.tally.invariant_violations
    );
    eng.assert_clean();
    assert_report_clean(&r, 512);
}

/// Mamba `align` keeps one state, at a step's end: an owner whose recompute runs past the
/// end of a shared prefix in one chunk never writes the state there (here `[0, 48)` with the
/// sharers' prefix ending at 16). The sharers wait for that state block, so the owner hands
/// it off instead of clearing its mark: the next sharer claims it and recomputes, and none
/// resumes from the unwritten state.
#[test]
fn an_align_owner_recomputing_past_a_shared_state_hands_it_off() {
    for (groups, shared, len) in [
        (
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::mamba(16, MambaMode::Align),
            ],
            16,
            56,
        ),
        (
            vec![
                CacheGroup::full_attention(8),
                CacheGroup::sliding_window(8, 1),
                CacheGroup::mamba(16, MambaMode::Align),
            ],
            32,
            72,
        ),
    ] {
        for e in [OwnerEnd::Stays, OwnerEnd::Cancelled, OwnerEnd::Finished] {
            let shape = Shape {
                shared,
                len,
                ..Shape::default()
            };
            let (eng, r) = sharers_on(groups.clone(), e, 2, Policy::Recompute, shape);
            clean(&eng, &r, &format!("{e:?}"));
            assert!(
                r.metrics.claims > 0,
                "{e:?}: nothing claimed: {:?}",
                r.metrics
            );
        }
    }
}

/// Requests submitted after the step whose sync load failed are admitted by the first step
/// in mode `safe`. Mode `vllm` put the load's destinations in the prefix cache at admission:
/// a shard admitting before the owner's shard has decided its recovery must not find them
/// there, or the request reads the failed blocks unscanned and keeps what it computed. (Shards
/// decide in order, so only a request on a shard before the owner's can meet them: the two
/// owner ids put the owner on each shard.)
#[test]
fn requests_admitted_in_the_recovery_step_never_hit_a_reported_block() {
    for groups in [
        vec![CacheGroup::full_attention(16)],
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(16, MambaMode::Align),
        ],
    ] {
        for owner in ["owner", "o1"] {
            let shape = Shape {
                shared: 64,
                len: 128,
                late: 6,
                owner,
                ..Shape::default()
            };
            let (eng, r) = sharers_on(groups.clone(), OwnerEnd::Stays, 0, Policy::Recompute, shape);
            clean(&eng, &r, "");
            assert_eq!(r.metrics.finished, 7, "{r}");
        }
    }
}

/// What mode `vllm` cached before it was written, and never learnt the fate of, is reported
/// by the first step in mode `safe`:
///
/// * the output of the step that ran the owner's sync load is lost, so no report names its
///   failed destinations: the owner (restarted onto them) and its sharers must not read
///   them, nor must requests admitted after the switch;
/// * mode `vllm`'s recovery leaves the failed destinations cached and the owner, rolled back
///   and recomputing 16 tokens a step, is cancelled before it rewrote them: a request
///   admitted after the switch must not hit them.
#[test]
fn what_mode_vllm_cached_unwritten_is_recovered_at_the_switch() {
    let groups = [
        vec![CacheGroup::full_attention(16)],
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(16, MambaMode::Align),
        ],
    ];
    let lost = Shape {
        shared: 64,
        len: 128,
        late: 3,
        lose_failed_step: true,
        ..Shape::default()
    };
    let left_cached = Shape {
        shared: 64,
        len: 128,
        late: 3,
        more_vllm_steps: 1,
        cancel_owner_at_switch: true,
        token_budget: 16,
        ..Shape::default()
    };
    for g in &groups {
        for (shape, sharers) in [(lost, 0), (lost, 2), (left_cached, 0)] {
            let (eng, r) = sharers_on(
                g.clone(),
                OwnerEnd::Stays,
                sharers,
                Policy::Recompute,
                shape,
            );
            clean(&eng, &r, &format!("{shape:?}"));
        }
    }
}

/// A request decided again while it waits keeps the waits its new computed length still
/// reads. Two shards, 16 tokens a step each. The sharer hits the owner's failed destinations
/// `[0, 64)` and loads `[64, 96)` itself, which lands; its step is discarded (it read the
/// failed blocks), so that load's blocks are not known written, and the first step after the
/// one that made it wait reports them: the sharer owns them and rolls back to 64. The owner,
/// recomputing 16 tokens a step, has not rewritten `[16, 64)` by then: the sharer must go on
/// waiting for it.
#[test]
fn a_sharer_decided_again_keeps_waiting_for_what_it_still_reads() {
    let shape = Shape {
        shared: 64,
        len: 72,
        sharer_shared: 96,
        damaged: 4,
        token_budget: 32,
        // On the shard other than the sharer's, so each has its 16 tokens a step.
        owner: "o1",
        ..Shape::default()
    };
    let (eng, r) = sharers_on(
        vec![CacheGroup::full_attention(16)],
        OwnerEnd::Stays,
        1,
        Policy::Recompute,
        shape,
    );
    clean(&eng, &r, "");
}
