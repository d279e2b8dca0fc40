//! The per-engine rows of the combined report, read from each engine's typed report, and
//! their sum (see [`combine`](super::combine) for the keys).

use serde::Serialize;

use super::super::report::{KvCounts, RunReport};
use super::combine::Exit;

/// One engine's row (or, as `sum`, every engine's).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Row {
    /// The engine (`null` in the sum).
    pub engine: Option<u8>,
    /// Its exit code (`null` if a signal killed it; in the sum, the worst, an engine a signal
    /// killed counted as 128 + the signal's number, as a shell shows it).
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

impl Row {
    /// Engine `index`'s row from its report `r` (`None` if it left none).
    pub fn of(index: u8, exit: Exit, r: Option<&RunReport>) -> Row {
        let report = r.is_some();
        let requests = r.map(|r| r.requests.clone()).unwrap_or_default();
        let kv = r.map(|r| &r.kv);
        // The store's counters, from the report's `kv` (`None` for a counter the store has
        // not, or without a report).
        let store = |get: fn(&KvCounts) -> Option<u64>| kv.and_then(get);
        let n = |get: fn(&RunReport) -> u64| r.map_or(0, get);
        let f = |get: fn(&RunReport) -> f64| r.map_or(0.0, get);
        Row {
            engine: Some(index),
            exit_code: exit.code,
            signal: exit.signal,
            report,
            submitted: requests.submitted,
            finished: requests.finished,
            failed: requests.failed,
            cancelled: requests.cancelled,
            accounted: report
                && requests
                    .finished
                    .checked_add(requests.failed)
                    .and_then(|x| x.checked_add(requests.cancelled))
                    == Some(requests.submitted),
            garbage_reads: store(|k| k.garbage_reads),
            cross_engine_hits: store(|k| Some(k.chunks_loaded_from_others)),
            chunks_loaded: store(|k| Some(k.chunks_loaded)),
            kv_bytes_loaded: store(|k| Some(k.kv_bytes_loaded)),
            checksum_failures: store(|k| Some(k.checksum_failures)),
            tier_errors: store(|k| Some(k.tier_errors)),
            reconnects: store(|k| k.reconnects),
            connect_failures: store(|k| k.connect_failures),
            tokens_recomputed: n(|r| r.tokens_recomputed),
            loads_failed: n(|r| r.loads.failed),
            completions_per_s: f(|r| r.completions_per_s),
            finished_per_s: f(|r| r.finished_per_s),
            step_p99_us: f(|r| r.step_overhead_us.p99),
            submit_to_schedule_p99_us: f(|r| r.submit_to_schedule_us.p99),
            invariants_ok: r.is_some_and(|r| r.invariants.ok),
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
            exit_code: rows
                .iter()
                .filter_map(|r| r.exit_code.or(r.signal.map(|s| 128 + s)))
                .max(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_shows_an_engine_a_signal_killed_as_its_worst_exit() {
        let ok = Row {
            exit_code: Some(0),
            ..Row::default()
        };
        let killed = Row {
            exit_code: None,
            signal: Some(9),
            ..Row::default()
        };
        assert_eq!(Row::sum(&[ok.clone(), killed]).exit_code, Some(137));
        assert_eq!(Row::sum(&[ok]).exit_code, Some(0));
    }
}
