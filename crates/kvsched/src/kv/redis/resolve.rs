//! A node's host name, resolved within a call's deadline. The system's resolver
//! (`getaddrinfo`, behind std's `to_socket_addrs`) blocks for as long as it takes and cannot
//! be interrupted, so a name is looked up on a thread of its own while the call sleeps until
//! the lookup ends, its cancel token fires (each wakes it) or its deadline passes. A call that
//! gives up leaves the lookup running; the next call waits for that same lookup, never
//! starting another: one lookup per node at a time, and at most [`MAX_LOOKUPS`] per tier.
//!
//! An answer is used for [`FRESH_FOR`]; after that the next call starts a new lookup and
//! connects to the addresses it has meanwhile, so a resolver slow then costs no call its
//! time. A lookup that fails keeps the addresses of the last one that did not. An IP address
//! is never looked up.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::conn::Budget;
use crate::sync::park::{Parker, Unparker};
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering};

/// How long a lookup's addresses are used before the name is looked up again.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(30);

/// The most lookups a tier runs at once (each on a thread of its own, one per node): a
/// resolver that never answers holds at most this many threads, however many names a
/// hostile cluster's redirects make the tier resolve.
pub(crate) const MAX_LOOKUPS: usize = 8;

/// Resolves `host:port`: the system's resolver, or a test's.
pub(crate) type ResolveFn = dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>> + Send + Sync;

