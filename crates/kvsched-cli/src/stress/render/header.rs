//! The lines above the human table: the settings of the run (and its faults), and the legend
//! of the cells and the ratio column.

use std::fmt::Write as _;

use super::table::{wrap, WRAP};
use crate::stress::config::StressConfig;
use crate::stress::faults::FAULT_NAMES;
use crate::stress::report::StressReport;
use crate::stress::values::{show_size, EngineKind, Rate};
use kvsched::rules::geometry::GroupKind;
use kvsched::rules::recovery::{Mode, Policy};

/// The settings line, and the faults line with `--faults`.
pub(super) fn settings(c: &StressConfig, o: &mut String) {
    let failure = if c.store.is_real() {
        String::new()
    } else {
        format!(" · failure rate {} per chunk", c.failure_rate)
    };
    let rate = match (&c.trace.trace, c.rate) {
        (Some(t), _) => format!(
            "trace {} replayed {}× faster than recorded (open loop)",
            crate::stress::store::shown_path(t),
            c.trace.trace_speed
        ),
        (None, Rate::Max) => format!("rate max (closed loop, {} live)", c.live),
        (None, r) => format!("rate {r} (open loop)"),
    };
    let mut phrases = vec![
        format!("kvsched stress: {}", c.groups.name()),
        format!("{} shards", c.shards),
        format!("{} workers", c.workers),
        rate,
        requests(c.requests),
        format!(
            "mode {}",
            match c.mode {
                Mode::Safe => "safe",
                Mode::Vllm => "vllm",
            }
        ),
        format!(
            "policy {}",
            match c.policy {
                Policy::Recompute => "recompute",
                Policy::Fail => "fail",
            }
        ),
    ];
    if !failure.is_empty() {
        phrases.push(failure.trim_start_matches(" · ").to_owned());
    }
    phrases.push(format!("seed {}", c.seed));
    if cfg!(debug_assertions) {
        // A newcomer's `cargo run` is a debug build: its steps are tens of times slower.
        phrases.push("debug build (timings are not the scheduler's: build with --release)".into());
    }
    wrap_phrases(&phrases, o);
    wrap(&what_runs(c), "", "  ", o);
    if let Some(r) = &c.trace.trace_reference {
        let cut = c
            .trace
            .cut_by_duration
            .map(|cut| {
                let within = if c.trace.duration_followed {
                    // No `--duration`: the replay was cut at the longest one.
                    format!("the longest replay, {} s", c.duration_s)
                } else {
                    format!("--duration {} s", c.duration_s)
                };
                format!(
                    " (of the first {}, those arriving within {within})",
                    super::cells::count(cut.asked),
                )
            })
            .unwrap_or_default();
        let line = format!(
            "trace: {}{cut}, {} prompt tokens; a prefix cache could serve {:.1}% of them \
             if unbounded, {:.1}% as an LRU cache the size of the device pool ({} blocks of 512)",
            requests(r.requests),
            super::cells::count(r.prompt_tokens),
            r.infinite_cache_share * 100.0,
            r.device_pool_lru_share * 100.0,
            super::cells::count(r.device_pool_blocks_512)
        );
        wrap(&line, "", "  ", o);
    }
    let capacity = if c.store.is_redis() {
        c.redis_maxmemory
            .map(|m| format!(" (maxmemory {})", show_size(m)))
            .unwrap_or_default()
    } else {
        format!(" ({})", show_size(c.store_capacity))
    };
    let cluster = c
        .redis_cluster
        .map(|n| format!(", a cluster of {n} nodes"))
        .unwrap_or_default();
    let warm = if c.store.is_real() || c.trace.trace.is_some() {
        String::new()
    } else if c.hit_ratio == 0.0 {
        ", not warmed: it holds what the run saves".to_owned()
    } else {
        format!(", warmed to --hit-ratio {}", c.hit_ratio)
    };
    let has_mamba = c
        .groups
        .groups()
        .iter()
        .any(|g| matches!(g.kind, GroupKind::Mamba { .. }));
    let mamba = if has_mamba {
        format!(", {} B per Mamba state", c.mamba_state_bytes)
    } else {
        String::new()
    };
    // The model engine's KV is the model's own, judged by the model's tokens: the simulated
    // engine's byte sizes and its checker do not apply.
    let kv = if c.engine == EngineKind::Model {
        "the model's own K, V and states, judged by its tokens (--kv-bytes-per-token, \
         --mamba-state-bytes and --verify do not apply)"
            .to_owned()
    } else {
        format!(
            "{} B per token per attention group{mamba} · verify {}",
            c.kv_bytes_per_token,
            if c.verify.is_on() { "on" } else { "off" }
        )
    };
    wrap(
        &format!(
            "KV bytes: store {}{capacity}{cluster}{warm} · {kv}",
            c.store.shown()
        ),
        "",
        "  ",
        o,
    );
    if let Some(f) = &c.faults {
        let list: Vec<String> = FAULT_NAMES
            .iter()
            .zip(f.rates())
            .filter(|(_, r)| *r > 0.0)
            .map(|(n, r)| format!("{n}={r}"))
            .collect();
        let _ = writeln!(
            o,
            "faults: {} · load deadline {}",
            if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(",")
            },
            c.load_deadline_ms
                .map_or("none".to_owned(), |ms| format!("{ms} ms"))
        );
    }
}

