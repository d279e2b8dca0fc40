//! The `cost` load policy writes a tier off only until its next probe: a tier whose first
//! load failed (measured failing every load) is asked again once `load_probe_interval` has
//! passed without a measured load, with at least one resume unit — a probe of what the
//! estimate asks for, one token, rounds down to nothing and would measure nothing — and
//! once the probe lands the tier is loaded again.
//!
//! With a Mamba `align` group a tier holds the group's state only where a step ended, and a
//! lookup vouches only for its offer's end: a probe (or a head) ending anywhere else finds no
//! state and fails, so there the probe loads the whole hit (plant `align-head-load`: a tier
//! written off stays written off).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::{CacheGroup, LoadPolicy, MambaMode, Runtime, Settings, StepOutput, SubmitRequest};

/// Offers every prompt but its last 65 tokens (640 of 705) as an async load; the first load
/// fails, every later one lands — with `state_at_end_only`, only a load ending at the offer's
/// end (where a Mamba `align` state is stored).
struct FirstLoadFails {
    loads: AtomicU64,
    state_at_end_only: bool,
}

impl KvConnector for FirstLoadFails {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        LookupResult {
            external_tokens: (q.prompt.len() as u64)
                .saturating_sub(65)
                .saturating_sub(q.local_tokens),
            load_async: true,
        }
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        let first = self.loads.fetch_add(1, Ordering::SeqCst) == 0;
        if first || (self.state_at_end_only && job.end_tokens != 640) {
            LoadResult::all_failed(job)
        } else {
            LoadResult::Ok
        }
    }
}

#[test]
fn a_tier_written_off_after_one_failure_is_probed_and_loaded_again() {
    probed_and_loaded_again(vec![CacheGroup::full_attention(16)], false);
}

#[test]
fn with_a_mamba_align_group_the_probe_loads_the_whole_hit() {
    probed_and_loaded_again(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(64, MambaMode::Align),
        ],
        true,
    );
}

fn probed_and_loaded_again(groups: Vec<CacheGroup>, state_at_end_only: bool) {
    let conn = Arc::new(FirstLoadFails {
        loads: AtomicU64::new(0),
        state_at_end_only,
    });
    let mut rt = Runtime::builder()
        .groups(groups)
        .pool_blocks(4096)
        .shards(1)
        .workers(1)
        .settings(
            Settings::default()
                .with_load_policy(LoadPolicy::Cost)
                // Recomputing is slow (1,000 tokens a second): a tier that lands its loads
                // pays for them many times over.
                .with_compute_rate(Some(1_000.0))
                .with_load_probe_interval(Duration::from_millis(5)),
        )
        .connector(conn.clone())
        .build()
        .expect("runtime");
    let mut out = StepOutput::default();
    let mut next = 0u32;
    let t0 = Instant::now();
    // Distinct prompts of 11 blocks of 64 and a token, at most 8 live, arriving until the tier has
    // been probed and has landed 10 loads, or for 30 s (a machine so loaded that the failed
    // load lands late delays the probe, not the verdict). The second arrives only once the
    // first request's load has failed: a request admitted before that failure is measured
    // would load from a tier not yet measured at all, and loads landing beside the one
    // failure would keep the tier from being written off, so there would be nothing to probe.
    let arriving = |m: &kvsched::Metrics, next: u32| {
        (next == 0 || m.loads_failed >= 1)
            && !(m.cost_probes >= 1 && m.loads_ok >= 10)
            && t0.elapsed() < Duration::from_secs(30)
    };
    loop {
        let open = arriving(&rt.metrics(), next);
        if !open && rt.live() == 0 {
            break;
        }
        if open && rt.live() < 8 {
            let prompt = (0..705).map(|t| next * 1000 + t).collect();
            rt.submit(SubmitRequest {
                id: format!("p{next}"),
                prompt,
                max_new_tokens: 1,
                priority: 0,
                load_deadline: None,
            })
            .expect("submit");
            next += 1;
        }
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        out = StepOutput::for_plan(&plan);
        out.sampled.extend(
            plan.scheduled
                .iter()
                .filter(|s| s.samples)
                .map(|s| s.id.clone()),
        );
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(1));
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "the run hung");
    }
    let m = rt.shutdown().metrics;
    assert!(m.loads_failed >= 1, "{m:?}");
    assert!(m.cost_probes >= 1, "no probe after the failure: {m:?}");
    assert!(
        m.loads_ok >= 10,
        "the tier was not loaded again after one failed load: {m:?}"
    );
}
