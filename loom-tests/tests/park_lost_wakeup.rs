//! **Race: unpark against park** (`sync::park::Parker`, the parker the runtime's threads sleep
//! on, and `PhaseBarrier`'s sleeping waiters).
//!
//! * `unpark_before_or_during_park`: a waiter parks once; the other thread writes a block and
//!   a flag and unparks — before the waiter parks, while it is between its
//!   state change and its wait, or once it sleeps. The waiter must always wake (loom reports
//!   a thread asleep forever as a deadlock) and see both writes.
//! * `two_unparkers`: two threads each publish a value and unpark; the waiter parks until it
//!   has seen both (a second notification must be consumed, never erased: a park that
//!   resets the state with a plain store after seeing the first deadlocks here).
//! * `barrier_sleepers_wake`: three participants of one `PhaseBarrier` round (no spinning
//!   under loom, so the two early ones always sleep); everyone leaves, and each sees the
//!   others' writes from before the barrier.
//!
//! Catches: an unpark that signals without taking the lock (plant `unpark-no-lock`: the
//! notification falls between the sleeper's state change and its wait, and the sleeper never
//! wakes); a park that does not re-check under the lock; a departure not ordered after the
//! arrivals (plant `barrier-relaxed`).

#![cfg(kvsched_loom)]

use kvsched::sync::park::Parker;
use kvsched::sync::{thread, Arc, AtomicUsize, Ordering, PhaseBarrier};
use kvsched_loom_tests::{model, BlockContents};

#[test]
fn unpark_before_or_during_park() {
    model(|| {
        let parker = Parker::new();
        let unparker = parker.unparker();
        let data = Arc::new(BlockContents::new(0));
        let flag = Arc::new(AtomicUsize::new(0));
        let (d, f) = (Arc::clone(&data), Arc::clone(&flag));
        let t = thread::spawn(move || {
            d.write(7);
            f.store(1, Ordering::Relaxed);
            unparker.unpark();
        });
        // Returns only by consuming the one unpark, which orders the thread's writes (its
        // Release swap, the park's Acquire) before the reads below.
        parker.park();
        assert_eq!(flag.load(Ordering::Relaxed), 1);
        assert_eq!(data.read(), 7);
        t.join().unwrap();
    });
}

#[test]
fn two_unparkers() {
    model(|| {
        let parker = Parker::new();
        let seen = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let u = parker.unparker();
                let s = Arc::clone(&seen);
                thread::spawn(move || {
                    s.fetch_add(1, Ordering::Relaxed);
                    u.unpark();
                })
            })
            .collect();
        while seen.load(Ordering::Relaxed) < 2 {
            parker.park();
        }
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn barrier_sleepers_wake() {
    model(|| {
        let barrier = Arc::new(PhaseBarrier::new(3));
        let cells: Arc<Vec<BlockContents>> =
            Arc::new((0..3).map(|_| BlockContents::new(0)).collect());
        let handles: Vec<_> = (1..3)
            .map(|i| {
                let b = Arc::clone(&barrier);
                let c = Arc::clone(&cells);
                thread::spawn(move || {
                    c[i].write(i as u64);
                    b.wait();
                    assert_eq!(c[0].read(), 0);
                })
            })
            .collect();
        cells[0].write(0);
        barrier.wait();
        assert_eq!(cells[1].read() + cells[2].read(), 3);
        for h in handles {
            h.join().unwrap();
        }
    });
}
