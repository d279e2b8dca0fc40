//! The combined report of `kvsched stress --engines N`: each engine's JSON report read
//! (as a `serde_json::Value`), a row per engine, their sum, the merged reports, the restarts,
//! the request accounting of every engine, the verdict and the exit code.
//!
//! # JSON keys
//!
//! * `engines`: the engine count; `store`: the URL the engines used (credentials as `***`);
//!   `server`: `{owned, shape, nodes}` (`owned` false for a user's server);
//! * `redis_restarts`: `{requested, done, events: [{at_s, node, down_ms}]}` — when each
//!   restart began (seconds after the engines started), the address restarted and how long
//!   until it answered `PING` again;
//! * `per_engine`: one row per engine — `engine`, `exit_code` (`null` if killed by a signal,
//!   then `signal`), `report` (whether it printed a report), `submitted`, `finished`,
//!   `failed`, `cancelled`, `accounted` (submitted = finished + failed + cancelled),
//!   `garbage_reads`, `cross_engine_hits` (its `chunks_loaded_from_others`), `chunks_loaded`,
//!   `kv_bytes_loaded`, `checksum_failures`, `tier_errors`, `reconnects`, `connect_failures`
//!   (each from the engine's `kv` object), `tokens_recomputed`,
//!   `loads_failed`, `completions_per_s`, `finished_per_s`, `step_p99_us`,
//!   `submit_to_schedule_p99_us`, `invariants_ok`; a store counter the engine's report does
//!   not have is `null`;
//! * `sum`: the same keys over every engine (counts and rates summed, `step_p99_us` and
//!   `submit_to_schedule_p99_us` the largest engine's, `accounted` and `invariants_ok` of
//!   all);
//! * `cross_engine_hit_ratio`: `sum.cross_engine_hits / sum.chunks_loaded` (`null` without
//!   loads): of the chunks the engines loaded, the share another engine had saved;
//! * `every_request_accounted`: every engine's `accounted`;
//! * `total`: the engines' reports merged key by key ([`merge`]);
//! * `invariants`: `{ok, violations}` — the engines' own violations prefixed `e{i}: `, and
//!   the parent's (an engine without a report, one whose requests do not add up, garbage
//!   reads in mode `safe`, an engine killed as overdue, a restart that did not happen);
//! * `exit_code`: what the parent exits with.

use serde::Serialize;
use serde_json::{Map, Value};

use super::super::store::StoreSpec;
use super::args::Plan;

/// How an engine process ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

impl Exit {
    /// The exit code it stands for: its own, 1 when a signal (or nothing known) ended it.
    fn severity(self) -> u8 {
        match self.code {
            Some(c) => u8::try_from(c).unwrap_or(1),
            None => 1,
        }
    }
}

/// What one engine process left.
#[derive(Clone, Debug, Default)]
pub struct EngineOutcome {
    /// Its index (`--engine-index`).
    pub index: u8,
    /// How it ended.
    pub exit: Exit,
    /// Its stdout (the JSON report).
    pub stdout: Vec<u8>,
    /// Whether stdout was cut at its cap.
    pub stdout_cut: bool,
    /// Its last stderr lines.
    pub stderr_tail: Vec<String>,
    /// Whether the parent killed it for running too long.
    pub overdue: bool,
}

/// One restart of the owned server.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RestartEvent {
    /// Seconds after the engines started.
    pub at_s: f64,
    /// The address restarted.
    pub node: String,
    /// Milliseconds from the kill until the server answered `PING` again.
    pub down_ms: f64,
}

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

/// The combined report (see the module docs for its JSON).
#[derive(Debug, Serialize)]
pub struct Combined {
    /// Engines run.
    pub engines: u8,
    /// The store the engines used, credentials hidden.
    pub store: String,
    /// The server, when the store is Redis.
    pub server: Option<ServerInfo>,
    /// The restarts.
    pub redis_restarts: Restarts,
    /// One row per engine.
    pub per_engine: Vec<Row>,
    /// Their sum.
    pub sum: Row,
    /// `sum.cross_engine_hits / sum.chunks_loaded`.
    pub cross_engine_hit_ratio: Option<f64>,
    /// Every engine's requests add up.
    pub every_request_accounted: bool,
    /// The engines' reports merged.
    pub total: Value,
    /// The verdict.
    pub invariants: Verdict,
    /// The parent's exit code.
    pub exit_code: u8,
    /// The parent's own violations (also in `invariants.violations`).
    #[serde(skip)]
    pub violations: Vec<String>,
}

