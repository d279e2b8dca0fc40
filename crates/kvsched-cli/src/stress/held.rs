//! Arrivals held until the connector has asked a shared store about their prompt.
//!
//! On a store other engines write too (`--engines N`, or a `redis://` server of the user's),
//! what another engine saved is in no index of this one: the connector's lookup, which never
//! waits for the store, would miss it. So when a request arrives the engine calls
//! [`TierConnector::prefetch`] and submits the request once the probe is answered — or after
//! [`HOLD_BOUND`], whichever comes first — and the request's lookup then offers what the
//! store held. The step never waits: the request does, and its wait is in its time from
//! arrival to first schedule. On a store only this engine writes, arrivals are submitted at
//! once (its index already knows what it saved).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::config::StressConfig;
use super::store::StoreSpec;
use super::workload::Generated;
use kvsched::kv::{Prefetch, TierConnector};

/// The longest a request is held for its probe.
pub(super) const HOLD_BOUND: Duration = Duration::from_millis(5);

/// The arrivals waiting for their probe, in arrival order.
pub(super) struct Held {
    on: bool,
    /// Each request, its arrival, when it was held and its probe.
    queue: VecDeque<(Generated, Instant, Instant, Prefetch)>,
    /// The prompt tokens of the requests in `queue`.
    tokens: u64,
}

impl Held {
    /// Holding is on for a store other engines may write: a `redis://` server (every engine
    /// of `--engines` runs on one).
    pub(super) fn new(cfg: &StressConfig) -> Held {
        Held {
            on: matches!(cfg.store, StoreSpec::RedisUrl { .. }),
            queue: VecDeque::new(),
            tokens: 0,
        }
    }

    /// A request arrived at `arrival`: its probe is asked for.
    pub(super) fn arrive(&mut self, g: Generated, arrival: Instant, conn: &TierConnector) {
        let probe = if self.on {
            conn.prefetch(&g.req.prompt)
        } else {
            Prefetch::default()
        };
        self.tokens += g.req.prompt.len() as u64;
        self.queue.push_back((g, arrival, Instant::now(), probe));
    }

    /// The first held request if its probe is answered or it has waited [`HOLD_BOUND`].
    pub(super) fn pop_ready(&mut self, now: Instant) -> Option<(Generated, Instant)> {
        let (_, _, held_at, probe) = self.queue.front()?;
        if !probe.is_ready() && now.saturating_duration_since(*held_at) < HOLD_BOUND {
            return None;
        }
        let (g, at, _, _) = self.queue.pop_front()?;
        self.tokens -= g.req.prompt.len() as u64;
        Some((g, at))
    }

    /// The prompt tokens of the requests held.
    pub(super) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Requests held.
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }
}
