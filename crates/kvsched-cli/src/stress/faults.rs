//! `--faults`: the fault rates and their parsing, and the connector side of the injection (a
//! fault-injecting wrapper around the run's [`TierConnector`]). The engine side (late
//! cancels, duplicate outputs, stale blocks, client cancels) is in the engine loop; the store
//! faults (`corrupt`, `truncate`, `evict`, `slow`) act on the stored bytes through a
//! [`FaultyTier`](kvsched_testkit::FaultyTier) (see `store`).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use serde::Serialize;

use super::config::{StressConfig, HANG_DEADLINES};
use super::prompt_sources::{filled_until, LoadEvent};
use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult, Prepared};
use kvsched::kv::TierConnector;
use kvsched_testkit::hash_str;
use kvsched_testkit::{SimulatedPanic, SplitMix64};
use parking_lot::Mutex;

/// How long a hung load (`deadline=R`) sleeps past the run's end at most: enough to outlast
/// its deadline, which the run's end bounds.
const HANG_PAST_END: Duration = Duration::from_millis(10);

/// The fault names of `--faults`, in order.
pub const FAULT_NAMES: [&str; 10] = [
    "deadline",
    "panic",
    "late",
    "duplicate",
    "stale",
    "cancel",
    "corrupt",
    "truncate",
    "evict",
    "slow",
];

/// Fault rates of `--faults deadline=R,panic=R,late=R,duplicate=R,stale=R,cancel=R,
/// corrupt=R,truncate=R,evict=R,slow=R` (each 0–1; a fault not named is off). See
/// [`StressConfig::faults`] for what each one injects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Faults {
    /// Share of asynchronous loads that hang past the load deadline.
    pub deadline: f64,
    /// Share of asynchronous loads that panic inside the connector.
    pub panic: f64,
    /// Share of requests with an asynchronous load the engine cancels right after dispatch.
    pub late: f64,
    /// Share of steps whose engine output is reported twice.
    pub duplicate: f64,
    /// Share of steps whose engine output names a stale block.
    pub stale: f64,
    /// Share of requests the client cancels at a random later step.
    pub cancel: f64,
    /// Share of stored chunks with a bit flipped at rest (real stores).
    pub corrupt: f64,
    /// Share of stored chunks cut short at rest (real stores).
    pub truncate: f64,
    /// Share of chunk reads that find the chunk deleted since the lookup (real stores).
    pub evict: f64,
    /// Share of chunk reads that delay their load past the load deadline (real stores).
    pub slow: f64,
}

impl Faults {
    pub(super) fn rates(&self) -> [f64; 10] {
        [
            self.deadline,
            self.panic,
            self.late,
            self.duplicate,
            self.stale,
            self.cancel,
            self.corrupt,
            self.truncate,
            self.evict,
            self.slow,
        ]
    }

    /// Whether a fault on a real store's bytes is on.
    pub(super) fn has_store_faults(&self) -> bool {
        self.corrupt > 0.0 || self.truncate > 0.0 || self.evict > 0.0 || self.slow > 0.0
    }
}

impl FromStr for Faults {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let names =
            "deadline, panic, late, duplicate, stale, cancel, corrupt, truncate, evict or slow";
        if s.trim().is_empty() {
            return Err(format!(
                "expected NAME=RATE[,NAME=RATE...] with NAME one of {names}, got an empty list"
            ));
        }
        let mut f = Faults::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (name, rate) = part.split_once('=').ok_or_else(|| {
                format!("`{part}`: missing `=` (expected NAME=RATE, e.g. panic=0.01)")
            })?;
            let name = name.trim();
            let slot = match name {
                "deadline" => &mut f.deadline,
                "panic" => &mut f.panic,
                "late" => &mut f.late,
                "duplicate" => &mut f.duplicate,
                "stale" => &mut f.stale,
                "cancel" => &mut f.cancel,
                "corrupt" => &mut f.corrupt,
                "truncate" => &mut f.truncate,
                "evict" => &mut f.evict,
                "slow" => &mut f.slow,
                _ => return Err(format!("unknown fault `{name}` (expected {names})")),
            };
            if seen.contains(&name) {
                return Err(format!("fault `{name}` given twice"));
            }
            seen.push(name);
            let rate = rate.trim();
            *slot = rate
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("{name}: expected a rate from 0 to 1, got `{rate}`"))?;
        }
        Ok(f)
    }
}

