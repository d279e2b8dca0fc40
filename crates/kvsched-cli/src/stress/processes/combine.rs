//! The combined report of `kvsched stress --engines N`: each engine's JSON report read back
//! into its type (a [`RunReport`]), a row per engine, their sum, the merged reports, the
//! restarts, the request accounting of every engine, the verdict and the exit code.
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
//! * `total`: the engines' reports merged field by field (the rules are in
//!   [`merge`](mod@super::super::merge)), `null` without reports;
//! * `trace_reference`: on a trace, what a prefix cache could serve of all the engines'
//!   requests (the keys of an engine's `config.trace_reference`, computed on every request
//!   replayed), `null` without a trace;
//! * `invariants`: `{ok, violations}` — the engines' own violations prefixed `e{i}: `, and
//!   the parent's (an engine without a report, one whose requests do not add up, garbage
//!   reads in mode `safe`, an engine killed as overdue, a restart that did not happen);
//! * `exit_code`: what the parent exits with.

use serde::Serialize;
use serde_json::error::Category;

use super::super::report::RunReport;
use super::super::store::StoreSpec;
use super::super::trace_reference::TraceReference;
use super::args::Plan;
use super::rows::Row;

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
    /// The store is the user's (a `redis://` server, a directory): chunks an earlier run
    /// saved there count among the cross-engine hits, as no engine of this run saved them.
    #[serde(skip)]
    pub store_outlives_run: bool,
    /// Every engine's requests add up.
    pub every_request_accounted: bool,
    /// The engines' reports merged.
    pub total: Option<RunReport>,
    /// On a trace, the reference of every engine's requests together.
    pub trace_reference: Option<TraceReference>,
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
        let parsed: Vec<Option<RunReport>> = outcomes
            .iter()
            .map(|o| {
                if o.stdout.is_empty() {
                    parent.push(format!(
                        "engine {}: no report ({}){}",
                        o.index,
                        exit_text(o.exit),
                        last_line(&o.stderr_tail)
                    ));
                    return None;
                }
                match serde_json::from_slice::<RunReport>(&o.stdout) {
                    Ok(mut r) => {
                        // An engine's top level is kvsched's run (the baseline's, if any,
                        // is under `baseline` and not read).
                        r.scheduler = "kvsched";
                        return Some(r);
                    }
                    Err(e) if e.classify() == Category::Data => parent.push(format!(
                        "engine {}: its report is not a stress report ({e})",
                        o.index
                    )),
                    Err(e) => parent.push(format!(
                        "engine {}: its report is not JSON ({e}; {}){}",
                        o.index,
                        exit_text(o.exit),
                        if o.stdout_cut { ", cut at its cap" } else { "" }
                    )),
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
                engines.extend(v.invariants.violations.iter().map(|s| format!("e{i}: {s}")));
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
        let reports: Vec<(u8, &RunReport)> = outcomes
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
            store_outlives_run: matches!(
                plan.store,
                StoreSpec::RedisUrl { .. } | StoreSpec::Disk(_)
            ),
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
            total: RunReport::merge_engines(&reports),
            trace_reference: None,
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
                thousands(row.step_p99_us.round() as u64),
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
                "cross-engine hit ratio: {x:.3} (of {} chunks loaded, the share another engine{} saved)\n",
                thousands(l),
                if self.store_outlives_run {
                    " or an earlier run on this store"
                } else {
                    ""
                }
            )),
            _ => out.push_str("cross-engine hit ratio: — (no chunks loaded)\n"),
        }
        if let Some(t) = &self.total {
            prompt_lines(t, self.trace_reference.as_ref(), &mut out);
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

/// The prompt tokens of every engine's finished requests by source (device prefix cache,
/// tier, computed), as the report of one run gives them, and on a trace the reference of all
/// the engines' requests.
fn prompt_lines(total: &RunReport, reference: Option<&TraceReference>, out: &mut String) {
    let p = &total.prompt_tokens;
    let pct = |n: u64| format!("{:.1}%", n as f64 * 100.0 / p.total.max(1) as f64);
    out.push_str(&format!(
        "prompt tokens of the {} finished requests of every engine, by source\n",
        thousands(p.requests)
    ));
    let rows = [
        ("prompt tokens", p.total, String::new()),
        ("device prefix cache", p.device_hit, pct(p.device_hit)),
        ("tier (loaded)", p.tier_hit, pct(p.tier_hit)),
        ("computed", p.computed, pct(p.computed)),
        (
            "of which after a failed load",
            p.computed_after_failed_load,
            pct(p.computed_after_failed_load),
        ),
    ];
    let width = rows
        .iter()
        .map(|(_, n, _)| thousands(*n).len())
        .max()
        .unwrap_or(0);
    for (label, n, share) in rows {
        let line = format!("  {label:<30}{:>width$}  {share:>6}", thousands(n));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if let Some(t) = reference {
        let served = p.device_hit.saturating_add(p.tier_hit);
        let share = served as f64 / p.total.max(1) as f64;
        out.push_str(&format!(
            "reference, the trace's {} requests of every engine on its 512-token blocks: a prefix cache would serve {:.1}% if unbounded; the engines served {:.1}% from cache, {:.0}% of the unbounded share\n",
            thousands(t.requests),
            t.infinite_cache_share * 100.0,
            share * 100.0,
            share / t.infinite_cache_share.max(1e-9) * 100.0,
        ));
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
#[path = "combine_tests.rs"]
mod tests;
