//! The phase barrier between the shards of one step.

use super::{spin_hint, thread, AtomicUsize, Ordering};

/// Ordering of a waiter's departure load in [`PhaseBarrier::wait`]: Acquire. The planted bug
/// `barrier-relaxed` (loom demonstration, `loom-tests/plants.sh`) weakens it to Relaxed.
#[cfg(not(kvsched_plant = "barrier-relaxed"))]
const BARRIER_DEPART: Ordering = Ordering::Acquire;
#[cfg(kvsched_plant = "barrier-relaxed")]
const BARRIER_DEPART: Ordering = Ordering::Relaxed;

/// A reusable barrier for the `n` participants of a step's phases: each `wait` returns once all
/// `n` have arrived. Waiters spin briefly, then yield (under loom: yield at once).
///
/// Memory: everything a participant did before `wait` happens-before everything every
/// participant does after it (Release on arrival, Acquire on departure).
#[derive(Debug)]
pub struct PhaseBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
}

impl PhaseBarrier {
    /// A barrier for `n` participants (`n ≤ 1`: `wait` returns at once).
    pub fn new(n: usize) -> Self {
        PhaseBarrier {
            n,
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// Arrives and waits for the others.
    pub fn wait(&self) {
        if self.n <= 1 {
            return;
        }
        // Acquire: pairs with the Release increment below, so a thread reads the generation
        // of the round it joins.
        let gen = self.generation.load(Ordering::Acquire);
        // AcqRel: the Release half publishes this thread's phase work to the last arriver;
        // the Acquire half lets the last arriver see everyone's.
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            // Release: pairs with the Acquire loads of the waiters below; carries every
            // arriver's work (acquired by the fetch_add above) to them.
            self.generation.fetch_add(1, Ordering::Release);
        } else {
            let mut spins = 0u32;
            // Acquire: pairs with the Release increment by the last arriver.
            while self.generation.load(BARRIER_DEPART) == gen {
                if spins < 64 {
                    spins += 1;
                    spin_hint();
                } else {
                    thread::yield_now();
                }
            }
        }
    }
}
