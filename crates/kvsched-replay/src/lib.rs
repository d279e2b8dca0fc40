//! The scenario format of `kvsched replay` (`docs/replay.md#scenario-format`): parsing a
//! scenario from JSON into typed inputs, running the sequential recovery engine on it, and
//! rendering the outcome as JSON. The command line (`kvsched replay`) and the Python package
//! (`kvsched.recover`, `bindings/python`) both read and write the format through this crate,
//! so their outputs and error messages are the same bytes.
//!
//! Parsing never panics: every bad input is a [`ScenarioError`] naming the field (as a path
//! such as `requests[1].block_tables` or `groups[0].window`) and the problem, on one line.
//!
//! One file per step: `json` reads the text into a tree that keeps duplicate keys and number
//! kinds apart, `fields` extracts typed fields from it with their paths, `parse` builds the
//! [`Scenario`] from them, and `render` prints an [`Outcome`]. This file holds the scenario
//! and its error; reading a file or standard input is the command line's business.

use std::time::Instant;

use thiserror::Error;

use kvsched::rules::geometry::Geometry;
use kvsched::rules::recovery::trace::RequestTrace;
use kvsched::rules::recovery::{
    recover, recover_explained, InvalidSet, Mode, Outcome, Policy, Request,
};

mod explain;
mod fields;
mod json;
mod parse;
mod render;
mod show;

pub use explain::render_explain_text;
pub use parse::{parse_scenario, parse_scenario_bytes};
pub use render::{render_outcome, render_outcome_explained};

/// Bad input: the field (a path such as `requests[1].block_tables`, `scheduler_block_size`,
/// `scenario` for the document as a whole, `FILE` for the input file) and the problem.
///
/// Displayed as `{field}: {problem}` on one line.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{field}: {problem}")]
pub struct ScenarioError {
    /// Where the problem is.
    pub field: String,
    /// What is wrong there.
    pub problem: String,
}

impl ScenarioError {
    /// An error at `field`; line breaks and other control characters in either part are
    /// escaped so the message stays on one line.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ScenarioError {
            field: one_line(&field.into()),
            problem: one_line(&problem.into()),
        }
    }
}

/// `s` with its line breaks and other control characters escaped (`\n`, `\u{1b}`), so that
/// it stays on one line of a message or report and cannot start a line of its own.
pub fn one_line(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

pub(crate) fn err(field: impl Into<String>, problem: impl Into<String>) -> ScenarioError {
    ScenarioError::new(field, problem)
}

/// A parsed, validated scenario: the geometry, the rule set, the requests and the report.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Cache groups, scheduler block size and null block.
    pub geometry: Geometry,
    /// Rule set (default [`Mode::Safe`]).
    pub mode: Mode,
    /// Policy (default [`Policy::Recompute`]).
    pub policy: Policy,
    /// The requests, in input order (canonical order within each class).
    pub requests: Vec<Request>,
    /// The report, ready for the scan (union of the flat and group-qualified parts).
    pub invalid: InvalidSet,
}

impl Scenario {
    /// Applies the recovery rules (`docs/rules.md#mode-vllm` or `docs/rules.md#mode-safe`) with
    /// the sequential engine.
    pub fn run(&self) -> Outcome {
        recover(
            &self.geometry,
            self.mode,
            self.policy,
            &self.requests,
            &self.invalid,
        )
    }

    /// [`Scenario::run`], with the reasons of every decision (one trace per request, input
    /// order), recorded by the rules as they decide.
    pub fn run_explained(&self) -> (Outcome, Vec<RequestTrace<usize>>) {
        recover_explained(
            &self.geometry,
            self.mode,
            self.policy,
            &self.requests,
            &self.invalid,
        )
    }

    /// Runs the recovery `runs` times (at most [`MAX_BENCH_RUNS`]), each on a fresh clone of
    /// the requests and the report (the clone is not timed, only [`recover`] is), and returns
    /// the median time in nanoseconds (the mean of the two middle runs for an even count; 0
    /// when `runs` is 0). Every timing is kept: at most 8 MB.
    pub fn bench_recovery_ns(&self, runs: u64) -> u64 {
        let runs = runs.min(MAX_BENCH_RUNS);
        let mut times: Vec<u64> = Vec::with_capacity(runs as usize);
        for _ in 0..runs {
            let requests = self.requests.clone();
            let invalid = self.invalid.clone();
            let start = Instant::now();
            let outcome = recover(
                std::hint::black_box(&self.geometry),
                std::hint::black_box(self.mode),
                std::hint::black_box(self.policy),
                std::hint::black_box(&requests),
                std::hint::black_box(&invalid),
            );
            let elapsed = start.elapsed();
            std::hint::black_box(outcome);
            times.push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
        }
        times.sort_unstable();
        let n = times.len();
        match n {
            0 => 0,
            _ if n % 2 == 1 => times[n / 2],
            _ => {
                let (a, b) = (times[n / 2 - 1], times[n / 2]);
                a / 2 + b / 2 + (a % 2 + b % 2) / 2
            }
        }
    }
}

/// The most runs `--bench` accepts.
pub const MAX_BENCH_RUNS: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes() {
        let e = ScenarioError::new("x\ny", "bad\nthing");
        assert_eq!(e.to_string(), "x\\ny: bad\\nthing");
    }

    #[test]
    fn median() {
        let s = parse_scenario(
            r#"{"groups":[{"kind":"full_attention","block_size":16}],"requests":[],"invalid_blocks":[]}"#,
        )
        .unwrap();
        assert_eq!(s.bench_recovery_ns(0), 0);
        let _ = s.bench_recovery_ns(4);
    }
}