/// The run's [`TierConnector`] wrapped with the connector-side faults of `--faults`, on the
/// scheduler's workers only (the engine runs its sync loads on the connector itself): each
/// asynchronous load draws, from its own seeded stream per (request, attempt), whether it
/// panics (`panic=R`) or hangs for `hang` (`deadline=R`), counting both exactly; every other
/// load is the connector's. A hung load then runs, past its deadline: it finds its
/// cancellation fired and fails every block. With `late=R` it also records the requests it
/// offers an asynchronous load, for the engine to cancel.
///
/// The faults are decided here rather than in the [`SimTier`](kvsched_testkit::SimTier), which
/// decides per tier call: a sync load calls the same tier on the engine's thread, where a
/// panic would end the engine and a hang stall its step, while `deadline` and `panic` are
/// faults of the runtime's asynchronous loads (what its deadline and worker catch exist for).
pub(super) struct FaultConnector {
    pub(super) inner: Arc<TierConnector>,
    seed: u64,
    hang_rate: f64,
    panic_rate: f64,
    hang: Duration,
    record_offers: bool,
    /// When the run's `--duration` is up: no load waits for the store past it.
    run_end: Mutex<Option<Instant>>,
    pub(super) hangs: AtomicU64,
    pub(super) panics: AtomicU64,
    pub(super) offers: SegQueue<Arc<str>>,
    /// Every load a worker started, and again once it returned, with how far it filled its
    /// blocks: request and token range, for the prompt-token sources.
    pub(super) started: SegQueue<(Arc<str>, u64, u64, LoadEvent)>,
}

impl FaultConnector {
    pub(super) fn new(cfg: &StressConfig, inner: Arc<TierConnector>) -> Self {
        let f = cfg.fault_rates();
        let hang = cfg
            .effective_load_deadline()
            .map_or(Duration::from_millis(50), |d| {
                d.saturating_mul(HANG_DEADLINES)
            });
        FaultConnector {
            inner,
            seed: cfg.seed ^ 0xFA17_C044,
            hang_rate: f.deadline,
            panic_rate: f.panic,
            hang,
            record_offers: f.late > 0.0,
            run_end: Mutex::new(None),
            hangs: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            offers: SegQueue::new(),
            started: SegQueue::new(),
        }
    }
}

impl FaultConnector {
    /// The run's `--duration` is up at `end`: loads stop waiting for the store then.
    pub(super) fn set_run_end(&self, end: Instant) {
        *self.run_end.lock() = Some(end);
    }

    /// `job` with its deadline no later than the run's end (a copy only when it has to be
    /// earlier), so that a load on a slow store does not outlast `--duration`.
    fn bounded<'j>(&self, job: &'j LoadJob) -> std::borrow::Cow<'j, LoadJob> {
        match *self.run_end.lock() {
            Some(end) if job.deadline.is_none_or(|d| d > end) => {
                let mut j = job.clone();
                j.deadline = Some(end);
                std::borrow::Cow::Owned(j)
            }
            _ => std::borrow::Cow::Borrowed(job),
        }
    }
}

/// `job`'s deadline moved to `end` if it is later (or unset): a sync load's wait for the
/// store ends with the run's `--duration`.
pub(super) fn bound_deadline(job: &mut LoadJob, end: Instant) {
    if job.deadline.is_none_or(|d| d > end) {
        job.deadline = Some(end);
    }
}

impl KvConnector for FaultConnector {
    fn prepare(&self, request: &str, prompt: &[u32]) -> Option<Prepared> {
        self.inner.prepare(request, prompt)
    }

    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        let r = self.inner.lookup(q);
        if self.record_offers && r.load_async && r.external_tokens > 0 {
            self.offers.push(q.request.into());
        }
        r
    }

    fn load(&self, job: &LoadJob) -> LoadResult {
        self.started.push((
            job.request.clone(),
            job.start_tokens,
            job.end_tokens,
            LoadEvent::Started,
        ));
        if self.hang_rate > 0.0 || self.panic_rate > 0.0 {
            let mut rng = SplitMix64::new(
                self.seed
                    ^ hash_str(&job.request).rotate_left(29)
                    ^ u64::from(job.attempt)
                        .wrapping_add(1)
                        .wrapping_mul(0xD6E8_FEB8_6659_FD93),
            );
            let (p, h) = (rng.unit(), rng.unit());
            if p < self.panic_rate {
                self.panics.fetch_add(1, Ordering::Relaxed);
                std::panic::panic_any(SimulatedPanic);
            }
            if h < self.hang_rate {
                self.hangs.fetch_add(1, Ordering::Relaxed);
                // Never past the run's end: the hang outlasts the load's deadline anyway.
                let hang = match *self.run_end.lock() {
                    Some(end) => self
                        .hang
                        .min(end.saturating_duration_since(Instant::now()) + HANG_PAST_END),
                    None => self.hang,
                };
                std::thread::sleep(hang);
            }
        }
        let result = self.inner.load(&self.bounded(job));
        let filled = match &result {
            LoadResult::Ok => job.end_tokens,
            LoadResult::Failed(bad) => filled_until(job, &bad.clone().into_flat()),
        };
        self.started.push((
            job.request.clone(),
            job.start_tokens,
            job.end_tokens,
            LoadEvent::Filled(filled),
        ));
        result
    }
}

/// Installs (once per process) a panic hook that prints nothing for [`SimulatedPanic`]
/// payloads and defers to the previous hook for every other panic.
pub(super) fn silence_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<SimulatedPanic>() {
                prev(info);
            }
        }));
    });
}

/// A uniform draw in `[0, 1)` that depends on the seed, a salt and a request id only.
pub(super) fn draw_for(seed: u64, salt: u64, id: &str) -> f64 {
    SplitMix64::new(seed ^ salt ^ hash_str(id).rotate_left(7)).unit()
}
