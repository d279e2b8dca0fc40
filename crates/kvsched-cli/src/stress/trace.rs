//! Request traces in the Mooncake format (`traces/README.md`): one JSON object a line with
//! `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, the ids of the prompt's
//! 512-token blocks. A replayed prompt's tokens are derived from its block ids, so prompts
//! share prefixes exactly as the trace says; the reference shares say how much of the
//! prompt tokens a prefix cache could serve at all (infinite) and with a given capacity (LRU).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::config::{StressConfig, StressError};
use super::limits::DEFAULT_DURATION_S;
use super::trace_reference::TraceReference;
use super::values::MAX_DURATION_S;

/// The largest trace file read (the bundled trace is 3 MB).
const MAX_TRACE_BYTES: u64 = 256 << 20;

/// `--trace`, `--trace-speed`, `--trace-requests`: replay a request trace instead of the
/// synthetic workload.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct TraceArgs {
    /// Replay this request trace (Mooncake's format, `traces/README.md`: one JSON object a
    /// line with `timestamp` in ms, `input_length`, `output_length`, `hash_ids` of 512-token
    /// blocks): its arrivals, prompt and output lengths, and prompts whose tokens follow the
    /// block ids, so they share prefixes as in the trace. The synthetic workload's flags
    /// (`--requests`, `--rate`, `--live`, `--prompt-tokens`, `--output-tokens`,
    /// `--prefix-share`, `--prefix-burst`, `--prefixes`, `--hit-ratio`) are refused with it;
    /// client cancels (`--cancel-ratio`, `--faults cancel=R`) still apply. Other fields are skipped; one
    /// of the four given twice is refused. Limits: a file (not `-`, standard input) of at most
    /// 256 MiB, lines of at most 1 MiB, prompts of at most 2^24 tokens, 2^22 block ids in the
    /// requests replayed.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Replay the trace X times faster than it was recorded (arrival = timestamp / X), X in
    /// 0.001–1,000,000 (below 1, slower).
    #[arg(long, value_name = "X", default_value_t = 10.0, allow_negative_numbers = true, value_parser = parse_speed)]
    pub trace_speed: f64,
    /// Replay the trace's first N requests (1–1,000,000).
    #[arg(long, value_name = "N", default_value_t = 1000, allow_negative_numbers = true, value_parser = super::values::u64_in::<1, 1_000_000>)]
    pub trace_requests: u64,
    /// The trace once loaded.
    #[arg(skip)]
    #[serde(skip)]
    pub(crate) loaded: Option<Arc<Vec<TraceRequest>>>,
    /// What a prefix cache could serve of the requests replayed (the JSON's
    /// `config.trace_reference`).
    #[arg(skip)]
    pub(crate) trace_reference: Option<TraceReference>,
    /// Set when `--duration` ends the arrivals before the last of `--trace-requests` (the
    /// JSON's `config.trace.cut_by_duration`).
    #[arg(skip)]
    pub(crate) cut_by_duration: Option<TraceCut>,
    /// Set when `--duration` was left out, so that the replay's length follows the trace
    /// ([`follow_trace_duration`]): a replay cut short was cut at the longest duration, not
    /// at a `--duration` given.
    #[arg(skip)]
    #[serde(skip)]
    pub(crate) duration_followed: bool,
}

/// A replay cut short by `--duration`: of the `asked` requests, the first `in_time` arrive
/// within it and are the ones replayed.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub(crate) struct TraceCut {
    pub(crate) asked: u64,
    pub(crate) in_time: u64,
}

impl Default for TraceArgs {
    fn default() -> Self {
        TraceArgs {
            trace: None,
            trace_speed: 10.0,
            trace_requests: 1000,
            loaded: None,
            trace_reference: None,
            cut_by_duration: None,
            duration_followed: false,
        }
    }
}

/// The slowest and fastest replay: at 0.001 a trace's millisecond lasts a second (an hour's
/// trace outlasts the longest run), and every speed in the range prints as a short number.
const SPEEDS: (f64, f64) = (0.001, 1e6);

fn parse_speed(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (SPEEDS.0..=SPEEDS.1).contains(&x) => Ok(x),
        _ => Err(format!("'{s}' is not a speed-up in [0.001, 1000000]")),
    }
}

fn trace_error(problem: String) -> StressError {
    StressError::Config {
        flag: "--trace",
        problem,
    }
}

