use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::*;
use crate::connector::CancelToken;
use crate::kv::redis::{RedisConfig, RedisTier};
use crate::kv::{ChunkKey, Tier, TierError};
use crate::sync::condvar::Condvar;

/// A resolver that answers only once the test opens its gate (or 5 s pass), counting its
/// lookups: a system resolver waiting on a DNS server that does not answer.
#[derive(Clone, Default)]
struct Gated {
    open: Arc<(Mutex<bool>, Condvar)>,
    calls: Arc<AtomicUsize>,
}

impl Gated {
    fn resolve(&self) -> Box<ResolveFn> {
        let me = self.clone();
        Box::new(move |_host, port| {
            // Relaxed: a count the test reads after the lookups it waits for.
            me.calls.fetch_add(1, Ordering::Relaxed);
            let (lock, cv) = &*me.open;
            let give_up = Instant::now() + Duration::from_secs(5);
            let mut open = lock.lock();
            while !*open && Instant::now() < give_up {
                open = cv.wait_until(open, Some(give_up)).0;
            }
            Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
        })
    }

    fn open(&self) {
        *self.open.0.lock() = true;
        self.open.1.notify_all();
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }
}

fn budget(ms: u64) -> Budget<'static> {
    Budget {
        deadline: Instant::now() + Duration::from_millis(ms),
        cancel: None,
    }
}

/// A get on a node named by a host name whose resolver never answers ends by the call's
/// deadline, a timeout, and so does the next one, without a second lookup.
#[test]
fn a_resolver_that_never_answers_costs_a_call_no_more_than_its_deadline() {
    let gated = Gated::default();
    let cfg = RedisConfig::standalone("redis.invalid:28001")
        .unwrap()
        .io_timeout(Duration::from_millis(300));
    let tier = RedisTier::with_resolver(cfg, gated.resolve()).unwrap();
    for _ in 0..2 {
        let t0 = Instant::now();
        let r = tier.get(&[ChunkKey(1)], &CancelToken::new());
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(900), "took {took:?}");
        assert!(matches!(r, Err(TierError::Timeout(_))), "{r:?}");
    }
    assert_eq!(
        gated.calls(),
        1,
        "one lookup for the node, however many calls wait"
    );
    gated.open();
}

