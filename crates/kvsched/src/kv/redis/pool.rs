//! A bounded connection pool for one node, with the node's reconnect backoff.
//!
//! At most `cap` connections exist at once (idle, checked out, or being connected). A
//! checkout takes an idle connection, or connects a new one while below `cap`, or waits (up to
//! the checkout timeout) for one to come back. After a failure ([`Pool::mark_down`], or a
//! failed connect) the node is *down* for a backoff delay: `initial`, doubling with each
//! consecutive failure, capped at `max`; a checkout while down fails at once, without
//! connecting, so a call never blocks on a dead node past its timeouts. The first checkout
//! after the delay tries again; a successful connect clears the failure count.
//!
//! Every failure also bumps the pool's *epoch* and drops the idle connections: a connection
//! checked out before the failure is dropped, not pooled, when it comes back. The pool is
//! generic over the connection type so its rules are tested without a server.

use std::time::{Duration, Instant};

use crate::sync::condvar::Condvar;
use crate::sync::Mutex;

/// The backoff delay after `failures` consecutive failures (`failures ≥ 1`): `initial ·
/// 2^(failures−1)`, at most `max`. Never overflows.
pub(crate) fn backoff_delay(initial: Duration, max: Duration, failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(31);
    initial
        .checked_mul(1u32 << shift)
        .map_or(max, |d| d.min(max))
}

/// Why a checkout failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CheckoutError {
    /// The node is backing off after a failure; `retry_in` is what is left of the delay and
    /// `last` the failure's (already redacted) text.
    Down { retry_in: Duration, last: String },
    /// No connection came free within the checkout timeout.
    Busy(Duration),
    /// Connecting failed (the node is now down); the connector's error.
    Connect(String),
    /// The caller gave up while connecting (its cancel token fired, or its own deadline
    /// passed before the connect timeout did): the node is not blamed.
    GaveUp {
        /// Whether the token fired (else the deadline passed).
        cancelled: bool,
    },
}

/// Why a connect failed, as the pool's `connect` callback says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConnectError {
    /// The node failed to connect (refused, reset, a failed handshake, its connect timeout):
    /// it is down for the backoff.
    Node(String),
    /// The caller gave up first: the slot is freed, the node not marked down (a load's
    /// deadline passing during a slow handshake says nothing of the node).
    GaveUp {
        /// Whether the caller's token fired (else its deadline passed).
        cancelled: bool,
    },
}

impl From<String> for ConnectError {
    fn from(e: String) -> Self {
        ConnectError::Node(e)
    }
}

#[cfg(test)]
impl From<&str> for ConnectError {
    fn from(e: &str) -> Self {
        ConnectError::Node(e.to_owned())
    }
}

struct State<C> {
    idle: Vec<C>,
    /// Connections that exist or are being made: idle + checked out + connecting.
    live: usize,
    epoch: u64,
    failures: u32,
    down_until: Option<Instant>,
    last_error: String,
}

/// The pool. See the [module docs](self).
pub(crate) struct Pool<C> {
    state: Mutex<State<C>>,
    freed: Condvar,
    cap: usize,
    initial: Duration,
    max: Duration,
    checkout_timeout: Duration,
}

/// A checked-out connection; goes back to the pool when dropped (unless discarded, or the
/// pool failed since it was checked out).
pub(crate) struct Lease<'a, C> {
    pool: &'a Pool<C>,
    conn: Option<C>,
    epoch: u64,
    reused: bool,
}

impl<C> Lease<'_, C> {
    /// The connection.
    pub fn conn(&mut self) -> Option<&mut C> {
        self.conn.as_mut()
    }

    /// Whether the connection was taken from the idle list (it may have gone stale since it
    /// was last used) rather than connected for this checkout.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Drops the connection instead of returning it (it failed mid-request).
    pub fn discard(mut self) {
        self.conn = None;
    }
}

impl<C> Drop for Lease<'_, C> {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock();
        match self.conn.take() {
            Some(c) if self.epoch == st.epoch => st.idle.push(c),
            _ => st.live -= 1,
        }
        drop(st);
        self.pool.freed.notify_one();
    }
}

impl<C> Pool<C> {
    /// A pool of at most `cap` connections.
    pub fn new(cap: usize, initial: Duration, max: Duration, checkout_timeout: Duration) -> Self {
        Pool {
            state: Mutex::new(State {
                idle: Vec::new(),
                live: 0,
                epoch: 0,
                failures: 0,
                down_until: None,
                last_error: String::new(),
            }),
            freed: Condvar::new(),
            cap,
            initial,
            max,
            checkout_timeout,
        }
    }

