//! The scenario format of `kvsched replay` (`docs/replay.md#scenario-format`): parsing a
//! scenario from JSON into typed inputs, running the sequential recovery engine on it, and
//! rendering the outcome as JSON.
//!
//! Parsing never panics: every bad input is a [`ScenarioError`] naming the field (as a path
//! such as `requests[1].block_tables` or `groups[0].window`) and the problem, on one line.
//!
//! One file per step: `json` reads the text into a tree that keeps duplicate keys and number
//! kinds apart, `fields` extracts typed fields from it with their paths, `parse` builds the
//! [`Scenario`] from them, and `render` prints an [`Outcome`]. This module holds the scenario,
//! its error and the file reading.

use std::ffi::OsStr;
use std::io::Read;
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
#[cfg(test)]
pub use parse::parse_scenario;
pub use parse::parse_scenario_bytes;
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

fn one_line(s: &str) -> String {
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

fn err(field: impl Into<String>, problem: impl Into<String>) -> ScenarioError {
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

/// The default cap on the input's size: 256 MiB (`--max-input-bytes` raises it).
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 256 << 20;

/// Reads a scenario from the file `file`, or from standard input when `file` is `-`, and
/// parses it. At most `max_bytes` are read: a longer input is an error on `input`, found
/// without reading further (a regular file's size is checked before reading). Read failures
/// (a missing file, a directory) are errors on field `FILE`.
pub fn load_scenario(file: &OsStr, max_bytes: u64) -> Result<Scenario, ScenarioError> {
    let bytes = if file == "-" {
        read_bounded(std::io::stdin().lock(), None, max_bytes)
            .map_err(|e| read_error(e, "standard input".to_owned(), max_bytes))?
    } else {
        let what = format!("{file:?}");
        let opened = std::fs::File::open(file).and_then(|f| {
            let meta = f.metadata()?;
            Ok((f, meta.is_file().then_some(meta.len())))
        });
        let (f, size) = opened.map_err(|e| read_error(ReadFailure::Io(e), what.clone(), 0))?;
        read_bounded(f, size, max_bytes).map_err(|e| read_error(e, what, max_bytes))?
    };
    parse_scenario_bytes(bytes)
}

enum ReadFailure {
    Io(std::io::Error),
    TooLarge,
}

fn read_error(e: ReadFailure, what: String, max_bytes: u64) -> ScenarioError {
    match e {
        ReadFailure::Io(e) => err("FILE", format!("cannot read {what}: {e}")),
        ReadFailure::TooLarge => err(
            "input",
            format!(
                "larger than the input limit of {max_bytes} bytes; raise it with \
                 --max-input-bytes"
            ),
        ),
    }
}

/// Reads all of `r`, but never more than `max_bytes + 1` bytes (one more tells that the input
/// is too long). `size` is the input's size when known (a regular file): a larger one fails
/// at once, any other is read into a buffer of exactly that size. An input of unknown size (a
/// pipe, a device) is read in chunks of 1 MiB and joined at the end, so an input cut off at
/// the limit never holds more than the limit.
fn read_bounded(
    mut r: impl Read,
    size: Option<u64>,
    max_bytes: u64,
) -> Result<Vec<u8>, ReadFailure> {
    const CHUNK: usize = 1 << 20;
    let oom = || ReadFailure::Io(std::io::ErrorKind::OutOfMemory.into());
    let limit = usize::try_from(max_bytes.saturating_add(1)).unwrap_or(usize::MAX);
    if size.is_some_and(|n| n > max_bytes) {
        return Err(ReadFailure::TooLarge);
    }
    // Chunks (one buffer of the known size, or 1 MiB ones), each filled before the next.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    let mut first = size.map(|n| usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1));
    while total < limit {
        if chunks.last().is_none_or(|c| c.len() == c.capacity()) {
            let cap = first.take().unwrap_or(CHUNK).min(limit - total);
            let mut c = Vec::new();
            c.try_reserve_exact(cap).map_err(|_| oom())?;
            chunks.push(c);
        }
        let Some(c) = chunks.last_mut() else { break };
        let room = c.capacity() - c.len();
        let n = match (&mut r).take(room as u64).read_to_end(c) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadFailure::Io(e)),
        };
        total += n;
        if c.len() < c.capacity() {
            break; // end of input
        }
    }
    if total as u64 > max_bytes {
        return Err(ReadFailure::TooLarge);
    }
    if chunks.len() <= 1 {
        return Ok(chunks.pop().unwrap_or_default());
    }
    let mut all = Vec::new();
    all.try_reserve_exact(total).map_err(|_| oom())?;
    for c in chunks.drain(..) {
        all.extend_from_slice(&c);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes() {
        let e = ScenarioError::new("x\ny", "bad\nthing");
        assert_eq!(e.to_string(), "x\\ny: bad\\nthing");
    }

    #[test]
    fn bounded_reads() {
        let data = vec![b'x'; 3_000_000];
        let ok = |max| read_bounded(&data[..], None, max).ok().map(|v| v.len());
        assert_eq!(ok(3_000_000), Some(3_000_000));
        assert_eq!(ok(u64::MAX), Some(3_000_000));
        assert_eq!(ok(2_999_999), None);
        assert_eq!(ok(0), None);
        assert!(matches!(
            read_bounded(&data[..], Some(3_000_000), 2_500_000),
            Err(ReadFailure::TooLarge)
        ));
        let v = read_bounded(&data[..], Some(3_000_000), 3_500_000)
            .ok()
            .unwrap();
        assert_eq!(v, data);
        assert!(v.capacity() <= 3_000_001);
        // An endless input stops one byte past the limit.
        assert!(matches!(
            read_bounded(std::io::repeat(0), None, 5 << 20),
            Err(ReadFailure::TooLarge)
        ));
        assert!(read_bounded(&b""[..], None, 10).ok().unwrap().is_empty());
        let exact = vec![b'y'; 2 << 20];
        assert_eq!(
            read_bounded(&exact[..], None, 2 << 20).ok(),
            Some(exact.clone())
        );
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
