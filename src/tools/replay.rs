//! The scenario format of `kvsched replay` (SPEC §5): parsing a scenario from JSON into typed
//! inputs, running the sequential recovery engine on it, and rendering the outcome as JSON.
//!
//! Parsing never panics: every bad input is a [`ScenarioError`] naming the field (as a path
//! such as `requests[1].block_tables` or `groups[0].window`) and the problem, on one line.
//!
//! The JSON text is first read into a small private tree that keeps object entries in order
//! (so a key given twice is detected, where `serde_json::Value` would keep the last one) and
//! keeps every kind of number apart (non-negative integer, negative integer, float — serde_json
//! reads integers beyond 64 bits as floats); fields are then extracted by hand with their path
//! known.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::io::Read;
use std::time::Instant;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use thiserror::Error;

use crate::rules::geometry::{BlockId, CacheGroup, Geometry, GeometryError, MambaMode};
use crate::rules::recovery::{
    recover, validate_requests, InvalidSet, Mode, Outcome, Policy, RecoveryError, Request,
    RequestClass,
};

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
    /// Applies the recovery rules (SPEC §3 or §4) with the sequential engine.
    pub fn run(&self) -> Outcome {
        recover(
            &self.geometry,
            self.mode,
            self.policy,
            &self.requests,
            &self.invalid,
        )
    }

    /// Runs the recovery `runs` times, each on a fresh clone of the requests and the report
    /// (the clone is not timed, only [`recover`] is), and returns the median time in
    /// nanoseconds (the mean of the two middle runs for an even count; 0 when `runs` is 0).
    pub fn bench_recovery_ns(&self, runs: u64) -> u64 {
        let mut times: Vec<u64> = Vec::new();
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

// ---------------------------------------------------------------------------------------------
// The JSON tree.

/// A JSON value as written: object entries in order (duplicates kept), numbers by kind.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    /// A non-negative integer within 64 bits.
    UInt(u64),
    /// A negative integer within 64 bits.
    NegInt(i64),
    /// Anything else numeric: a fraction, an exponent, or an integer beyond 64 bits.
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::UInt(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(match u64::try_from(v) {
            Ok(u) => Json::UInt(u),
            Err(_) => Json::NegInt(v),
        })
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Json>()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value::<Json>()?;
            entries.push((key, value));
        }
        Ok(Json::Object(entries))
    }
}

/// A short description of a value for error messages.
fn describe(v: &Json) -> String {
    match v {
        Json::Null => "null".to_owned(),
        Json::Bool(b) => format!("boolean {b}"),
        Json::UInt(n) => format!("number {n}"),
        Json::NegInt(n) => format!("number {n}"),
        Json::Float(f) => format!("number {f:?}"),
        Json::Str(s) => format!("string {}", quote(s)),
        Json::Array(_) => "an array".to_owned(),
        Json::Object(_) => "an object".to_owned(),
    }
}

/// `s` quoted and escaped, cut after 40 characters.
fn quote(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() > MAX {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}…")
    } else {
        format!("{s:?}")
    }
}

/// `path.key`, or `path["key"]` when the key is not a plain identifier.
fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{key:?}]"),
    }
}

fn uint(v: &Json, path: &str) -> Result<u64, ScenarioError> {
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    match v {
        Json::UInt(n) => Ok(*n),
        Json::NegInt(n) => Err(err(
            path,
            format!("must be a non-negative integer, got {n}"),
        )),
        Json::Float(f) if f.is_finite() && f.fract() == 0.0 && *f >= TWO_POW_64 => Err(err(
            path,
            format!(
                "integer does not fit in 64 bits (got {f:?}; at most {})",
                u64::MAX
            ),
        )),
        Json::Float(f) if *f < 0.0 => Err(err(
            path,
            format!("must be a non-negative integer, got {f:?}"),
        )),
        Json::Float(f) => Err(err(
            path,
            format!("must be a non-negative integer, got float {f:?}"),
        )),
        other => Err(err(
            path,
            format!("expected a non-negative integer, got {}", describe(other)),
        )),
    }
}

