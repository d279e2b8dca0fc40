//! The per-engine rows of the combined report and the key-by-key merge of the engines' JSON
//! reports (see [`combine`](super::combine) for the keys).

use serde::Serialize;
use serde_json::{Map, Value};

use super::combine::Exit;

/// One engine's row (or, as `sum`, every engine's).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Row {
    /// The engine (`null` in the sum).
    pub engine: Option<u8>,
    /// Its exit code (`null` if a signal killed it; in the sum, the worst).
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether it printed a report (in the sum: every engine did).
    pub report: bool,
    /// `requests.submitted`.
    pub submitted: u64,
    /// `requests.finished`.
    pub finished: u64,
    /// `requests.failed`.
    pub failed: u64,
    /// `requests.cancelled`.
    pub cancelled: u64,
    /// submitted = finished + failed + cancelled, with a report.
    pub accounted: bool,
    /// Reads of KV bytes that differ from what the request's tokens make.
    pub garbage_reads: Option<u64>,
    /// Chunks it loaded that another engine saved (`chunks_loaded_from_others`).
    pub cross_engine_hits: Option<u64>,
    /// Chunks it loaded.
    pub chunks_loaded: Option<u64>,
    /// Payload bytes it loaded.
    pub kv_bytes_loaded: Option<u64>,
    /// Chunks refused by their checksum.
    pub checksum_failures: Option<u64>,
    /// Tier calls that failed as a whole.
    pub tier_errors: Option<u64>,
    /// Connections to the store lost and made again (`kv.reconnects`).
    pub reconnects: Option<u64>,
    /// Failed connection attempts (`kv.connect_failures`).
    pub connect_failures: Option<u64>,
    /// Tokens rolled back by recovery.
    pub tokens_recomputed: u64,
    /// Asynchronous loads completed failed.
    pub loads_failed: u64,
    /// Load completions per second.
    pub completions_per_s: f64,
    /// Finished requests per second.
    pub finished_per_s: f64,
    /// Step overhead p99, µs (in the sum: the largest).
    pub step_p99_us: f64,
    /// Submit → first schedule p99, µs (in the sum: the largest).
    pub submit_to_schedule_p99_us: f64,
    /// Its `invariants.ok`.
    pub invariants_ok: bool,
}

/// Parts of an engine's report not merged: its settings, the per-figure breakdown, and the
/// baseline's run.
const SKIPPED: [&str; 4] = ["config", "figures", "baseline", "ratios"];

impl Row {
    /// Engine `index`'s row from its parsed report `r`.
    pub fn of(index: u8, exit: Exit, r: Option<&Value>) -> Row {
        let null = Value::Null;
        let v = r.unwrap_or(&null);
        let n = |path: &[&str]| path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0);
        let f = |path: &[&str]| path.iter().fold(v, |v, k| &v[*k]).as_f64().unwrap_or(0.0);
        // The store's counters, in the report's `kv` object (`null` for a counter the
        // store has not, or without a report).
        let store = |name: &str| v["kv"][name].as_u64();
        let (submitted, finished, failed, cancelled) = (
            n(&["requests", "submitted"]),
            n(&["requests", "finished"]),
            n(&["requests", "failed"]),
            n(&["requests", "cancelled"]),
        );
        let report = r.is_some_and(|r| r["requests"]["submitted"].is_u64());
        Row {
            engine: Some(index),
            exit_code: exit.code,
            signal: exit.signal,
            report,
            submitted,
            finished,
            failed,
            cancelled,
            accounted: report
                && finished
                    .checked_add(failed)
                    .and_then(|x| x.checked_add(cancelled))
                    == Some(submitted),
            garbage_reads: store("garbage_reads"),
            cross_engine_hits: store("chunks_loaded_from_others"),
            chunks_loaded: store("chunks_loaded"),
            kv_bytes_loaded: store("kv_bytes_loaded"),
            checksum_failures: store("checksum_failures"),
            tier_errors: store("tier_errors"),
            reconnects: store("reconnects"),
            connect_failures: store("connect_failures"),
            tokens_recomputed: n(&["tokens_recomputed"]),
            loads_failed: n(&["loads", "failed"]),
            completions_per_s: f(&["completions_per_s"]),
            finished_per_s: f(&["finished_per_s"]),
            step_p99_us: f(&["step_overhead_us", "p99"]),
            submit_to_schedule_p99_us: f(&["submit_to_schedule_us", "p99"]),
            invariants_ok: v["invariants"]["ok"].as_bool() == Some(true),
        }
    }

    /// The sum of `rows` (see the module docs for what is summed and what is the largest).
    pub fn sum(rows: &[Row]) -> Row {
        let opt = |get: fn(&Row) -> Option<u64>| {
            rows.iter()
                .filter_map(get)
                .reduce(|a, b| a.saturating_add(b))
        };
        let add = |get: fn(&Row) -> u64| rows.iter().map(get).fold(0u64, u64::saturating_add);
        let max = |get: fn(&Row) -> f64| rows.iter().map(get).fold(0.0, f64::max);
        Row {
            engine: None,
            exit_code: rows.iter().filter_map(|r| r.exit_code).max(),
            signal: None,
            report: rows.iter().all(|r| r.report),
            submitted: add(|r| r.submitted),
            finished: add(|r| r.finished),
            failed: add(|r| r.failed),
            cancelled: add(|r| r.cancelled),
            accounted: rows.iter().all(|r| r.accounted),
            garbage_reads: opt(|r| r.garbage_reads),
            cross_engine_hits: opt(|r| r.cross_engine_hits),
            chunks_loaded: opt(|r| r.chunks_loaded),
            kv_bytes_loaded: opt(|r| r.kv_bytes_loaded),
            checksum_failures: opt(|r| r.checksum_failures),
            tier_errors: opt(|r| r.tier_errors),
            reconnects: opt(|r| r.reconnects),
            connect_failures: opt(|r| r.connect_failures),
            tokens_recomputed: add(|r| r.tokens_recomputed),
            loads_failed: add(|r| r.loads_failed),
            completions_per_s: rows.iter().map(|r| r.completions_per_s).sum(),
            finished_per_s: rows.iter().map(|r| r.finished_per_s).sum(),
            step_p99_us: max(|r| r.step_p99_us),
            submit_to_schedule_p99_us: max(|r| r.submit_to_schedule_p99_us),
            invariants_ok: rows.iter().all(|r| r.invariants_ok),
        }
    }
}