/// Writes `phrases` joined by ` · `, wrapped at [`WRAP`] columns between phrases only (a
/// phrase longer than a line is wrapped at its spaces), the lines after the first indented.
fn wrap_phrases(phrases: &[String], o: &mut String) {
    let mut line = String::new();
    for p in phrases {
        let joined = if line.is_empty() {
            p.clone()
        } else {
            format!("{line} · {p}")
        };
        if joined.chars().count() <= WRAP || line.trim().is_empty() {
            line = joined;
        } else {
            wrap(&line, "", "  ", o);
            line = format!("  {p}");
        }
    }
    if !line.trim().is_empty() {
        wrap(&line, "", "  ", o);
    }
}

/// What the cells and the ratio column mean.
pub(super) fn legend(report: &StressReport, o: &mut String) {
    let n = report.runs.len();
    if n > 1 {
        wrap(
            &format!(
                "{n} runs of each scheduler, interleaved: each cell is the median [min–max] of the runs{}",
                if report.baseline.is_some() {
                    ", each ratio the median [min–max] of the ratios of run i of each"
                } else {
                    ""
                }
            ),
            "",
            "",
            o,
        );
    }
    if let Some(b) = &report.baseline {
        wrap(
            &format!(
                "ratio > 1: kvsched better, < 1: {0} better (kvsched ÷ {0} where higher is better, {0} ÷ kvsched where lower is); counts are not ranked",
                b.scheduler
            ),
            "",
            "",
            o,
        );
    }
}

/// "1 request", "2,000 requests".
fn requests(n: u64) -> String {
    let noun = if n == 1 { "request" } else { "requests" };
    format!("{} {noun}", super::cells::count(n))
}

/// One sentence for a reader new to the report: what drove the scheduler, and the failures
/// the run put in its way.
fn what_runs(c: &StressConfig) -> String {
    let engine = match c.engine {
        EngineKind::Sim => {
            "a simulated engine (no model: its steps take a set time, every KV read is checked against a reference)"
        }
        EngineKind::Model => {
            "a tiny real model (every kept token judged against its request decoded alone)"
        }
    };
    let mut faults = Vec::new();
    if !c.store.is_real() && c.failure_rate > 0.0 {
        faults.push("store chunks damaged in transfer (--failure-rate)");
    }
    if c.cancel_ratio > 0.0 {
        faults.push("client cancels (--cancel-ratio)");
    }
    if c.faults.is_some() {
        faults.push("the --faults below");
    }
    let faults = if faults.is_empty() {
        "with no failures put in its way".to_owned()
    } else {
        format!("with failures put in its way: {}", faults.join(", "))
    };
    let who = if c.baseline.is_some() {
        "the kvsched scheduler and the baseline"
    } else {
        "the kvsched scheduler"
    };
    format!(
        "what this is: {engine} drives {who}, {faults}; the report counts what the scheduler did and whether its invariants held"
    )
}
