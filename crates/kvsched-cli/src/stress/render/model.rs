//! The model's section of the human report (`--engine model`): what the judge checked and
//! found, what recovery cost (tokens rolled back, time to first token) and the model's share
//! of the run, per scheduler (with `--repeat`, the judge's counts summed over the runs, the
//! other figures the median run's).

use std::fmt::Write;

use super::cells::count;
use super::table::wrap;
use crate::stress::report::{RunReport, StressReport};

/// The section, after the table; nothing for the simulated engine.
pub(super) fn model(report: &StressReport, o: &mut String) {
    let runs = std::iter::once(&report.run).chain(report.baseline.as_ref());
    let mut title = false;
    for r in runs {
        let Some(m) = &r.model else {
            continue;
        };
        if !std::mem::replace(&mut title, true) {
            let runs = report.runs.len();
            let _ = writeln!(
                o,
                "\nmodel (every kept token and every value read judged against its request decoded alone{})",
                if runs > 1 {
                    format!("; judge counts summed over the {runs} runs, the rest the median run's")
                } else {
                    String::new()
                }
            );
        }
        let ms = |us: f64| format!("{:.1} ms", us / 1e3);
        let lines = [
            format!(
                "tokens checked {}, wrong tokens {}, wrong logits {}, requests affected {}, wrong reads {}, unreadable reads {}, requests scheduled past their tokens {}",
                count(m.tokens_checked),
                count(m.token_mismatches),
                count(m.logit_mismatches),
                count(m.requests_affected),
                count(m.read_mismatches),
                count(m.unreadable_reads),
                count(m.scheduled_past_tokens)
            ),
            format!(
                "tokens rolled back by recovery {} (to recompute, unless the request then failed or was cancelled), sync loads {} ({} failed), time to first token p50 {}, p99 {} ({} requests)",
                count(r.tokens_recomputed),
                count(m.sync_loads),
                count(m.sync_loads_failed),
                ms(m.time_to_first_token_us.p50),
                ms(m.time_to_first_token_us.p99),
                count(m.time_to_first_token_us.count)
            ),
            format!(
                "model {:.3} s ({:.1} % of the run, {} tokens computed, {} tokens/s), judge {:.3} s",
                m.model_s,
                m.model_share * 100.0,
                count(m.tokens_computed),
                count(m.tokens_per_s as u64),
                m.judge_s
            ),
        ];
        let _ = writeln!(o, "  {}:", r.scheduler);
        for line in lines {
            wrap(&line, "    ", "      ", o);
        }
        causes(m, o);
        verdict(r, report, o);
    }
}

/// What the mismatches mean in the run's mode.
fn verdict(r: &RunReport, report: &StressReport, o: &mut String) {
    let Some(m) = &r.model else {
        return;
    };
    let text = match (report.config.mode, m.logit_mismatches + m.read_mismatches) {
        // Every request failed or was cancelled before its first token: nothing was judged.
        (_, 0) if m.tokens_checked == 0 => {
            "nothing judged: no request kept a token (every one failed or was cancelled), so \
             exactness says nothing about this run"
        }
        (_, 0) if m.token_mismatches == 0 => "token-exact: every kept token and logit, and every value read, equals the request decoded alone",
        (kvsched::rules::recovery::Mode::Safe, _) => {
            "wrong outputs in mode safe: an invariant violation"
        }
        _ => "wrong outputs in mode vllm: vLLM's caching, sync-load destinations cached before the load has run and rolled-back blocks kept (docs/model.md)",
    };
    wrap(text, "    ", "      ", o);
}

/// Which vLLM behaviour the wrong tokens come from (nothing when there are none).
fn causes(m: &crate::stress::model::ModelReport, o: &mut String) {
    if m.token_mismatches == 0 {
        return;
    }
    let c = &m.wrong_tokens_by_cause;
    let line = format!(
        "wrong tokens by cause: {} from requests that held a sync load's blocks when it failed and read them before they were rewritten (vLLM #49250), {} from hits on rolled-back blocks the prefix cache kept, {} from reads of nothing a failed load left",
        count(c.sharers_read_failed_load),
        count(c.rolled_back_blocks_cached),
        count(c.unattributed)
    );
    wrap(&line, "    ", "      ", o);
}