/// The trace `--trace` names, its first `--trace-requests` requests (`None` without
/// `--trace`).
fn read(cfg: &StressConfig) -> Result<Option<Vec<TraceRequest>>, StressError> {
    let Some(path) = &cfg.trace.trace else {
        return Ok(None);
    };
    if path.as_os_str() == "-" {
        // The trace is read more than once (its length, then the replay) and by every engine
        // of `--engines`: standard input cannot be.
        return Err(trace_error(
            "`-`: standard input is not supported, give a file (one named `-`: ./-)".to_owned(),
        ));
    }
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| trace_error(format!("{shown}: {e}")))?;
    if !meta.is_file() {
        return Err(trace_error(format!("{shown}: not a regular file")));
    }
    if meta.len() > MAX_TRACE_BYTES {
        return Err(trace_error(format!(
            "{shown}: over {MAX_TRACE_BYTES} bytes"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| trace_error(format!("{shown}: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        trace_error(format!("{shown}: line {line}: line: not UTF-8"))
    })?;
    let limit = usize::try_from(cfg.trace.trace_requests).unwrap_or(usize::MAX);
    let reqs = parse(&text, Some(limit)).map_err(|e| trace_error(format!("{shown}: {e}")))?;
    if reqs.is_empty() {
        return Err(trace_error(format!("{shown}: no request in it")));
    }
    Ok(Some(reqs))
}

/// For a command line that replays a trace and leaves out `--duration`: `--duration` becomes
/// the replay's last arrival plus the default (20 s), at most [`MAX_DURATION_S`], so that the
/// default run replays every request `--trace-requests` asks for that arrives within a day of
/// replay and lets the last ones finish. Without `--trace`, or when `--duration` was given,
/// `cfg` is left as it is.
pub fn follow_trace_duration(
    cfg: &mut StressConfig,
    duration_given: bool,
) -> Result<(), StressError> {
    if duration_given {
        return Ok(());
    }
    let Some(reqs) = read(cfg)? else {
        return Ok(());
    };
    cfg.trace.duration_followed = true;
    let last = reqs
        .last()
        .map_or(Duration::ZERO, |r| arrival(r, cfg.trace.trace_speed));
    cfg.duration_s = (last.as_secs_f64() + DEFAULT_DURATION_S).min(MAX_DURATION_S);
    Ok(())
}

/// `cfg` with its trace loaded (when `--trace` names one): the requests to replay are those of
/// the trace's first `--trace-requests` that arrive within `--duration` (all of them unless
/// `--duration` cuts the replay short), and the reference is computed on those.
pub(crate) fn load(cfg: &StressConfig) -> Result<StressConfig, StressError> {
    let Some(reqs) = read(cfg)? else {
        return Ok(cfg.clone());
    };
    let asked = reqs.len() as u64;
    let first_ms = reqs.first().map_or(0, |r| r.arrival_ms);
    let horizon = cfg.duration();
    let reqs: Vec<TraceRequest> = reqs
        .into_iter()
        .take_while(|r| arrival(r, cfg.trace.trace_speed) < horizon)
        .collect();
    if reqs.is_empty() && cfg.trace.duration_followed {
        // Without `--duration` the replay lasts until after its last arrival, at most
        // MAX_DURATION_S: the first request comes after that.
        return Err(trace_error(format!(
            "no request of the trace arrives within the longest replay ({MAX_DURATION_S} s) at \
             --trace-speed {} (its first at {} ms)",
            cfg.trace.trace_speed, first_ms
        )));
    }
    if reqs.is_empty() {
        return Err(StressError::Config {
            flag: "--duration",
            problem: format!(
                "no request of the trace arrives within {} s at --trace-speed {}",
                cfg.duration_s, cfg.trace.trace_speed
            ),
        });
    }
    let in_time = reqs.len() as u64;
    // An engine of `--engines N` replays its share of them: request k goes to engine k mod N,
    // as a load balancer deals a conversation's turns over engines sharing one KV tier.
    let reqs = match (cfg.engines.engine_index, cfg.engines.engine_count) {
        (Some(i), Some(n)) if n > 1 => reqs
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % usize::from(n) == usize::from(i))
            .map(|(_, r)| r)
            .collect(),
        _ => reqs,
    };
    if reqs.is_empty() {
        return Err(trace_error(
            "no request of the trace for this engine".to_owned(),
        ));
    }
    super::trace_fit::check_fits(cfg, &reqs)?;
    let mut out = cfg.clone();
    out.trace.cut_by_duration = (in_time < asked).then_some(TraceCut { asked, in_time });
    out.requests = reqs.len() as u64;
    out.trace.trace_reference = Some(super::trace_reference::reference(cfg, &reqs));
    out.trace.loaded = Some(Arc::new(reqs));
    Ok(out)
}

/// The arrival of trace request `r` from the start of the run, at `speed`.
pub(crate) fn arrival(r: &TraceRequest, speed: f64) -> Duration {
    super::values::saturating_secs(r.arrival_ms as f64 / 1000.0 / speed)
}

/// Tokens in one block of a trace's `hash_ids`.
pub(crate) const TRACE_BLOCK_TOKENS: u64 = 512;

/// The longest trace line read, in bytes (the bundled trace's longest is under 2 KiB).
const MAX_LINE: usize = 1 << 20;

/// The longest prompt accepted, in tokens.
const MAX_PROMPT: u64 = 1 << 24;

/// The most block ids the requests read hold in all: 2^22, 2^31 prompt tokens (the bundled
/// trace's 12,031 requests hold 288,500), so that a trace's reference (a few hash-table
/// entries a block) and its prompts stay within a few hundred MB however the file is made.
const MAX_BLOCK_IDS: u64 = 1 << 22;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TraceRequest {
    /// Its line in the file (from 1).
    pub(crate) line: usize,
    /// Arrival, in milliseconds from the start of the trace.
    pub(crate) arrival_ms: u64,
    /// Prompt tokens.
    pub(crate) input_length: u64,
    /// Tokens generated.
    pub(crate) output_length: u64,
    /// Ids of the prompt's 512-token blocks (the last one may be partial).
    pub(crate) hash_ids: Vec<u64>,
}

/// Why a trace was refused: the line (from 1), the field and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {field}: {problem}")]
pub(crate) struct TraceError {
    pub(crate) line: usize,
    pub(crate) field: &'static str,
    pub(crate) problem: String,
}

fn bad(line: usize, field: &'static str, problem: impl Into<String>) -> TraceError {
    TraceError {
        line,
        field,
        problem: problem.into(),
    }
}

/// The fields a trace line names: a request's four. A line may hold others (a trace with more
/// columns replays as its four say); they are skipped unread. One of the four given twice is
/// refused — a JSON reader would otherwise keep one of the two silently.
const FIELDS: [&str; 4] = ["timestamp", "input_length", "output_length", "hash_ids"];

/// One trace line's object: its [`FIELDS`], each as given, and the first of them given twice.
#[derive(Debug, Default)]
struct Fields {
    values: [Option<Value>; 4],
    repeated: Option<&'static str>,
}

impl Fields {
    /// The value of `field` (one of [`FIELDS`]).
    fn get(&self, field: &str) -> Option<&Value> {
        let i = FIELDS.iter().position(|&f| f == field)?;
        self.values.get(i)?.as_ref()
    }
}

/// Reads a line's [`Fields`], keeping in `reading` the field whose value it is reading, so
/// that a value JSON itself refuses (`1e400`, past what a double holds) is named by its field.
struct ReadFields<'a> {
    reading: &'a std::cell::Cell<Option<&'static str>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for ReadFields<'_> {
    type Value = Fields;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Fields, D::Error> {
        struct Visit<'a>(&'a std::cell::Cell<Option<&'static str>>);
        impl<'de> serde::de::Visitor<'de> for Visit<'_> {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Fields, A::Error> {
                let mut out = Fields::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let Some(i) = FIELDS.iter().position(|&f| f == key) else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        continue;
                    };
                    self.0.set(FIELDS.get(i).copied());
                    let value = map.next_value::<Value>()?;
                    self.0.set(None);
                    match out.values.get_mut(i) {
                        Some(slot @ None) => *slot = Some(value),
                        _ => {
                            out.repeated = out.repeated.or(FIELDS.get(i).copied());
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Visit(self.reading))
    }
}

/// `raw` as a line's [`Fields`], or why not (naming the field whose value JSON refused).
fn read_fields(raw: &str, line: usize) -> Result<Fields, TraceError> {
    use serde::de::DeserializeSeed;
    let reading = std::cell::Cell::new(None);
    let mut de = serde_json::Deserializer::from_str(raw);
    let read = ReadFields { reading: &reading }
        .deserialize(&mut de)
        .and_then(|fields| de.end().map(|()| fields));
    read.map_err(|e| match reading.get() {
        // `1e400`: a number no double holds, far past any count.
        Some(field) if e.to_string().starts_with("number out of range") => bad(
            line,
            field,
            format!(
                "out of range: a number no 64-bit float holds (a count is at most {})",
                u64::MAX
            ),
        ),
        Some(field) => bad(line, field, format!("not JSON: {e}")),
        None if e.is_data() => bad(line, "line", "not a JSON object"),
        None => bad(line, "line", format!("not JSON: {e}")),
    })
}

fn number(obj: &Fields, line: usize, field: &'static str) -> Result<u64, TraceError> {
    match obj.get(field) {
        None => Err(bad(line, field, "missing")),
        Some(v) => whole(v).map_err(|problem| bad(line, field, problem)),
    }
}

/// `v` as a whole number ≥ 0 that fits 64 bits, or why not: a whole number past
/// `u64::MAX` (`1e+23`, which JSON reads as a float) is out of range, not "not whole".
fn whole(v: &Value) -> Result<u64, String> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    match v.as_f64() {
        // 2^64 and above (a whole float below it, `1.0`, is a float, not a count). JSON
        // keeps only a float of it, which would print as `1.8446744073709552e19` for the
        // integer the line holds: the message names the limit, not that float.
        Some(x) if x.is_finite() && x >= 18_446_744_073_709_551_616.0 => Err(format!(
            "out of range: past {}, the largest count",
            u64::MAX
        )),
        // `1e3`, `1000.0`: JSON reads them as floats; a count is written as an integer.
        Some(x) if x >= 0.0 && x.fract() == 0.0 => Err(format!(
            "{v} is written as a float (with a fraction or an exponent); a count is an integer"
        )),
        _ => Err(format!("{v} is not a whole number ≥ 0")),
    }
}

