//! A connector's panic costs what the docs say whatever its payload: a `load` panic fails the
//! load and the worker lives on, a `lookup` panic offers nothing, a `prepare` panic leaves the
//! request unprepared — each counted in `connector_panics` — even when the panic's payload, or
//! the value `prepare` handed over, panics again as it is dropped. Such a second panic used to
//! unwind past the catch: it killed the worker (the load never completed), poisoned the
//! runtime from a lookup, and made `submit` and `shutdown` panic (plants
//! `panic-payload-dropped-bare`, `connector-value-dropped-bare`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, Prepared};
use kvsched::{Runtime, Settings, StepOutput};

mod support;
use support::{guarded, req};

/// Panics when dropped (unless the thread is already unwinding, which would abort).
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("a bomb, dropped");
        }
    }
}

/// Where the connector plants its bomb.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Where {
    /// `load` panics with a `Bomb` payload (its first call).
    LoadPayload,
    /// `lookup` panics with a `Bomb` payload (its first call).
    LookupPayload,
    /// `prepare` panics with a `Bomb` payload (every call).
    PreparePayload,
    /// `prepare` hands over a `Bomb` (every call), dropped when the request is admitted.
    PreparedValue,
}

struct Hostile {
    at: Where,
    calls: AtomicU64,
}

impl Hostile {
    fn first(&self, at: Where) -> bool {
        self.at == at && self.calls.fetch_add(1, Ordering::Relaxed) == 0
    }
}

impl KvConnector for Hostile {
    fn prepare(&self, _: &str, _: &[u32]) -> Option<Prepared> {
        match self.at {
            Where::PreparePayload => std::panic::panic_any(Bomb),
            Where::PreparedValue => Some(Arc::new(Bomb)),
            _ => None,
        }
    }
    fn lookup(&self, _: LookupQuery<'_>) -> LookupResult {
        if self.first(Where::LookupPayload) {
            std::panic::panic_any(Bomb);
        }
        LookupResult {
            external_tokens: 64,
            load_async: true,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        if self.first(Where::LoadPayload) {
            std::panic::panic_any(Bomb);
        }
        LoadResult::Ok
    }
}

/// What a run came to.
#[derive(Debug)]
struct Outcome {
    finished: u64,
    connector_panics: u64,
    violations: Vec<String>,
}

/// Three requests on one worker with no load deadline (a load that never completes keeps its
/// request live for good), driven to the end under the hang guard; `Err` names what went
/// wrong (a panic escaping the runtime fails the guard).
fn run(at: Where) -> Result<Outcome, String> {
    guarded(&format!("{at:?}"), move || {
        let mut rt = Runtime::builder()
            .shards(1)
            .workers(1)
            .settings(Settings::default().with_load_deadline(None))
            .shutdown_timeout(Duration::from_secs(2))
            .connector(Arc::new(Hostile {
                at,
                calls: AtomicU64::new(0),
            }))
            .build()
            .map_err(|e| e.to_string())?;
        for i in 0..3 {
            rt.submit(req(&format!("r{i}"), (0..100).collect(), 2))
                .map_err(|e| format!("submit r{i}: {e}"))?;
        }
        let mut out = StepOutput::default();
        for _ in 0..2_000 {
            if rt.live() == 0 {
                break;
            }
            rt.update(std::mem::take(&mut out));
            let plan = rt.schedule().map_err(|e| format!("schedule: {e}"))?;
            out = StepOutput::all_sampled(&plan);
            if plan.scheduled.is_empty() {
                rt.wait_for_work(Duration::from_millis(5));
            }
        }
        let live = rt.live();
        let report = rt.shutdown();
        if live > 0 {
            return Err(format!("{live} requests never finished"));
        }
        Ok(Outcome {
            finished: report.metrics.finished,
            connector_panics: report.metrics.connector_panics,
            violations: report.violations,
        })
    })
}

fn check(at: Where) {
    let o = run(at).unwrap_or_else(|e| panic!("{at:?}: {e}"));
    assert_eq!(o.finished, 3, "{at:?}: {o:?}");
    assert!(
        o.connector_panics >= 1,
        "{at:?}: the panic was not counted: {o:?}"
    );
    assert!(o.violations.is_empty(), "{at:?}: {o:?}");
}

#[test]
fn a_load_panic_whose_payload_panics_when_dropped_fails_the_load_and_the_worker_lives_on() {
    check(Where::LoadPayload);
}

#[test]
fn a_lookup_panic_whose_payload_panics_when_dropped_offers_nothing() {
    check(Where::LookupPayload);
}

#[test]
fn a_prepare_panic_whose_payload_panics_when_dropped_leaves_the_request_unprepared() {
    check(Where::PreparePayload);
}

#[test]
fn a_prepared_value_that_panics_when_dropped_is_counted_not_propagated() {
    check(Where::PreparedValue);
}
