//! A condition variable over the shim's [`Mutex`](super::Mutex), with one interface for
//! parking_lot (normal builds) and loom (`cfg(kvsched_loom)`, where a timed wait is untimed:
//! loom has no clock).

#[cfg(not(kvsched_loom))]
use std::time::Instant;

/// Guard of the shim's mutex.
#[cfg(not(kvsched_loom))]
pub type Guard<'a, T> = parking_lot::MutexGuard<'a, T>;
/// Guard of the shim's mutex.
#[cfg(kvsched_loom)]
pub type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;

/// A condition variable.
#[derive(Debug, Default)]
pub struct Condvar {
    #[cfg(not(kvsched_loom))]
    cv: parking_lot::Condvar,
    #[cfg(kvsched_loom)]
    cv: loom::sync::Condvar,
}

impl Condvar {
    /// A new condition variable.
    pub fn new() -> Self {
        Self::default()
    }

    /// Releases `guard`, sleeps until notified (or spuriously), and locks again.
    pub fn wait<'a, T>(&self, guard: Guard<'a, T>) -> Guard<'a, T> {
        #[cfg(not(kvsched_loom))]
        {
            let mut guard = guard;
            self.cv.wait(&mut guard);
            guard
        }
        #[cfg(kvsched_loom)]
        match self.cv.wait(guard) {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Like [`wait`](Condvar::wait), but gives up at `deadline` (`None`: never); returns
    /// whether it timed out. Under loom: an untimed wait that never times out.
    #[cfg(not(kvsched_loom))]
    pub fn wait_until<'a, T>(
        &self,
        guard: Guard<'a, T>,
        deadline: Option<Instant>,
    ) -> (Guard<'a, T>, bool) {
        let mut guard = guard;
        let timed_out = match deadline {
            Some(d) => self.cv.wait_until(&mut guard, d).timed_out(),
            None => {
                self.cv.wait(&mut guard);
                false
            }
        };
        (guard, timed_out)
    }

    /// Under loom (no clock): [`wait`](Condvar::wait), never timing out.
    #[cfg(kvsched_loom)]
    pub fn wait_until<'a, T>(
        &self,
        guard: Guard<'a, T>,
        _deadline: Option<std::time::Instant>,
    ) -> (Guard<'a, T>, bool) {
        (self.wait(guard), false)
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.cv.notify_one();
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.cv.notify_all();
    }
}