/// The server the engines shared.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ServerInfo {
    /// Whether the parent started it.
    pub owned: bool,
    /// `standalone`, `cluster`, or `user` for a user's server.
    pub shape: String,
    /// Its nodes (0 when unknown: a user's server).
    pub nodes: usize,
}

/// `redis_restarts`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Restarts {
    /// `--redis-restarts`.
    pub requested: u32,
    /// Restarts made.
    pub done: usize,
    /// Each restart.
    pub events: Vec<RestartEvent>,
}

/// `invariants`.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Verdict {
    /// No violation anywhere.
    pub ok: bool,
    /// The engines' and the parent's violations.
    pub violations: Vec<String>,
}

impl Combined {
    /// The combined report of `outcomes` run by `plan` on `store` (the store the engines
    /// got, credentials hidden) and `server`, with the `restarts` made.
    pub fn of(
        plan: &Plan,
        store: &str,
        server: Option<ServerInfo>,
        outcomes: Vec<EngineOutcome>,
        restarts: Vec<RestartEvent>,
    ) -> Combined {
        let mut parent = Vec::new();
        let mut engines = Vec::new();
        let parsed: Vec<Option<Value>> = outcomes
            .iter()
            .map(|o| {
                let v = serde_json::from_slice::<Value>(&o.stdout);
                match (&v, o.stdout.is_empty()) {
                    (Ok(v), _) if v.is_object() => return Some(v.clone()),
                    (_, true) => parent.push(format!(
                        "engine {}: no report ({}){}",
                        o.index,
                        exit_text(o.exit),
                        last_line(&o.stderr_tail)
                    )),
                    (Err(e), false) => parent.push(format!(
                        "engine {}: its report is not JSON ({e}; {}){}",
                        o.index,
                        exit_text(o.exit),
                        if o.stdout_cut { ", cut at its cap" } else { "" }
                    )),
                    (Ok(_), false) => {
                        parent.push(format!("engine {}: its report is not an object", o.index))
                    }
                }
                None
            })
            .collect();
        let rows: Vec<Row> = outcomes
            .iter()
            .zip(&parsed)
            .map(|(o, v)| Row::of(o.index, o.exit, v.as_ref()))
            .collect();
        for ((o, v), row) in outcomes.iter().zip(&parsed).zip(&rows) {
            let i = o.index;
            if let Some(v) = v {
                if let Some(list) = v["invariants"]["violations"].as_array() {
                    engines.extend(
                        list.iter()
                            .filter_map(Value::as_str)
                            .map(|s| format!("e{i}: {s}")),
                    );
                }
                if !row.accounted {
                    parent.push(format!(
                        "engine {i}: submitted {} ≠ finished {} + failed {} + cancelled {}",
                        row.submitted, row.finished, row.failed, row.cancelled
                    ));
                }
            }
            if plan.safe_mode && row.garbage_reads.is_some_and(|g| g > 0) {
                parent.push(format!(
                    "engine {i}: {} garbage reads in mode safe",
                    row.garbage_reads.unwrap_or(0)
                ));
            }
            if o.overdue {
                parent.push(format!(
                    "engine {i}: did not end long after --duration; killed"
                ));
            } else if o.exit.code != Some(0) && v.is_some() && row.invariants_ok {
                parent.push(format!("engine {i}: {}", exit_text(o.exit)));
            }
        }
        if restarts.len() < plan.restarts as usize {
            parent.push(format!(
                "only {} of {} Redis restarts happened before the engines ended (a longer run spreads them)",
                restarts.len(),
                plan.restarts
            ));
        }
        let sum = Row::sum(&rows);
        let ratio = match (sum.cross_engine_hits, sum.chunks_loaded) {
            (Some(h), Some(l)) if l > 0 => Some(h as f64 / l as f64),
            _ => None,
        };
        let reports: Vec<(u8, &Value)> = outcomes
            .iter()
            .zip(&parsed)
            .filter_map(|(o, v)| Some((o.index, v.as_ref()?)))
            .collect();
        let worst_child = outcomes
            .iter()
            .map(|o| o.exit.severity())
            .max()
            .unwrap_or(0);
        let exit_code = worst_child.max(u8::from(!parent.is_empty()));
        let mut violations = engines;
        violations.extend(parent.iter().cloned());
        Combined {
            engines: plan.engines,
            store: store.to_owned(),
            server,
            redis_restarts: Restarts {
                requested: plan.restarts,
                done: restarts.len(),
                events: restarts,
            },
            every_request_accounted: sum.accounted,
            per_engine: rows,
            sum,
            cross_engine_hit_ratio: ratio,
            total: merge(&reports),
            invariants: Verdict {
                ok: violations.is_empty() && exit_code == 0,
                violations,
            },
            exit_code,
            violations: parent,
        }
    }

