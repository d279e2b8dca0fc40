//! The notes under the prompt-token section: each scheduler's split in shares, and on a
//! trace the reference it compares with (what a prefix cache could serve at all, and an LRU
//! cache of the device pool alone and of the pool and the tier together).

use super::cells::count;
use crate::stress::report::{PromptTokens, StressReport};

/// `n` of `total` as a percentage with one decimal.
fn pct(n: u64, total: u64) -> String {
    format!("{:.1}%", n as f64 * 100.0 / total.max(1) as f64)
}

/// The notes under the prompt-token section.
pub(super) fn prompt_notes(report: &StressReport, notes: &mut Vec<String>) {
    let runs = std::iter::once(&report.run).chain(report.baseline.as_ref());
    let several = report.baseline.is_some();
    for r in runs {
        let p: &PromptTokens = &r.prompt_tokens;
        let who = if several {
            format!("{}: ", r.scheduler)
        } else {
            String::new()
        };
        notes.push(format!(
            "{who}of the {} prompt tokens of {} finished requests, the device prefix cache served {}, the tier {} ({}), the engine computed {}, of which {} of all the prompt tokens because a load of them failed (a damaged or missing chunk, a tier error, a passed deadline)",
            count(p.total),
            count(p.requests),
            pct(p.device_hit, p.total),
            pct(p.tier_hit, p.total),
            if report.config.verify == crate::stress::values::Verify::Off {
                "loaded, not verified: --verify off"
            } else {
                "loaded and verified"
            },
            pct(p.computed, p.total),
            pct(p.computed_after_failed_load, p.total),
        ));
        if r.tokens_recomputed != p.computed_after_failed_load && r.tokens_recomputed > 0 {
            notes.push(format!(
                "{who}tokens recomputed ({}) is every token recovery rolled back, each time it did (decode tokens, and those of requests that then failed or were cancelled, included); \"of which after a failed load\" ({}) is the finished requests' prompt tokens the engine computed because their load failed, each once",
                count(r.tokens_recomputed),
                count(p.computed_after_failed_load),
            ));
        }
    }
    let Some(t) = &report.config.trace.trace_reference else {
        return;
    };
    let tier = t
        .tier_blocks_512
        .map_or("an unbounded tier".to_owned(), |b| {
            format!("{} blocks of tier", count(b))
        });
    let served = report.run.prompt_tokens.device_hit + report.run.prompt_tokens.tier_hit;
    let share = served as f64 / report.run.prompt_tokens.total.max(1) as f64;
    notes.push(format!(
        "reference, the trace's {} requests on its 512-token blocks: a prefix cache would serve {:.1}% if unbounded; an LRU cache of the device pool ({} blocks) {:.1}%, of the pool and {tier} {:.1}%. kvsched served {:.1}% from cache here, {:.0}% of the unbounded share",
        count(t.requests),
        t.infinite_cache_share * 100.0,
        count(t.device_pool_blocks_512),
        t.device_pool_lru_share * 100.0,
        t.device_and_tier_lru_share * 100.0,
        share * 100.0,
        share / t.infinite_cache_share.max(1e-9) * 100.0,
    ));
}
