//! The note under the events on the load policy: the simulated engine's time to first token
//! and, under `--load-policy cost`, which hits were recomputed instead of loaded and why (the
//! tier's estimate against the engine's compute rate).

use super::cells::count;
use crate::stress::report::{RunReport, StressReport};
use kvsched::runtime::LoadPolicy;

/// The load-policy lines of `report`, one per scheduler run.
pub(super) fn load_policy_notes(report: &StressReport, notes: &mut Vec<String>) {
    let c = &report.config;
    let rate = c.load.compute_rate(c);
    for r in std::iter::once(&report.run).chain(report.baseline.as_ref()) {
        notes.push(load_policy_line(r, c.load.load_policy, rate));
    }
}

/// One run's line.
fn load_policy_line(r: &RunReport, policy: LoadPolicy, rate: f64) -> String {
    let lp = &r.load_policy;
    let ttft = lp
        .time_to_first_token_us
        .as_ref()
        .map_or(String::new(), |t| {
            format!(
                ", time to first token: median {:.2} ms, 99th percentile {:.2} ms",
                t.p50 / 1e3,
                t.p99 / 1e3
            )
        });
    let failed = if lp.estimate_failure > 0.0 {
        format!(
            ", failed loads taking {:.1} ms",
            lp.estimate_failed_us / 1e3
        )
    } else {
        String::new()
    };
    let settled = r.loads.ok + r.loads.failed;
    let estimate = format!(
        "the tier's estimate at the end, what the load-or-recompute rule decides by (moving averages over the last loads: about 8 for the time, 16 for failures; a load's time is split into latency + per-token time, all of it per-token when load sizes barely vary): {} loads measured, {:.1} µs + {:.1} ns/token a load that lands, failure share of the last loads {:.1}% (over the whole run: {:.1}% of {} asynchronous loads failed), of {} tokens on average{failed}",
        count(lp.estimate_samples),
        lp.estimate_latency_us,
        lp.estimate_ns_per_token,
        lp.estimate_failure * 100.0,
        r.loads.failed as f64 * 100.0 / settled.max(1) as f64,
        count(settled),
        count(lp.estimate_mean_tokens.round() as u64)
    );
    let what = match policy {
        LoadPolicy::Cost if lp.declined_requests > 0 => format!(
            "{} hits not loaded whole ({} tokens recomputed instead; {} of them loaded their head, where a longer load risked more in failures than it saved): loading them would have taken longer than recomputing at {} tokens/s, with the requests waiting behind ({} probes loaded anyway to measure the tier again)",
            count(lp.declined_requests),
            count(lp.declined_tokens),
            count(lp.partial_requests),
            count(rate.round() as u64),
            count(lp.probes)
        ),
        LoadPolicy::Cost => format!(
            "every hit loaded: no load cost more than recomputing at {} tokens/s",
            count(rate.round() as u64)
        ),
        LoadPolicy::Never => format!(
            "{} hits ({} tokens) recomputed, none loaded",
            count(lp.declined_requests),
            count(lp.declined_tokens)
        ),
        _ => "every hit loaded".to_owned(),
    };
    format!(
        "{}: load policy {} — {what}; {estimate}{ttft}",
        r.scheduler,
        policy.name()
    )
}
