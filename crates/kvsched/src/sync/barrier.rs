//! The phase barrier between the shards of one step.

use super::condvar::Condvar;
use super::{spin_hint, AtomicUsize, Mutex, Ordering};

/// Ordering of a waiter's departure load in [`PhaseBarrier::wait`]: Acquire. The planted bug
/// `barrier-relaxed` (loom demonstration, `loom-tests/plants.sh`) weakens it to Relaxed.
const BARRIER_DEPART: Ordering = if planted!("barrier-relaxed") {
    Ordering::Relaxed
} else {
    Ordering::Acquire
};

/// Spins a waiter makes before it sleeps (under loom: none, the model schedules threads).
#[cfg(not(kvsched_loom))]
const SPINS: u32 = 1 << 10;
#[cfg(kvsched_loom)]
const SPINS: u32 = 0;

/// A reusable barrier for the `n` participants of a step's phases: each `wait` returns once all
/// `n` have arrived. A waiter spins briefly, then sleeps on a condition variable; the last
/// arriver takes the lock and wakes them only when someone sleeps, so a barrier whose
/// participants arrive close together costs no system call, and one that waits long costs no
/// CPU.
///
/// The round number and the count of sleepers share one word, so a sleeper's registration and
/// the last arriver's round change are read-modify-writes of the same location: one is
/// ordered before the other, and either the sleeper sees the new round or the arriver sees the
/// sleeper (no reliance on SeqCst store–load ordering).
///
/// Memory: everything a participant did before `wait` happens-before everything every
/// participant does after it (Release on arrival, Acquire on departure).
#[derive(Debug)]
pub struct PhaseBarrier {
    n: usize,
    count: AtomicUsize,
    /// Round number (high bits, from [`ROUND`]) | waiters asleep or about to sleep (low bits).
    word: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// One round in [`PhaseBarrier::word`]; the bits below count sleepers (at most `n − 1`).
const ROUND: usize = 1 << 16;

impl PhaseBarrier {
    /// A barrier for `n` participants (`n ≤ 1`: `wait` returns at once; at most 65,536).
    pub fn new(n: usize) -> Self {
        PhaseBarrier {
            n: n.min(ROUND),
            count: AtomicUsize::new(0),
            word: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Arrives and waits for the others.
    pub fn wait(&self) {
        if self.n <= 1 {
            return;
        }
        // Acquire: pairs with the Release round change below, so a thread reads the round it
        // joins.
        let round = self.word.load(Ordering::Acquire) / ROUND;
        // AcqRel: the Release half publishes this thread's phase work to the last arriver;
        // the Acquire half lets the last arriver see everyone's.
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            // AcqRel: the Release half pairs with the waiters' departure loads, carrying every
            // arriver's work (acquired by the fetch_add above) to them; the Acquire half pairs
            // with a sleeper's registration CAS.
            let before = self.word.fetch_add(ROUND, Ordering::AcqRel);
            if before % ROUND > 0 {
                // Taken so the notification cannot fall between a sleeper's check of the
                // round and its wait (it checks under the lock).
                drop(self.lock.lock());
                self.cv.notify_all();
            }
            return;
        }
        for _ in 0..SPINS {
            // Acquire: pairs with the round change by the last arriver.
            if self.word.load(BARRIER_DEPART) / ROUND != round {
                return;
            }
            spin_hint();
        }
        let mut guard = self.lock.lock();
        // Register as a sleeper unless the round already changed.
        // Acquire: pairs with the round change by the last arriver.
        let mut cur = self.word.load(BARRIER_DEPART);
        loop {
            if cur / ROUND != round {
                return;
            }
            // Relaxed on success: the lock and the arriver's AcqRel RMW order what follows.
            // Acquire on failure: pairs with the round change (the loop re-checks the round).
            match self
                .word
                .compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, BARRIER_DEPART)
            {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
        // Acquire: pairs with the round change by the last arriver.
        while self.word.load(BARRIER_DEPART) / ROUND == round {
            guard = self.cv.wait(guard);
        }
        // Relaxed: the count of sleepers is only a hint to the next last arriver; a stale
        // one costs it a needless notify, never a lost one.
        self.word.fetch_sub(1, Ordering::Relaxed);
        drop(guard);
    }
}
