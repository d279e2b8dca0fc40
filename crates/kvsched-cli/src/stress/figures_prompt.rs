//! The figures of where the finished requests' prompt tokens came from (`prompt_tokens`),
//! and of the run itself (steps, run time), each its own section of the table.

use super::figures::{Format, Row, Section};
use super::report::RunReport;

/// The title of the prompt-token section.
pub(super) const PROMPT_SECTION: &str = "prompt tokens of finished requests, by source";

/// A count as a figure's value.
fn c(n: u64) -> Option<f64> {
    Some(n as f64)
}

fn count(key: &'static str, label: &'static str, value: fn(&RunReport) -> Option<f64>) -> Row {
    Row {
        key,
        label,
        format: Format::Count,
        better: None,
        value,
        needs: None,
    }
}

/// Prompt tokens by source: the device prefix cache, the tier, the engine.
pub(super) fn prompt_section() -> Section {
    Section {
        title: PROMPT_SECTION,
        rows: vec![
            count("prompt_tokens.total", "prompt tokens", |r| {
                c(r.prompt_tokens.total)
            }),
            count("prompt_tokens.device_hit", "device prefix cache", |r| {
                c(r.prompt_tokens.device_hit)
            }),
            count("prompt_tokens.tier_hit", "tier (loaded)", |r| {
                c(r.prompt_tokens.tier_hit)
            }),
            count("prompt_tokens.computed", "computed", |r| {
                c(r.prompt_tokens.computed)
            }),
            count(
                "prompt_tokens.computed_after_failed_load",
                "of which after a failed load",
                |r| c(r.prompt_tokens.computed_after_failed_load),
            ),
        ],
    }
}

/// The run: steps, requests scheduled per step and run time (counts of the run, not ranked).
pub(super) fn run_section() -> Section {
    Section {
        title: "run",
        rows: vec![
            count("steps", "steps", |r| c(r.steps)),
            Row {
                key: "scheduled_per_step",
                label: "requests scheduled per step (mean)",
                format: Format::Fixed(1),
                better: None,
                value: |r| Some(r.scheduled_per_step),
                needs: None,
            },
            Row {
                key: "elapsed_s",
                label: "run time (s)",
                format: Format::Fixed(2),
                better: None,
                value: |r| Some(r.elapsed_s),
                needs: None,
            },
        ],
    }
}