/// The system's resolver.
pub(crate) fn system(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

/// A tier's resolver and its count of lookups under way.
pub(crate) struct Lookups {
    resolve: Box<ResolveFn>,
    under_way: AtomicUsize,
}

impl Lookups {
    pub fn new(resolve: Box<ResolveFn>) -> Lookups {
        Lookups {
            resolve,
            under_way: AtomicUsize::new(0),
        }
    }
}

/// What a node knows of its name.
#[derive(Default)]
struct State {
    /// The last addresses a lookup found, and when.
    addrs: Option<(Vec<SocketAddr>, Instant)>,
    /// The last lookup's error, if it failed.
    error: Option<String>,
    /// Lookups finished (a waiting call waits for this to change).
    finished: u64,
    /// Whether a lookup is under way.
    running: bool,
    /// The calls waiting for the lookup under way, each with its registration's number: the
    /// lookup's end wakes them. A call leaves the list as it stops waiting, so it holds no
    /// more entries than calls wait.
    waiters: Vec<(u64, Unparker)>,
    next_waiter: u64,
}

impl State {
    /// Records a lookup's end and wakes the calls waiting for it.
    fn finish(&mut self) {
        self.finished = self.finished.wrapping_add(1);
        self.running = false;
        // Planted bug `resolve-end-wakes-nobody` (scripts/plants.sh): the calls waiting for
        // the lookup sleep on until their deadline.
        if planted!("resolve-end-wakes-nobody") {
            return;
        }
        for (_, u) in &self.waiters {
            u.unpark();
        }
    }
}

/// One node's name, resolved.
pub(crate) struct Resolver {
    host: String,
    port: u16,
    /// `Some` for an IP address: never looked up.
    literal: Option<SocketAddr>,
    state: Arc<Mutex<State>>,
}

impl Resolver {
    pub fn new(host: &str, port: u16) -> Resolver {
        Resolver {
            host: host.to_owned(),
            port,
            literal: host
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, port)),
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// The node's addresses, by the call's deadline: an IP address at once; a name's fresh
    /// addresses at once; stale ones at once, a new lookup started; none yet, waiting for
    /// the lookup under way (started if none is). The error text says what ran out.
    pub fn addrs(
        &self,
        lookups: &Arc<Lookups>,
        budget: Budget<'_>,
    ) -> Result<Vec<SocketAddr>, String> {
        if let Some(a) = self.literal {
            return Ok(vec![a]);
        }
        // Planted bug `redis-resolve-unbounded` (scripts/plants.sh): the name is looked up
        // on the caller's thread, which waits for the resolver however long it takes.
        if planted!("redis-resolve-unbounded") {
            return (lookups.resolve)(&self.host, self.port).map_err(|e| format!("resolve: {e}"));
        }
        let lock = &*self.state;
        let mut st = lock.lock();
        if let Some((a, at)) = &st.addrs {
            if at.elapsed() < FRESH_FOR {
                return Ok(a.clone());
            }
        }
        // Lookups that ended before this call asked: their answers are not the one it waits for.
        let seen = st.finished;
        let mut refused = None;
        if !st.running {
            st.running = true;
            drop(st);
            refused = self.start(lookups).err();
            st = lock.lock();
            if let Some(e) = refused.as_ref().filter(|_| st.finished == seen) {
                // No thread took the lookup (the tier's are all busy): it ended, failed, for
                // the calls that came to wait on it meanwhile too.
                st.error = Some(e.clone());
                st.finish();
            }
        }
        if let Some((a, _)) = &st.addrs {
            return Ok(a.clone());
        }
        if let Some(e) = refused {
            return Err(e);
        }
        // Listed under the lock that `finish` takes, before `finished` is looked at: a lookup
        // that ends after the look wakes this call, one that ended before it is seen.
        let parker = Parker::new();
        let id = st.next_waiter;
        st.next_waiter = st.next_waiter.wrapping_add(1);
        st.waiters.push((id, parker.unparker()));
        // The cancel token wakes the call as it fires (a firing before this is seen by
        // `check`). Its watchers' lock is taken inside the node's, never the other way round.
        let _watch = budget.cancel.map(|c| c.watch(parker.unparker()));
        let answer = loop {
            if st.finished != seen {
                break match (&st.addrs, &st.error) {
                    (Some((a, _)), _) => Ok(a.clone()),
                    (None, Some(e)) => Err(e.clone()),
                    (None, None) => Err(format!("resolve {}: no address", self.host)),
                };
            }
            if let Err(e) = budget.check() {
                break Err(format!("resolve {}: {e}", self.host));
            }
            drop(st);
            crate::sync::park::count_wait();
            // Woken by the lookup's end or the token (an unpark before the park makes it
            // return at once), or at the deadline.
            // Planted bug `resolve-wait-polls` (scripts/plants.sh): the call wakes every
            // 20 ms to look again, as it once did.
            let poll = if planted!("resolve-wait-polls") {
                Duration::from_millis(20)
            } else {
                Duration::MAX
            };
            parker.park_timeout(budget.remaining().min(poll));
            st = lock.lock();
        };
        st.waiters.retain(|(w, _)| *w != id);
        answer
    }

    /// Starts a lookup on a thread of its own (the caller marked it running, and holds no
    /// lock: a thread that does not start ends the lookup at once, as [`Done`]). Fails when
    /// the tier's lookups are all under way or no thread can start.
    fn start(&self, lookups: &Arc<Lookups>) -> Result<(), String> {
        // Relaxed: a count bounding the threads; its own read-modify-writes are atomic.
        let claimed = lookups
            .under_way
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_LOOKUPS).then_some(n + 1)
            });
        if claimed.is_err() {
            return Err(format!(
                "resolve {}: {MAX_LOOKUPS} lookups under way already",
                self.host
            ));
        }
        let done = Done {
            host: self.host.clone(),
            state: Arc::clone(&self.state),
            lookups: Arc::clone(lookups),
            found: None,
        };
        let port = self.port;
        let spawned = crate::sync::thread::Builder::new()
            .name("kvsched-redis-resolve".into())
            .spawn(move || {
                let mut done = done;
                done.found = Some((done.lookups.resolve)(&done.host, port));
            });
        // A thread that did not start dropped its `Done`, which ended the lookup.
        spawned
            .map(drop)
            .map_err(|e| format!("resolve {}: no thread for the lookup: {e}", self.host))
    }
}

/// A lookup's end, when its thread is done with it (a resolver that panicked included): its
/// answer recorded, the node's waiting calls woken, the tier's count lowered.
struct Done {
    host: String,
    state: Arc<Mutex<State>>,
    lookups: Arc<Lookups>,
    found: Option<std::io::Result<Vec<SocketAddr>>>,
}

impl Drop for Done {
    fn drop(&mut self) {
        let mut st = self.state.lock();
        match self.found.take() {
            Some(Ok(a)) if !a.is_empty() => {
                st.addrs = Some((a, Instant::now()));
                st.error = None;
            }
            Some(Ok(_)) => st.error = Some(format!("resolve {}: no address", self.host)),
            Some(Err(e)) => st.error = Some(format!("resolve {}: {e}", self.host)),
            None => st.error = Some(format!("resolve {}: the lookup failed", self.host)),
        }
        st.finish();
        drop(st);
        // Relaxed: see the claim in `start`.
        self.lookups.under_way.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