    /// The report as JSON (pretty, newline-terminated).
    pub fn render_json(&self) -> String {
        let mut s =
            serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
        s.push('\n');
        s
    }

    /// The report as text: a header, a table of engines and their sum, the restarts and
    /// the verdicts.
    pub fn render_human(&self) -> String {
        let mut out = String::new();
        let server = match &self.server {
            Some(s) if s.owned => format!(
                " (kvsched's own, {}{})",
                s.shape,
                if s.nodes > 1 {
                    format!(" of {} nodes", s.nodes)
                } else {
                    String::new()
                }
            ),
            Some(_) => " (the user's server)".to_owned(),
            None => String::new(),
        };
        out.push_str(&format!(
            "kvsched stress: {} engine{} · store {}{server}\n",
            self.engines,
            if self.engines == 1 { "" } else { "s" },
            self.store
        ));
        let r = &self.redis_restarts;
        if r.requested > 0 {
            out.push_str(&format!("Redis restarts: {} of {}\n", r.done, r.requested));
            for (k, e) in r.events.iter().enumerate() {
                out.push_str(&format!(
                    "  restart {} at {:.2} s: {} back after {:.1} ms, empty\n",
                    k + 1,
                    e.at_s,
                    e.node,
                    e.down_ms
                ));
            }
        }
        out.push('\n');
        let header = [
            "engine",
            "exit",
            "submitted",
            "finished",
            "failed",
            "cancelled",
            "garbage reads",
            "cross-engine hits",
            "KV bytes loaded",
            "checksum failures",
            "tier errors",
            "reconnects",
            "finished/s",
            "load completions/s",
            "step p99 µs",
        ];
        let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
        for row in self.per_engine.iter().chain(std::iter::once(&self.sum)) {
            let opt = |x: Option<u64>| x.map_or_else(|| "—".to_owned(), thousands);
            table.push(vec![
                row.engine
                    .map_or_else(|| "sum".to_owned(), |i| format!("e{i}")),
                match (row.exit_code, row.signal) {
                    (Some(c), _) => c.to_string(),
                    (None, Some(s)) => format!("signal {s}"),
                    (None, None) => "—".to_owned(),
                },
                thousands(row.submitted),
                thousands(row.finished),
                thousands(row.failed),
                thousands(row.cancelled),
                opt(row.garbage_reads),
                opt(row.cross_engine_hits),
                opt(row.kv_bytes_loaded),
                opt(row.checksum_failures),
                opt(row.tier_errors),
                opt(row.reconnects),
                thousands(row.finished_per_s.round() as u64),
                thousands(row.completions_per_s.round() as u64),
                format!("{:.0}", row.step_p99_us),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                table
                    .iter()
                    .map(|row| row[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &table {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (cell, w))| {
                    if c == 0 {
                        format!("{cell:<w$}")
                    } else {
                        format!("{cell:>w$}")
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out.push('\n');
        match (self.cross_engine_hit_ratio, self.sum.chunks_loaded) {
            (Some(x), Some(l)) => out.push_str(&format!(
                "cross-engine hit ratio: {x:.3} (of {} chunks loaded, the share another engine saved)\n",
                thousands(l)
            )),
            _ => out.push_str("cross-engine hit ratio: — (no chunks loaded)\n"),
        }
        out.push_str(&format!(
            "every request accounted for in every engine (submitted = finished + failed + cancelled): {}\n",
            if self.every_request_accounted { "yes" } else { "NO" }
        ));
        if self.invariants.ok {
            out.push_str("invariants: ok in every engine\n");
        } else {
            out.push_str(&format!(
                "invariants: VIOLATED ({} violation{}; exit code {})\n",
                self.invariants.violations.len(),
                if self.invariants.violations.len() == 1 {
                    ""
                } else {
                    "s"
                },
                self.exit_code
            ));
            for v in &self.invariants.violations {
                out.push_str(&format!("  {v}\n"));
            }
        }
        out
    }
}

/// The server info of `plan` (`shape` and `nodes` of the owned server, if any).
pub fn server_info(plan: &Plan, owned: Option<(&'static str, usize)>) -> Option<ServerInfo> {
    match (&plan.store, owned) {
        (_, Some((shape, nodes))) => Some(ServerInfo {
            owned: true,
            shape: shape.to_owned(),
            nodes,
        }),
        (StoreSpec::RedisUrl { shown, .. }, None) => Some(ServerInfo {
            owned: false,
            shape: "user".to_owned(),
            nodes: shown
                .split(['/', '?'])
                .nth(2)
                .map_or(0, |hosts| hosts.split(',').count()),
        }),
        _ => None,
    }
}

/// How an engine ended, in words.
fn exit_text(e: Exit) -> String {
    match (e.code, e.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "exit unknown".to_owned(),
    }
}

/// `: <the last line>` of a stderr tail, or nothing.
fn last_line(tail: &[String]) -> String {
    tail.last().map_or_else(String::new, |l| format!(": {l}"))
}

/// `n` with thousands separators.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut s = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            s.push(',');
        }
        s.push(ch);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::{render_json, run_stress, Rate, StressConfig};
    use serde_json::json;

    fn plan(engines: u8, restarts: u32, safe: bool) -> Plan {
        Plan {
            engines,
            restarts,
            store: StoreSpec::Redis,
            cluster: None,
            maxmemory: None,
            store_arg: None,
            safe_mode: safe,
        }
    }

    /// A canned engine report: the stress keys, and the store counters where the store's
    /// part of the report puts them.
    fn report(
        submitted: u64,
        finished: u64,
        cancelled: u64,
        from_others: u64,
        loaded: u64,
    ) -> Value {
        json!({
            "requests": {"submitted": submitted, "finished": finished, "failed": 0, "cancelled": cancelled},
            "loads": {"ok": 10, "failed": 2},
            "tokens_recomputed": 100,
            "completions_per_s": 1000.5,
            "finished_per_s": 200.0,
            "elapsed_s": 2.0 + submitted as f64 / 1000.0,
            "timed_out": false,
            "step_overhead_us": {"p50": 10.0, "p99": 50.0 + submitted as f64, "max": 900.0, "count": 7},
            "submit_to_schedule_us": {"p50": 1.0, "p99": 2.0, "max": 3.0, "count": 7},
            "kv": {"chunks_loaded": loaded, "chunks_loaded_from_others": from_others,
                   "kv_bytes_loaded": loaded * 4096, "checksum_failures": 1, "tier_errors": 3,
                   "garbage_reads": 0, "reconnects": 1, "connect_failures": 2},
            "invariants": {"ok": true, "reconciled": true, "violations": []},
            "config": {"seed": 1, "mode": "safe"},
            "figures": {"steps": {"kvsched": {"median": 5}}},
        })
    }

    fn outcome(index: u8, code: i32, v: &Value) -> EngineOutcome {
        EngineOutcome {
            index,
            exit: Exit {
                code: Some(code),
                signal: None,
            },
            stdout: serde_json::to_vec(v).unwrap(),
            ..EngineOutcome::default()
        }
    }

    #[test]
    fn rows_are_read_and_summed() {
        let (a, b) = (report(100, 90, 10, 40, 50), report(200, 200, 0, 70, 150));
        let c = Combined::of(
            &plan(2, 0, true),
            "redis://127.0.0.1:1",
            None,
            vec![outcome(0, 0, &a), outcome(1, 0, &b)],
            Vec::new(),
        );
        assert_eq!(c.exit_code, 0, "{:?}", c.invariants);
        assert!(c.invariants.ok && c.every_request_accounted);
        let r0 = &c.per_engine[0];
        assert_eq!(
            (
                r0.submitted,
                r0.finished,
                r0.cancelled,
                r0.cross_engine_hits,
                r0.chunks_loaded
            ),
            (100, 90, 10, Some(40), Some(50))
        );
        assert_eq!(
            (r0.tier_errors, r0.reconnects, r0.garbage_reads),
            (Some(3), Some(1), Some(0))
        );
        let s = &c.sum;
        assert_eq!((s.submitted, s.finished, s.cancelled), (300, 290, 10));
        assert_eq!(
            (s.cross_engine_hits, s.chunks_loaded),
            (Some(110), Some(200))
        );
        assert_eq!(s.kv_bytes_loaded, Some(200 * 4096));
        assert_eq!((s.tier_errors, s.checksum_failures), (Some(6), Some(2)));
        assert_eq!(s.completions_per_s, 2001.0);
        assert_eq!(s.step_p99_us, 250.0); // the largest, not a sum
        assert_eq!(c.cross_engine_hit_ratio, Some(110.0 / 200.0));
        // The merged reports: counts and rates summed, percentiles and elapsed the largest,
        // settings and figures left out.
        let t = &c.total;
        assert_eq!(t["requests"]["submitted"], json!(300));
        assert_eq!(t["loads"]["failed"], json!(4));
        assert_eq!(t["finished_per_s"], json!(400.0));
        assert_eq!(t["elapsed_s"], json!(2.2));
        assert_eq!(t["step_overhead_us"]["p99"], json!(250.0));
        assert_eq!(t["step_overhead_us"]["count"], json!(14));
        assert_eq!(t["invariants"]["ok"], json!(true));
        assert!(t.get("config").is_none() && t.get("figures").is_none());
        let text = c.render_human();
        assert!(text.contains("every request accounted for in every engine (submitted = finished + failed + cancelled): yes"), "{text}");
        assert!(text.contains("cross-engine hit ratio: 0.550"), "{text}");
        let j: Value = serde_json::from_str(&c.render_json()).unwrap();
        assert_eq!(j["per_engine"][1]["cross_engine_hits"], json!(70));
        assert_eq!(j["sum"]["cross_engine_hits"], json!(110));
        assert_eq!(j["every_request_accounted"], json!(true));
    }

    #[test]
    fn an_engine_whose_requests_do_not_add_up_fails_the_run() {
        let bad = report(100, 80, 10, 0, 0); // 10 requests lost
        let c = Combined::of(
            &plan(2, 0, true),
            "redis://h:1",
            None,
            vec![outcome(0, 0, &report(5, 5, 0, 0, 0)), outcome(1, 0, &bad)],
            Vec::new(),
        );
        assert_eq!(c.exit_code, 1);
        assert!(!c.every_request_accounted && !c.invariants.ok);
        assert!(c.per_engine[0].accounted && !c.per_engine[1].accounted);
        assert_eq!(
            c.violations,
            ["engine 1: submitted 100 ≠ finished 80 + failed 0 + cancelled 10"]
        );
        assert!(c
            .render_human()
            .contains("engine (submitted = finished + failed + cancelled): NO"));
    }

    #[test]
    fn the_worst_engine_sets_the_exit_code() {
        let mut violated = report(10, 10, 0, 0, 0);
        violated["invariants"] =
            json!({"ok": false, "reconciled": true, "violations": ["pool leak"]});
        let missing = EngineOutcome {
            index: 2,
            exit: Exit {
                code: Some(2),
                signal: None,
            },
            stderr_tail: vec!["error: --store: bad".into()],
            ..EngineOutcome::default()
        };
        let c = Combined::of(
            &plan(3, 0, true),
            "redis://h:1",
            None,
            vec![
                outcome(0, 0, &report(1, 1, 0, 0, 0)),
                outcome(1, 1, &violated),
                missing,
            ],
            Vec::new(),
        );
        assert_eq!(c.exit_code, 2);
        assert!(c
            .invariants
            .violations
            .contains(&"e1: pool leak".to_owned()));
        assert!(c
            .violations
            .contains(&"engine 2: no report (exit code 2): error: --store: bad".to_owned()));
        assert!(!c.sum.report);
        // A signal counts as 1; one violation of the parent's own is 1 too.
        let killed = EngineOutcome {
            index: 0,
            exit: Exit {
                code: None,
                signal: Some(9),
            },
            ..EngineOutcome::default()
        };
        let c = Combined::of(
            &plan(1, 0, true),
            "redis://h:1",
            None,
            vec![killed],
            Vec::new(),
        );
        assert_eq!(c.exit_code, 1);
        assert_eq!(c.violations, ["engine 0: no report (killed by signal 9)"]);
    }

    #[test]
    fn garbage_reads_fail_mode_safe_only() {
        let mut g = report(10, 10, 0, 0, 0);
        g["kv"]["garbage_reads"] = json!(3);
        let safe = Combined::of(
            &plan(1, 0, true),
            "x",
            None,
            vec![outcome(0, 0, &g)],
            Vec::new(),
        );
        assert_eq!(safe.exit_code, 1);
        assert_eq!(safe.violations, ["engine 0: 3 garbage reads in mode safe"]);
        let vllm = Combined::of(
            &plan(1, 0, false),
            "x",
            None,
            vec![outcome(0, 0, &g)],
            Vec::new(),
        );
        assert_eq!(vllm.exit_code, 0);
        assert_eq!(vllm.sum.garbage_reads, Some(3));
    }

    #[test]
    fn restarts_that_did_not_happen_are_a_violation() {
        let one = RestartEvent {
            at_s: 1.5,
            node: "127.0.0.1:7".into(),
            down_ms: 12.0,
        };
        let r = report(10, 10, 0, 0, 0);
        let c = Combined::of(
            &plan(1, 2, true),
            "x",
            None,
            vec![outcome(0, 0, &r)],
            vec![one.clone()],
        );
        assert_eq!(c.exit_code, 1);
        assert_eq!((c.redis_restarts.requested, c.redis_restarts.done), (2, 1));
        let c = Combined::of(
            &plan(1, 1, true),
            "x",
            None,
            vec![outcome(0, 0, &r)],
            vec![one],
        );
        assert_eq!(c.exit_code, 0);
        assert!(c
            .render_human()
            .contains("restart 1 at 1.50 s: 127.0.0.1:7 back after 12.0 ms"));
    }

    /// Real engine reports (two in-process runs as engines 0 and 1 would make): the row
    /// reads their keys, and each engine's ids carry its prefix.
    #[test]
    fn real_reports_combine() {
        let run = |i: u8| {
            let mut cfg = StressConfig {
                requests: 60,
                rate: Rate::Max,
                live: 16,
                model_us: 0,
                ..StressConfig::default()
            };
            cfg.engines.engine_index = Some(i);
            let r = run_stress(&cfg).expect("stress");
            serde_json::from_str::<Value>(&render_json(&r)).expect("json")
        };
        let (a, b) = (run(0), run(1));
        assert_eq!(a["config"]["engine_index"], json!(0));
        let c = Combined::of(
            &plan(2, 0, true),
            "x",
            None,
            vec![outcome(0, 0, &a), outcome(1, 0, &b)],
            Vec::new(),
        );
        assert_eq!(c.exit_code, 0, "{:?}", c.invariants);
        assert_eq!(c.sum.submitted, 120);
        assert_eq!(c.sum.finished + c.sum.failed + c.sum.cancelled, 120);
        assert_eq!(
            c.per_engine[1].tokens_recomputed,
            b["tokens_recomputed"].as_u64().unwrap()
        );
        assert!(c
            .per_engine
            .iter()
            .all(|r| r.accounted && r.invariants_ok && r.step_p99_us > 0.0));
        // The store counters come from each report's `kv` object: the sim store verifies
        // (no garbage in mode safe) and has no connections.
        for (row, v) in c.per_engine.iter().zip([&a, &b]) {
            assert_eq!(row.garbage_reads, Some(0));
            assert_eq!(row.chunks_loaded, v["kv"]["chunks_loaded"].as_u64());
            assert_eq!(row.kv_bytes_loaded, v["kv"]["kv_bytes_loaded"].as_u64());
            assert_eq!((row.reconnects, row.connect_failures), (None, None));
        }
    }
}