fn array<'a>(v: &'a Json, path: &str) -> Result<&'a [Json], ScenarioError> {
    match v {
        Json::Array(items) => Ok(items),
        other => Err(err(
            path,
            format!("expected an array, got {}", describe(other)),
        )),
    }
}

fn uint_list(v: &Json, path: &str) -> Result<Vec<u64>, ScenarioError> {
    array(v, path)?
        .iter()
        .enumerate()
        .map(|(k, item)| uint(item, &format!("{path}[{k}]")))
        .collect()
}

/// Index of the string value `v` in `choices`.
fn one_of(v: &Json, path: &str, choices: &[&str]) -> Result<usize, ScenarioError> {
    let list = || {
        choices
            .iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match v {
        Json::Str(s) => choices.iter().position(|c| c == s).ok_or_else(|| {
            err(
                path,
                format!("unknown value {}; expected one of {}", quote(s), list()),
            )
        }),
        other => Err(err(
            path,
            format!("expected one of {}, got {}", list(), describe(other)),
        )),
    }
}

/// An object whose keys were checked: no key twice, none outside `allowed`.
struct Obj<'a> {
    path: String,
    entries: &'a [(String, Json)],
}

impl<'a> Obj<'a> {
    fn new(v: &'a Json, path: &str, what: &str, allowed: &[&str]) -> Result<Self, ScenarioError> {
        let shown = if path.is_empty() { "scenario" } else { path };
        let Json::Object(entries) = v else {
            return Err(err(
                shown,
                format!("{what} must be a JSON object, got {}", describe(v)),
            ));
        };
        let mut seen = HashSet::new();
        for (key, _) in entries {
            if !seen.insert(key.as_str()) {
                return Err(err(join(path, key), "key given twice"));
            }
            if !allowed.contains(&key.as_str()) {
                return Err(err(
                    join(path, key),
                    format!("unknown field; expected one of {}", allowed.join(", ")),
                ));
            }
        }
        Ok(Obj {
            path: path.to_owned(),
            entries,
        })
    }

    fn get(&self, key: &str) -> Option<&'a Json> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    fn required(&self, key: &str) -> Result<&'a Json, ScenarioError> {
        self.get(key)
            .ok_or_else(|| err(self.field(key), "missing required field"))
    }

    fn opt_uint(&self, key: &str) -> Result<Option<u64>, ScenarioError> {
        self.get(key).map(|v| uint(v, &self.field(key))).transpose()
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing.

const TOP_FIELDS: &[&str] = &[
    "mode",
    "policy",
    "null_block_id",
    "scheduler_block_size",
    "groups",
    "requests",
    "invalid_blocks",
    "invalid_blocks_by_group",
];
const GROUP_FIELDS: &[&str] = &["kind", "block_size", "window", "mamba_mode"];
const REQUEST_FIELDS: &[&str] = &[
    "id",
    "class",
    "num_computed_tokens",
    "num_scheduled_tokens",
    "block_tables",
];

/// Parses and validates a scenario (SPEC §5) from JSON text.
#[cfg(test)]
pub fn parse_scenario(text: &str) -> Result<Scenario, ScenarioError> {
    parse_scenario_bytes(text.as_bytes())
}

/// Parses and validates a scenario (SPEC §5) from JSON bytes (UTF-8).
pub fn parse_scenario_bytes(bytes: &[u8]) -> Result<Scenario, ScenarioError> {
    let doc: Json = serde_json::from_slice(bytes)
        .map_err(|e| err("scenario", format!("malformed JSON: {e}")))?;
    scenario_from_json(&doc)
}

/// Reads a scenario from the file `file`, or from standard input when `file` is `-`, and
/// parses it. Read failures (a missing file, a directory) are errors on field `FILE`.
pub fn load_scenario(file: &OsStr) -> Result<Scenario, ScenarioError> {
    let bytes = if file == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut buf)
            .map_err(|e| err("FILE", format!("cannot read standard input: {e}")))?;
        buf
    } else {
        std::fs::read(file).map_err(|e| err("FILE", format!("cannot read {file:?}: {e}")))?
    };
    parse_scenario_bytes(&bytes)
}