/// The engines' reports merged key by key (objects recursively, outside [`SKIPPED`]):
/// integers summed (saturating), and floats whose key ends in `_per_s` or `_s` (rates and
/// seconds of CPU) summed, except `elapsed_s`, the longest; every other float (percentiles,
/// ratios) the largest; `ok` and `reconciled` true if all are, other booleans if any is;
/// arrays concatenated, strings in them prefixed `e{i}: `; other strings kept if all agree,
/// else `null`. `reports` pairs each report with its engine index.
pub fn merge(reports: &[(u8, &Value)]) -> Value {
    merge_key("", reports)
}

fn merge_key(key: &str, vs: &[(u8, &Value)]) -> Value {
    let Some((_, first)) = vs.first() else {
        return Value::Null;
    };
    match first {
        Value::Object(o) => {
            let mut out = Map::new();
            for k in o.keys().filter(|k| !SKIPPED.contains(&k.as_str())) {
                let sub: Vec<(u8, &Value)> = vs
                    .iter()
                    .filter_map(|(i, v)| Some((*i, v.get(k)?)))
                    .collect();
                out.insert(k.clone(), merge_key(k, &sub));
            }
            Value::Object(out)
        }
        Value::Bool(_) => {
            let mut b = vs.iter().filter_map(|(_, v)| v.as_bool());
            Value::Bool(if key == "ok" || key == "reconciled" {
                b.all(|b| b)
            } else {
                b.any(|b| b)
            })
        }
        Value::Array(_) => Value::Array(
            vs.iter()
                .flat_map(|(i, v)| {
                    v.as_array().into_iter().flatten().map(move |x| match x {
                        Value::String(s) => Value::String(format!("e{i}: {s}")),
                        x => x.clone(),
                    })
                })
                .collect(),
        ),
        Value::String(s) => {
            if vs.iter().all(|(_, v)| v.as_str() == Some(s)) {
                Value::String(s.clone())
            } else {
                Value::Null
            }
        }
        Value::Number(_) => {
            let ints: Option<Vec<u64>> = vs.iter().map(|(_, v)| v.as_u64()).collect();
            if let Some(ints) = ints {
                return Value::from(ints.into_iter().fold(0u64, u64::saturating_add));
            }
            let floats = vs.iter().filter_map(|(_, v)| v.as_f64());
            let additive = key != "elapsed_s" && (key.ends_with("_per_s") || key.ends_with("_s"));
            let x = if additive {
                floats.sum()
            } else {
                floats.fold(f64::NEG_INFINITY, f64::max)
            };
            serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
        }
        Value::Null => vs
            .iter()
            .map(|(_, v)| *v)
            .find(|v| !v.is_null())
            .map_or(Value::Null, |v| merge_key(key, &[(0, v)])),
    }
}
