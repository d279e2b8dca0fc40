//! **Race: a flush against the ends of the batches it waits for, drops and stops** (the real
//! `kv::drain::Drain`, the flush wait and the wake-ups of the write-behind's and the
//! prober's queues, driven by save and probe threads restated from `kv/saver.rs` and
//! `kv/prober.rs`, which loom builds leave out: they spawn OS threads and call a tier).
//!
//! * `save_flush_waits_for_two_threads`: two save threads, a save a batch; two saves
//!   offered, then a flush.
//! * `save_flush_woken_by_drop_queued`: one save thread; two saves offered, a flush on
//!   another thread, and `drop_queued` racing the thread's batches.
//! * `probe_flush_waits_for_the_probe`: the probe thread (everything queued, one batch); two
//!   probes offered, then a flush.
//! * `probe_flush_against_a_stop`: the probe thread; two probes offered, a flush on another
//!   thread, and a stop (the thread drops what is queued).
//!
//! A flush returns only once every piece of work offered before it is done (its write
//! ordered before the flush's return: loom checks the read) or dropped, and always returns
//! (a flush left parked with every other thread blocked is a deadlock loom reports).
//!
//! Catches: a batch's end that does not wake a flush (plants `saver-flush-unwoken`,
//! `probe-flush-unwoken`: deadlock), a drop or stop that does not wake one (plant
//! `drop-queued-unwoken`: deadlock), a flush that does not wait for a batch a thread holds
//! (plant `saver-flush-early`: the read races the thread's write, or sees none).

#![cfg(kvsched_loom)]

use std::collections::VecDeque;

use kvsched::kv::drain::{Backlog, Drain, Held};
use kvsched::sync::condvar::Condvar;
use kvsched::sync::{thread, Arc, Mutex};
use kvsched_loom_tests::{model, BlockContents};

/// The queue, as `saver::Queue` / `prober::Queue`: work is an index into `Work::done`.
#[derive(Default)]
struct Queue {
    work: VecDeque<usize>,
    held: Held,
    stop: bool,
    /// What was dropped unstarted (the saver counts it; the prober marks its jobs finished).
    dropped: Vec<usize>,
}

impl Backlog for Queue {
    fn nothing_queued(&self) -> bool {
        self.work.is_empty()
    }
    fn held(&mut self) -> &mut Held {
        &mut self.held
    }
}

struct Work {
    queue: Mutex<Queue>,
    ready: Condvar,
    drain: Drain,
    /// Piece i's result: written 1, outside the lock, by the thread that does it.
    done: Vec<BlockContents>,
}

impl Work {
    fn new(n: usize) -> Arc<Work> {
        Arc::new(Work {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            drain: Drain::new(),
            done: (0..n).map(|_| BlockContents::new(0)).collect(),
        })
    }

    /// `Saver::offer` / `Prober::offer` (wanting an answer): queue, then wake a thread.
    fn offer(&self, i: usize) {
        self.queue.lock().work.push_back(i);
        self.ready.notify_one();
    }

    /// `flush_until(None)`, then the check: every piece offered before is done or dropped.
    fn flush_and_check(&self, offered: &[usize]) {
        assert!(self.drain.flush_until(self.queue.lock(), None));
        // Read before the lock is taken again, so that only the flush orders them after the
        // threads' writes.
        let done: Vec<u64> = offered.iter().map(|&i| self.done[i].read()).collect();
        let q = self.queue.lock();
        for (&i, d) in offered.iter().zip(done) {
            assert!(
                d == 1 || q.dropped.contains(&i),
                "piece {i} was neither done nor dropped when the flush returned"
            );
        }
    }

    /// `Saver::drop_queued`.
    fn drop_queued(&self) {
        let mut q = self.queue.lock();
        let left: Vec<usize> = q.work.drain(..).collect();
        q.dropped.extend(left);
        self.drain.dropped(&mut *q);
    }

    /// The saver's `stop`: drops what is queued itself.
    fn stop_saves(&self) {
        {
            let mut q = self.queue.lock();
            q.stop = true;
            let left: Vec<usize> = q.work.drain(..).collect();
            q.dropped.extend(left);
            self.drain.dropped(&mut *q);
        }
        self.ready.notify_all();
    }

    /// `Prober::stop`: the thread drops what is queued.
    fn stop_probes(&self) {
        self.queue.lock().stop = true;
        self.ready.notify_all();
    }

    /// A save thread (`saver::run`, a save a batch, no rest): returns once stopped with
    /// nothing queued.
    fn save_thread(&self) {
        loop {
            let i = {
                let mut q = self.queue.lock();
                while q.work.is_empty() && !q.stop {
                    q = self.ready.wait(q);
                }
                let Some(i) = q.work.pop_front() else {
                    return;
                };
                self.drain.take(&mut *q);
                i
            };
            self.done[i].write(1);
            self.drain.end(&mut *self.queue.lock());
        }
    }

    /// The probe thread (`prober::run`, no linger): takes everything queued as one batch; at
    /// a stop, drops what is queued and returns.
    fn probe_thread(&self) {
        loop {
            let batch: Vec<usize> = {
                let mut q = self.queue.lock();
                while q.work.is_empty() && !q.stop {
                    q = self.ready.wait(q);
                }
                if q.stop {
                    let left: Vec<usize> = q.work.drain(..).collect();
                    q.dropped.extend(left);
                    self.drain.dropped(&mut *q);
                    return;
                }
                self.drain.take(&mut *q);
                q.work.drain(..).collect()
            };
            for i in batch {
                self.done[i].write(1);
            }
            self.drain.end(&mut *self.queue.lock());
        }
    }
}

#[test]
fn save_flush_waits_for_two_threads() {
    model(|| {
        let w = Work::new(2);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let w = Arc::clone(&w);
                thread::spawn(move || w.save_thread())
            })
            .collect();
        w.offer(0);
        w.offer(1);
        w.flush_and_check(&[0, 1]);
        w.stop_saves();
        for t in threads {
            t.join().unwrap();
        }
    });
}

#[test]
fn save_flush_woken_by_drop_queued() {
    model(|| {
        let w = Work::new(2);
        let saver = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.save_thread())
        };
        w.offer(0);
        w.offer(1);
        let flusher = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.flush_and_check(&[0, 1]))
        };
        w.drop_queued();
        flusher.join().unwrap();
        w.stop_saves();
        saver.join().unwrap();
    });
}

#[test]
fn probe_flush_waits_for_the_probe() {
    model(|| {
        let w = Work::new(2);
        let prober = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.probe_thread())
        };
        w.offer(0);
        w.offer(1);
        w.flush_and_check(&[0, 1]);
        w.stop_probes();
        prober.join().unwrap();
    });
}

#[test]
fn probe_flush_against_a_stop() {
    model(|| {
        let w = Work::new(2);
        let prober = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.probe_thread())
        };
        w.offer(0);
        w.offer(1);
        let flusher = {
            let w = Arc::clone(&w);
            thread::spawn(move || w.flush_and_check(&[0, 1]))
        };
        w.stop_probes();
        flusher.join().unwrap();
        prober.join().unwrap();
    });
}