    /// Takes a connection: idle, or new through `connect` (which bounds its own time), or the
    /// next one returned within the checkout timeout. Fails at once while the node is down.
    #[cfg(test)]
    pub fn checkout(
        &self,
        connect: impl FnOnce() -> Result<C, ConnectError>,
    ) -> Result<Lease<'_, C>, CheckoutError> {
        self.checkout_until(Instant::now() + self.checkout_timeout, connect)
    }

    /// [`checkout`](Self::checkout), waiting for a connection no later than `until` (the
    /// call's deadline) nor longer than the checkout timeout.
    pub fn checkout_until(
        &self,
        until: Instant,
        connect: impl FnOnce() -> Result<C, ConnectError>,
    ) -> Result<Lease<'_, C>, CheckoutError> {
        let deadline = until.min(Instant::now() + self.checkout_timeout);
        let mut st = self.state.lock();
        loop {
            if let Some(until) = st.down_until {
                let now = Instant::now();
                if now < until {
                    return Err(CheckoutError::Down {
                        retry_in: until - now,
                        last: st.last_error.clone(),
                    });
                }
            }
            if let Some(c) = st.idle.pop() {
                return Ok(Lease {
                    pool: self,
                    conn: Some(c),
                    epoch: st.epoch,
                    reused: true,
                });
            }
            if st.live < self.cap {
                st.live += 1;
                let epoch = st.epoch;
                drop(st);
                return match connect() {
                    Ok(c) => {
                        let mut st = self.state.lock();
                        st.failures = 0;
                        st.down_until = None;
                        Ok(Lease {
                            pool: self,
                            conn: Some(c),
                            epoch,
                            reused: false,
                        })
                    }
                    Err(e) => {
                        let mut st = self.state.lock();
                        st.live -= 1;
                        let e = match e {
                            // (Planted bug `redis-gave-up-marks-down`, scripts/plants.sh: a
                            // caller leaving mid-connect marks the node down.)
                            ConnectError::GaveUp { cancelled }
                                if !planted!("redis-gave-up-marks-down") =>
                            {
                                CheckoutError::GaveUp { cancelled }
                            }
                            ConnectError::GaveUp { .. } => {
                                self.fail(&mut st, "connect: the caller gave up".to_owned());
                                CheckoutError::Connect("connect: the caller gave up".to_owned())
                            }
                            ConnectError::Node(e) => {
                                self.fail(&mut st, e.clone());
                                CheckoutError::Connect(e)
                            }
                        };
                        drop(st);
                        self.freed.notify_all();
                        Err(e)
                    }
                };
            }
            let (g, timed_out) = self.freed.wait_until(st, Some(deadline));
            st = g;
            if timed_out && st.idle.is_empty() && st.live >= self.cap {
                return Err(CheckoutError::Busy(self.checkout_timeout));
            }
        }
    }

    /// Whether the node is down now (within the backoff of its last failure).
    pub fn is_down(&self) -> bool {
        self.state
            .lock()
            .down_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// Records a failure seen on a connection (I/O error, timeout): the node is down for the
    /// next backoff delay, idle connections are dropped, and so are those checked out now
    /// when they come back.
    pub fn mark_down(&self, error: String) {
        let mut st = self.state.lock();
        self.fail(&mut st, error);
        drop(st);
        self.freed.notify_all();
    }

    /// Drops the idle connections (and, when they come back, those checked out now) without
    /// counting a failure: one of them was found stale, the node itself may be fine.
    pub fn drop_idle(&self) {
        let mut st = self.state.lock();
        Self::new_epoch(&mut st);
        drop(st);
        self.freed.notify_all();
    }

    fn new_epoch(st: &mut State<C>) {
        st.epoch += 1;
        st.live -= st.idle.len();
        st.idle.clear();
    }

    fn fail(&self, st: &mut State<C>, error: String) {
        st.failures = st.failures.saturating_add(1);
        st.down_until = Some(Instant::now() + backoff_delay(self.initial, self.max, st.failures));
        st.last_error = error;
        Self::new_epoch(st);
    }

    /// (live connections, idle connections, consecutive failures), for tests and stats.
    pub fn census(&self) -> (usize, usize, u32) {
        let st = self.state.lock();
        (st.live, st.idle.len(), st.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{Arc, AtomicUsize, Ordering};

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_and_caps_without_overflow() {
        let (i, m) = (10 * MS, 1000 * MS);
        let d: Vec<u128> = (1..=9)
            .map(|f| backoff_delay(i, m, f).as_millis())
            .collect();
        assert_eq!(d, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(backoff_delay(i, m, u32::MAX), m);
        assert_eq!(backoff_delay(Duration::from_secs(3600), m, 40), m);
    }

    #[test]
    fn bounded_reuses_and_times_out_when_all_busy() {
        let pool: Pool<u32> = Pool::new(2, MS, MS, 30 * MS);
        let made = AtomicUsize::new(0);
        let connect = || {
            made.fetch_add(1, Ordering::Relaxed);
            Ok(7)
        };
        let a = pool.checkout(connect).unwrap();
        let b = pool.checkout(connect).unwrap();
        assert!(!a.reused() && !b.reused());
        assert_eq!(pool.census(), (2, 0, 0));
        // Full: the third waits out the checkout timeout, without connecting.
        assert_eq!(
            pool.checkout(connect).err(),
            Some(CheckoutError::Busy(30 * MS))
        );
        drop(a);
        let c = pool.checkout(connect).unwrap();
        assert!(c.reused());
        assert_eq!(made.load(Ordering::Relaxed), 2);
        c.discard();
        assert_eq!(pool.census(), (1, 0, 0));
        drop(b);
        assert_eq!(pool.census(), (1, 1, 0));
    }

    /// A caller leaving mid-connect frees its slot and blames nobody: the next checkout
    /// connects at once, where a node failure would have it refused as down.
    #[test]
    fn a_caller_giving_up_mid_connect_leaves_the_node_up() {
        let pool: Pool<u32> = Pool::new(1, Duration::from_secs(30), Duration::from_secs(30), MS);
        let e = pool
            .checkout(|| Err(ConnectError::GaveUp { cancelled: true }))
            .err();
        assert_eq!(e, Some(CheckoutError::GaveUp { cancelled: true }));
        assert_eq!(pool.census(), (0, 0, 0));
        assert!(!pool.is_down());
        assert!(pool.checkout(|| Ok(1)).is_ok());
        // A node failure does mark it down.
        let pool: Pool<u32> = Pool::new(1, Duration::from_secs(30), Duration::from_secs(30), MS);
        assert!(pool.checkout(|| Err("refused".into())).is_err());
        assert!(pool.is_down());
    }

    #[test]
    fn a_waiter_gets_the_connection_returned() {
        let pool: Arc<Pool<u32>> = Arc::new(Pool::new(1, MS, MS, Duration::from_secs(30)));
        let lease = pool.checkout(|| Ok(1)).unwrap();
        let p2 = Arc::clone(&pool);
        let waiter = crate::sync::thread::spawn(move || {
            p2.checkout(|| Err("must not connect".into()))
                .map(|l| l.reused())
        });
        // Returns the connection whether or not the waiter is already waiting: either way it
        // gets the idle connection and never connects.
        drop(lease);
        assert_eq!(waiter.join().unwrap(), Ok(true));
    }

    #[test]
    fn down_fails_fast_without_connecting_then_retries() {
        let pool: Pool<u32> = Pool::new(2, Duration::from_secs(60), Duration::from_secs(60), MS);
        let e = pool.checkout(|| Err("refused".into())).err();
        assert_eq!(e, Some(CheckoutError::Connect("refused".into())));
        // During the backoff: fails at once, the connector is not called.
        match pool.checkout(|| panic!("connected while down")) {
            Err(CheckoutError::Down { retry_in, last }) => {
                assert!(retry_in <= Duration::from_secs(60));
                assert_eq!(last, "refused");
            }
            other => panic!("{:?}", other.err()),
        }
        assert_eq!(pool.census(), (0, 0, 1));

        // A pool whose backoff has passed connects again and clears the count.
        let pool: Pool<u32> = Pool::new(2, MS, MS, MS);
        pool.mark_down("reset".into());
        let deadline = Instant::now() + Duration::from_secs(10);
        let lease = loop {
            match pool.checkout(|| Ok(3)) {
                Ok(l) => break l,
                Err(CheckoutError::Down { .. }) if Instant::now() < deadline => {
                    crate::sync::thread::sleep(MS)
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert!(!lease.reused());
        drop(lease);
        assert_eq!(pool.census(), (1, 1, 0));
    }

    #[test]
    fn a_failure_drops_idle_and_outstanding_connections() {
        let pool: Pool<u32> = Pool::new(3, MS, MS, MS);
        let a = pool.checkout(|| Ok(1)).unwrap();
        let b = pool.checkout(|| Ok(2)).unwrap();
        drop(a);
        assert_eq!(pool.census(), (2, 1, 0));
        pool.drop_idle();
        assert_eq!(pool.census(), (1, 0, 0));
        drop(b); // checked out before the new epoch: dropped, not pooled
        assert_eq!(pool.census(), (0, 0, 0));
    }
}