fn scenario_from_json(doc: &Json) -> Result<Scenario, ScenarioError> {
    let top = Obj::new(doc, "", "the scenario", TOP_FIELDS)?;

    let mode = match top.get("mode") {
        None => Mode::default(),
        Some(v) => match one_of(v, "mode", &["vllm", "safe"])? {
            0 => Mode::Vllm,
            _ => Mode::Safe,
        },
    };
    let policy = match top.get("policy") {
        None => Policy::default(),
        Some(v) => match one_of(v, "policy", &["recompute", "fail"])? {
            0 => Policy::Recompute,
            _ => Policy::Fail,
        },
    };
    let null_block = top
        .opt_uint("null_block_id")?
        .unwrap_or(crate::rules::geometry::DEFAULT_NULL_BLOCK);

    let groups_json = array(top.required("groups")?, "groups")?;
    let groups = groups_json
        .iter()
        .enumerate()
        .map(|(i, g)| parse_group(g, &format!("groups[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let explicit_s = top.opt_uint("scheduler_block_size")?;
    let geometry = Geometry::new(groups, explicit_s, null_block).map_err(geometry_error)?;

    let requests_json = array(top.required("requests")?, "requests")?;
    let requests = requests_json
        .iter()
        .enumerate()
        .map(|(i, r)| parse_request(r, &format!("requests[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;

    let flat = top
        .get("invalid_blocks")
        .map(|v| uint_list(v, "invalid_blocks"))
        .transpose()?;
    let by_group = top
        .get("invalid_blocks_by_group")
        .map(|v| {
            array(v, "invalid_blocks_by_group")?
                .iter()
                .enumerate()
                .map(|(g, list)| uint_list(list, &format!("invalid_blocks_by_group[{g}]")))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let invalid_blocks =
        match (&flat, &by_group) {
            (None, None) => return Err(err(
                "invalid_blocks",
                "missing required field (give invalid_blocks, invalid_blocks_by_group, or both)",
            )),
            (Some(flat), _) => flat.clone(),
            (None, Some(_)) => Vec::new(),
        };
    let invalid = match &by_group {
        None => InvalidSet::flat(invalid_blocks.iter().copied(), &geometry),
        Some(lists) => InvalidSet::with_groups(invalid_blocks.iter().copied(), lists, &geometry)
            .map_err(|e| err("invalid_blocks_by_group", e.to_string()))?,
    };

    validate_requests(&geometry, &requests)
        .map_err(|(i, e)| request_error(i, e, geometry.null_block()))?;

    Ok(Scenario {
        geometry,
        mode,
        policy,
        requests,
        invalid,
    })
}

fn parse_group(v: &Json, path: &str) -> Result<CacheGroup, ScenarioError> {
    let obj = Obj::new(v, path, "a cache group", GROUP_FIELDS)?;
    const KINDS: &[&str] = &["full_attention", "sliding_window", "mamba"];
    let kind = one_of(obj.required("kind")?, &obj.field("kind"), KINDS)?;
    let own: &[&str] = match kind {
        0 => &[],
        1 => &["window"],
        _ => &["mamba_mode"],
    };
    for extra in ["window", "mamba_mode"] {
        if obj.get(extra).is_some() && !own.contains(&extra) {
            return Err(err(
                obj.field(extra),
                format!("not a field of a {} group", KINDS[kind]),
            ));
        }
    }
    let block_size = uint(obj.required("block_size")?, &obj.field("block_size"))?;
    let missing_for_kind = |key: &str| {
        err(
            obj.field(key),
            format!("missing required field (for a {} group)", KINDS[kind]),
        )
    };
    Ok(match kind {
        0 => CacheGroup::full_attention(block_size),
        1 => {
            let w = obj
                .get("window")
                .ok_or_else(|| missing_for_kind("window"))?;
            CacheGroup::sliding_window(block_size, uint(w, &obj.field("window"))?)
        }
        _ => {
            let m = obj
                .get("mamba_mode")
                .ok_or_else(|| missing_for_kind("mamba_mode"))?;
            let mode = match one_of(m, &obj.field("mamba_mode"), &["align", "all"])? {
                0 => MambaMode::Align,
                _ => MambaMode::All,
            };
            CacheGroup::mamba(block_size, mode)
        }
    })
}

fn parse_request(v: &Json, path: &str) -> Result<Request, ScenarioError> {
    let obj = Obj::new(v, path, "a request", REQUEST_FIELDS)?;
    let id = match obj.required("id")? {
        Json::Str(s) if !s.is_empty() => s.clone(),
        Json::Str(_) => return Err(err(obj.field("id"), "must be a non-empty string")),
        other => {
            return Err(err(
                obj.field("id"),
                format!("expected a non-empty string, got {}", describe(other)),
            ))
        }
    };
    let class = match one_of(
        obj.required("class")?,
        &obj.field("class"),
        &["async", "sync"],
    )? {
        0 => RequestClass::Async,
        _ => RequestClass::Sync,
    };
    let num_computed_tokens = uint(
        obj.required("num_computed_tokens")?,
        &obj.field("num_computed_tokens"),
    )?;
    let num_scheduled_tokens = obj.opt_uint("num_scheduled_tokens")?.unwrap_or(0);
    let tables_path = obj.field("block_tables");
    let block_tables = array(obj.required("block_tables")?, &tables_path)?
        .iter()
        .enumerate()
        .map(|(g, t)| uint_list(t, &format!("{tables_path}[{g}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Request {
        id,
        class,
        num_computed_tokens,
        num_scheduled_tokens,
        block_tables,
    })
}

fn geometry_error(e: GeometryError) -> ScenarioError {
    match e {
        GeometryError::NoGroups => err("groups", "at least one cache group is required"),
        GeometryError::ZeroBlockSize { group } => {
            err(format!("groups[{group}].block_size"), "must be > 0")
        }
        GeometryError::ZeroWindow { group } => {
            err(format!("groups[{group}].window"), "must be > 0")
        }
        GeometryError::ZeroSchedulerBlockSize => err("scheduler_block_size", "must be > 0"),
        GeometryError::NotAMultiple {
            scheduler_block_size,
            group,
            block_size,
        } => err(
            "scheduler_block_size",
            format!(
                "{scheduler_block_size} is not a multiple of groups[{group}].block_size {block_size}"
            ),
        ),
        other => err("groups", other.to_string()),
    }
}

fn request_error(i: usize, e: RecoveryError, null_block: BlockId) -> ScenarioError {
    let path = format!("requests[{i}]");
    match e {
        RecoveryError::TableCount { .. } => err(format!("{path}.block_tables"), e.to_string()),
        RecoveryError::ScheduledExceedsComputed { .. }
        | RecoveryError::AsyncWithScheduled { .. } => {
            err(format!("{path}.num_scheduled_tokens"), e.to_string())
        }
        RecoveryError::NullInFullAttention {
            group,
            index,
            pre_step_tokens,
        } => err(
            format!("{path}.block_tables[{group}][{index}]"),
            format!(
                "the null block {null_block} in a full_attention table below P = {pre_step_tokens}"
            ),
        ),
        RecoveryError::DuplicateRequestId { .. } => err(format!("{path}.id"), e.to_string()),
        other => err(path, other.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering.

#[derive(Serialize)]
struct OutcomeJson<'a> {
    affected: Vec<&'a str>,
    skip: Vec<&'a str>,
    failed: Vec<&'a str>,
    failed_recving: Vec<&'a str>,
    total_affected_tokens: u128,
    evicted_blocks: &'a [BlockId],
    requests: Vec<RequestJson<'a>>,
}

#[derive(Serialize)]
struct RequestJson<'a> {
    id: &'a str,
    affected: bool,
    num_computed_tokens: u64,
    affected_tokens: u64,
    claimed_blocks: &'a [BlockId],
    waits_for: Vec<WaitJson<'a>>,
}

#[derive(Serialize)]
struct WaitJson<'a> {
    block: BlockId,
    owner: &'a str,
}

/// Renders `outcome` (which must come from [`Scenario::run`] on `scenario`) as SPEC §5's
/// outcome JSON: pretty-printed with two-space indentation and a trailing newline, keys in
/// the order of the spec's example, request indices replaced by request ids.
pub fn render_outcome(scenario: &Scenario, outcome: &Outcome) -> String {
    let id = |i: usize| scenario.requests.get(i).map_or("", |r| r.id.as_str());
    let ids = |v: &[usize]| v.iter().map(|&i| id(i)).collect::<Vec<_>>();
    let json = OutcomeJson {
        affected: ids(&outcome.affected),
        skip: ids(&outcome.skip),
        failed: ids(&outcome.failed),
        failed_recving: ids(&outcome.failed_recving),
        total_affected_tokens: outcome.total_affected_tokens,
        evicted_blocks: &outcome.evicted_blocks,
        requests: outcome
            .requests
            .iter()
            .enumerate()
            .map(|(i, d)| RequestJson {
                id: id(i),
                affected: d.affected(),
                num_computed_tokens: d.num_computed_tokens,
                affected_tokens: d.affected_tokens,
                claimed_blocks: &d.claimed_blocks,
                waits_for: d
                    .waits_for
                    .iter()
                    .map(|&(block, owner)| WaitJson {
                        block,
                        owner: id(owner),
                    })
                    .collect(),
            })
            .collect(),
    };
    // Serializing plain structs with string keys cannot fail.
    let mut text = serde_json::to_string_pretty(&json).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_json(text: &str) -> Json {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn json_tree_keeps_duplicates_and_number_kinds() {
        let v = parse_json(
            r#"{"a": 1, "a": -2, "b": 16.0, "c": 18446744073709551616, "d": [true, null, "x"]}"#,
        );
        let Json::Object(entries) = v else {
            panic!("not an object")
        };
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0], ("a".to_owned(), Json::UInt(1)));
        assert_eq!(entries[1], ("a".to_owned(), Json::NegInt(-2)));
        assert_eq!(entries[2], ("b".to_owned(), Json::Float(16.0)));
        assert!(matches!(entries[3].1, Json::Float(_)));
        assert_eq!(
            entries[4].1,
            Json::Array(vec![Json::Bool(true), Json::Null, Json::Str("x".into())])
        );
        assert_eq!(parse_json("18446744073709551615"), Json::UInt(u64::MAX));
    }

    #[test]
    fn paths_and_one_line() {
        assert_eq!(join("", "mode"), "mode");
        assert_eq!(join("groups[0]", "window"), "groups[0].window");
        assert_eq!(join("", "a b"), "[\"a b\"]");
        let e = ScenarioError::new("x\ny", "bad\nthing");
        assert_eq!(e.to_string(), "x\\ny: bad\\nthing");
    }

    #[test]
    fn uint_messages() {
        assert_eq!(uint(&Json::UInt(7), "f"), Ok(7));
        for (v, needle) in [
            (Json::NegInt(-1), "non-negative"),
            (Json::Float(16.0), "float 16.0"),
            (Json::Float(1.8446744073709552e19), "64 bits"),
            (Json::Str("3".into()), "string"),
            (Json::Bool(true), "boolean"),
            (Json::Null, "null"),
        ] {
            let e = uint(&v, "f").unwrap_err();
            assert_eq!(e.field, "f");
            assert!(e.problem.contains(needle), "{e}");
        }
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