/// The first `limit` requests of a trace (all without one). Blank lines are skipped; every
/// other line must be a request, in non-decreasing arrival order, whose `hash_ids` hold
/// exactly `⌈input_length / 512⌉` ids, at most [`MAX_BLOCK_IDS`] in all.
pub(crate) fn parse(text: &str, limit: Option<usize>) -> Result<Vec<TraceRequest>, TraceError> {
    parse_within(text, limit, MAX_BLOCK_IDS)
}

/// [`parse`] with at most `max_block_ids` block ids in all.
fn parse_within(
    text: &str,
    limit: Option<usize>,
    max_block_ids: u64,
) -> Result<Vec<TraceRequest>, TraceError> {
    if text.starts_with('\u{feff}') {
        return Err(bad(
            1,
            "line",
            "starts with a UTF-8 byte order mark (EF BB BF); save the trace as UTF-8 without one",
        ));
    }
    let mut out = Vec::new();
    let mut last_arrival = 0;
    let mut block_ids = 0u64;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        if raw.trim().is_empty() {
            continue;
        }
        if raw.len() > MAX_LINE {
            return Err(bad(line, "line", format!("over {MAX_LINE} bytes")));
        }
        let obj = read_fields(raw, line)?;
        if let Some(field) = obj.repeated {
            return Err(bad(line, field, "given twice"));
        }
        let arrival_ms = number(&obj, line, "timestamp")?;
        if arrival_ms < last_arrival {
            return Err(bad(
                line,
                "timestamp",
                format!("{arrival_ms} is before the previous line's {last_arrival}"),
            ));
        }
        last_arrival = arrival_ms;
        let input_length = number(&obj, line, "input_length")?;
        if input_length == 0 || input_length > MAX_PROMPT {
            return Err(bad(
                line,
                "input_length",
                format!("{input_length} is not in 1..={MAX_PROMPT}"),
            ));
        }
        let output_length = number(&obj, line, "output_length")?;
        let ids = match obj.get("hash_ids") {
            None => return Err(bad(line, "hash_ids", "missing")),
            Some(Value::Array(a)) => a,
            Some(v) => return Err(bad(line, "hash_ids", format!("{v} is not an array"))),
        };
        let want = input_length.div_ceil(TRACE_BLOCK_TOKENS);
        if ids.len() as u64 != want {
            return Err(bad(
                line,
                "hash_ids",
                format!(
                    "{} ids for {input_length} tokens (want {want}, one per 512)",
                    ids.len()
                ),
            ));
        }
        block_ids += want;
        if block_ids > max_block_ids {
            return Err(bad(
                line,
                "hash_ids",
                format!(
                    "the requests up to this line hold {block_ids} block ids, more than \
                     {max_block_ids} in all; replay fewer with --trace-requests"
                ),
            ));
        }
        let hash_ids = ids
            .iter()
            .map(|v| whole(v).map_err(|problem| bad(line, "hash_ids", problem)))
            .collect::<Result<Vec<u64>, _>>()?;
        out.push(TraceRequest {
            line,
            arrival_ms,
            input_length,
            output_length,
            hash_ids,
        });
    }
    Ok(out)
}

/// The prompt tokens of `r`: block `i` with id `h` holds 512 tokens drawn from `h` alone, so
/// equal ids give equal tokens; the last block is cut at `input_length`.
pub(crate) fn prompt_tokens(r: &TraceRequest) -> Vec<u32> {
    let mut out = Vec::with_capacity(r.input_length as usize);
    for &h in &r.hash_ids {
        let mut z = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x7ace_0b10_c4ed;
        for _ in 0..TRACE_BLOCK_TOKENS {
            if out.len() as u64 == r.input_length {
                break;
            }
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            out.push((x ^ (x >> 31)) as u32);
        }
    }
    out
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