/// A call whose token fired before it asked ends at once.
#[test]
fn a_cancel_ends_a_wait_for_a_lookup() {
    let gated = Gated::default();
    let lookups = Arc::new(Lookups::new(gated.resolve()));
    let r = Resolver::new("redis.invalid", 1);
    let token = CancelToken::new();
    token.cancel();
    let t0 = Instant::now();
    let got = r.addrs(
        &lookups,
        Budget {
            deadline: Instant::now() + Duration::from_secs(5),
            cancel: Some(&token),
        },
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(got.is_err_and(|e| e.contains("cancelled")));
    gated.open();
}

/// A call waiting for a lookup that will not answer for seconds: on its own thread, with a
/// 5 s deadline and `token`; returns its answer, how long it took, and how many times it went
/// to sleep.
fn wait_on_a_slow_lookup(
    gated: &Gated,
    token: &CancelToken,
) -> std::thread::JoinHandle<(Result<Vec<SocketAddr>, String>, Duration, usize)> {
    let lookups = Arc::new(Lookups::new(gated.resolve()));
    let token = token.clone();
    let handle = std::thread::spawn(move || {
        let r = Resolver::new("redis.invalid", 1);
        let t0 = Instant::now();
        let got = r.addrs(
            &lookups,
            Budget {
                deadline: t0 + Duration::from_secs(5),
                cancel: Some(&token),
            },
        );
        (got, t0.elapsed(), crate::sync::park::waits())
    });
    while gated.calls() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Time for the call to fall asleep: one that polled would wake again and again.
    std::thread::sleep(Duration::from_millis(100));
    handle
}

/// A cancel fired while a call waits for a lookup wakes the call at once: it goes to sleep
/// once (not once per poll) and returns long before its deadline.
#[test]
fn a_cancel_wakes_a_call_waiting_for_a_lookup() {
    let gated = Gated::default();
    let token = CancelToken::new();
    let caller = wait_on_a_slow_lookup(&gated, &token);
    token.cancel();
    let (got, took, waits) = caller.join().unwrap();
    gated.open();
    assert!(got.is_err_and(|e| e.contains("cancelled")));
    assert!(
        took < Duration::from_secs(2),
        "the cancel woke nobody: {took:?}"
    );
    assert!(waits <= 2, "the call woke {waits} times before its cancel");
}

/// A lookup's end wakes the calls waiting for it at once, with its answer.
#[test]
fn a_lookups_end_wakes_the_calls_waiting_for_it() {
    let gated = Gated::default();
    let caller = wait_on_a_slow_lookup(&gated, &CancelToken::new());
    gated.open();
    let (got, took, waits) = caller.join().unwrap();
    assert_eq!(got, Ok(vec![SocketAddr::from(([127, 0, 0, 1], 1))]));
    assert!(
        took < Duration::from_secs(2),
        "the lookup woke nobody: {took:?}"
    );
    assert!(waits <= 2, "the call woke {waits} times before the answer");
}

/// A lookup that answers after its caller left serves the next call at once, and for
/// `FRESH_FOR` no other lookup runs; past it, the old answer serves while a new lookup runs.
#[test]
fn a_late_answer_is_kept_and_served_while_the_next_lookup_runs() {
    let gated = Gated::default();
    let lookups = Arc::new(Lookups::new(gated.resolve()));
    let r = Resolver::new("redis.invalid", 7);
    assert!(r.addrs(&lookups, budget(50)).is_err());
    gated.open();
    let want = vec![SocketAddr::from(([127, 0, 0, 1], 7))];
    let t0 = Instant::now();
    let got = loop {
        match r.addrs(&lookups, budget(50)) {
            Ok(a) => break a,
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(5), "{e}"),
        }
    };
    assert_eq!(got, want);
    assert_eq!(r.addrs(&lookups, budget(50)).as_ref(), Ok(&want));
    assert_eq!(gated.calls(), 1);
    // Stale now: served at once, a new lookup started (the gate is shut again: it hangs).
    *gated.open.0.lock() = false;
    if let Some((_, at)) = &mut r.state.lock().addrs {
        *at = Instant::now()
            .checked_sub(FRESH_FOR + Duration::from_secs(1))
            .unwrap();
    }
    let t0 = Instant::now();
    assert_eq!(r.addrs(&lookups, budget(5000)).as_ref(), Ok(&want));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    while gated.calls() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(5), "no new lookup");
        crate::sync::thread::sleep(Duration::from_millis(5));
    }
    gated.open();
}

/// An IP address is never looked up; a tier's lookups stop at `MAX_LOOKUPS`, the next name
/// refused at once.
#[test]
fn addresses_are_not_looked_up_and_lookups_are_bounded() {
    let gated = Gated::default();
    let lookups = Arc::new(Lookups::new(gated.resolve()));
    for host in ["127.0.0.1", "::1"] {
        assert!(Resolver::new(host, 9).addrs(&lookups, budget(10)).is_ok());
    }
    assert_eq!(gated.calls(), 0);
    let names: Vec<Resolver> = (0..=MAX_LOOKUPS)
        .map(|i| Resolver::new(&format!("n{i}.invalid"), 1))
        .collect();
    for r in &names[..MAX_LOOKUPS] {
        assert!(r.addrs(&lookups, budget(1)).is_err());
    }
    let t0 = Instant::now();
    let e = names[MAX_LOOKUPS]
        .addrs(&lookups, budget(5000))
        .unwrap_err();
    assert!(e.contains("lookups under way"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    gated.open();
    // The lookups end and free their places.
    let t0 = Instant::now();
    while lookups.under_way.load(Ordering::Relaxed) > 0 {
        assert!(t0.elapsed() < Duration::from_secs(5));
        crate::sync::thread::sleep(Duration::from_millis(5));
    }
    assert!(names[MAX_LOOKUPS].addrs(&lookups, budget(5000)).is_ok());
}
