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
    sharers_on(groups, owner_end, n_sharers, policy, (96, 100), 0, "owner")
}

/// Prompts of `len` tokens whose first `shared` (a multiple of every block size) are the same
/// for all: the owner's load. `late` more requests with that prefix are submitted right after
/// the step whose sync load failed, so the first step in mode `safe` admits them (each shard
/// its own: their ids spread them over both). The owner's id is `owner`.
fn sharers_on(
    groups: Vec<CacheGroup>,
    owner_end: OwnerEnd,
    n_sharers: u32,
    policy: Policy,
    (shared, len): (usize, usize),
    late: u32,
    owner: &str,
) -> (Engine, kvsched::Report) {
    let pool = 512;
    let tier = Arc::new(Damaging::armed_later(MemoryTier::new(64 << 20, 4)));
    let mut eng = Engine::new(groups.clone(), pool).with_tier(tier.clone(), 0.0);
    let mut rt = builder(&groups, pool)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    // The seed's last full block ends where the shared prefix does, so the tier holds every
    // group's entries there (a Mamba `align` state only where a step ended).
    eng.submit(&rt, "seed", prompt(0, shared, 1, shared + 4), 1);
    assert!(eng.run_until_idle(&mut rt, Duration::from_secs(10)));
    eng.flush();
    rt.shutdown();

    tier.arm();
    let s = Settings::default().with_mode(Mode::Vllm);
    let mut rt = builder(&groups, pool)
        .shards(2)
        .settings(s)
        .connector(eng.tier_conn.clone().unwrap())
        .build()
        .unwrap();
    eng.submit(&rt, owner, prompt(0, shared, 2, len), 4);
    for i in 0..n_sharers {
        eng.submit(&rt, &format!("sharer{i}"), prompt(0, shared, 3 + i, len), 4);
    }
    let mut switched = false;
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
        let before = eng.tally.garbage_kept.len();
        eng.answer(&mut rt, &plan, out, checks);
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
        if failed_sync && !switched {
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

fn check(groups: Vec<CacheGroup>, owner_end: OwnerEnd) {
    let (eng, r) = sharers(groups, owner_end, 3);
    eng.assert_clean();
    assert!(
        eng.tally.invariant_violations.is_empty(),
        "{owner_end:?}: {:?}",
        eng.tally.invariant_violations
    );
    assert_report_clean(&r, 512);
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
            eng.assert_clean();
            assert!(
                eng.tally.invariant_violations.is_empty(),
                "{:?}",
                eng.tally.invariant_violations
            );
            assert_report_clean(&r, 512);
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
            let (eng, r) = sharers_on(
                groups.clone(),
                e,
                2,
                Policy::Recompute,
                (shared, len),
                0,
                "owner",
            );
            eng.assert_clean();
            assert!(
                eng.tally.invariant_violations.is_empty(),
                "{e:?}: {:?}",
                eng.tally.invariant_violations
            );
            assert_report_clean(&r, 512);
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
            let (eng, r) = sharers_on(
                groups.clone(),
                OwnerEnd::Stays,
                0,
                Policy::Recompute,
                (64, 128),
                6,
                owner,
            );
            eng.assert_clean();
            assert!(
                eng.tally.invariant_violations.is_empty(),
                "{:?}",
                eng.tally.invariant_violations
            );
            assert_report_clean(&r, 512);
            assert_eq!(r.metrics.finished, 7, "{r}");
        }
    }
}
