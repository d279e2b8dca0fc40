//! [`ThreadGroup`]: threads joined together until one deadline. Each thread marks its end as
//! its last act and wakes the joiner, which parks until every thread has ended or the
//! deadline passed — it never polls — and leaves a thread still running then behind
//! (detached, to end on its own). Under loom, which has no clock, the join waits for good.

use std::time::Instant;

use super::condvar::Condvar;
use super::{thread, Arc, Mutex};

/// Which threads of a group have ended, and where the join waits for them.
#[derive(Debug, Default)]
struct Ends {
    /// Per thread, in spawn order: whether it has ended.
    ended: Mutex<Vec<bool>>,
    /// Notified, under `ended`'s lock, by each thread's end.
    woken: Condvar,
}

/// Marks its thread ended when dropped: the last thing the thread's closure drops, after the
/// work and everything it captured (also when the work panics, or when the thread never
/// started).
struct EndMark {
    ends: Arc<Ends>,
    i: usize,
}

impl Drop for EndMark {
    fn drop(&mut self) {
        let mut ended = self.ends.ended.lock();
        if let Some(e) = ended.get_mut(self.i) {
            *e = true;
        }
        // Under the lock the join checks under, so the wake-up cannot fall between its check
        // and its wait. (Planted bug `thread-end-unwoken`, scripts/plants.sh: the join is not
        // woken, and waits out its deadline.)
        if !planted!("thread-end-unwoken") {
            self.ends.woken.notify_all();
        }
    }
}

/// Threads spawned together and joined together ([`join_until`](Self::join_until)).
#[derive(Debug, Default)]
pub struct ThreadGroup {
    ends: Arc<Ends>,
    /// Each thread's handle, with its index in `ends`.
    threads: Vec<(usize, thread::JoinHandle<()>)>,
}

impl ThreadGroup {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Threads spawned and not yet joined or left behind.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Spawns a thread named `name` running `f`.
    pub fn spawn(
        &mut self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let i = {
            let mut ended = self.ends.ended.lock();
            ended.push(false);
            ended.len() - 1
        };
        let mark = EndMark {
            ends: Arc::clone(&self.ends),
            i,
        };
        // A failed spawn drops the closure, and with it the mark: no join waits for it.
        let h = thread::Builder::new().name(name).spawn(move || {
            let _mark = mark;
            f();
        })?;
        self.threads.push((i, h));
        Ok(())
    }

    /// Waits until every thread has ended or `deadline` passed (`None`: for good), parked
    /// until a thread's end wakes it; joins those that ended and leaves the others behind,
    /// detached. How many were left behind. The group is empty afterwards.
    pub fn join_until(&mut self, deadline: Option<Instant>) -> usize {
        if self.threads.is_empty() {
            return 0;
        }
        let ended = {
            let mut ended = self.ends.ended.lock();
            while !ended.iter().all(|&e| e) {
                let (g, timed_out) = self.ends.woken.wait_until(ended, deadline);
                ended = g;
                if timed_out {
                    break;
                }
            }
            ended.clone()
        };
        let mut left = 0;
        for (i, h) in self.threads.drain(..) {
            if ended.get(i).copied().unwrap_or(false) {
                // Past its last act: the join waits only for the thread's exit itself.
                let _ = h.join();
            } else {
                left += 1;
            }
        }
        left
    }
}

#[cfg(all(test, not(kvsched_loom)))]
pub(crate) mod test_support {
    /// How many times the calling thread has blocked so far (Linux: its voluntary context
    /// switches); `None` elsewhere. A wait that sleeps in steps shows as many; one that parks
    /// until woken, as a few.
    pub(crate) fn voluntary_switches() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok())
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// A thread still running at the deadline is left behind, and the join returns then; one
    /// that ended is joined.
    #[test]
    fn a_thread_running_at_the_deadline_is_left_behind() {
        let mut group = ThreadGroup::new();
        let (tx, rx) = mpsc::channel::<()>();
        group
            .spawn("hangs".to_owned(), move || {
                let _ = rx.recv();
            })
            .unwrap_or_else(|e| panic!("{e}"));
        group
            .spawn("ends".to_owned(), || {})
            .unwrap_or_else(|e| panic!("{e}"));
        let started = Instant::now();
        assert_eq!(
            group.join_until(Some(started + Duration::from_millis(50))),
            1
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(group.threads(), 0);
        drop(tx);
    }
}
