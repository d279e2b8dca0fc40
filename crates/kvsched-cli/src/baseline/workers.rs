//! The baseline's worker threads: jobs in by one `mpsc` channel (its receiver shared behind a
//! mutex), completions out by another.

use std::sync::Arc as StdArc;
// The baseline deliberately uses std's mpsc channels for jobs and completions: that is the
// design it stands for (the runtime uses lock-free queues from `kvsched::sync`).
use kvsched::connector::{KvConnector, LoadJob};
use kvsched::runtime::worker::{take_job, Completion};
use kvsched::runtime::RuntimeError;
use kvsched::sync::{thread, Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use std::sync::mpsc;

/// The worker threads: jobs in by one channel, completions out by another.
pub(super) struct Workers {
    jobs: Option<mpsc::Sender<LoadJob>>,
    stop: Arc<AtomicBool>,
    cancelled: Arc<AtomicU64>,
    /// Completions sent back.
    delivered: Arc<AtomicU64>,
    /// Jobs queued for the workers.
    sent: u64,
    handles: Vec<thread::JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers running loads through `connector`; returns them and the receiving
    /// end of their completions. If a thread cannot start, the ones started are joined.
    pub(super) fn start(
        n: usize,
        connector: &StdArc<dyn KvConnector>,
    ) -> Result<(Self, mpsc::Receiver<Completion>), RuntimeError> {
        let (job_tx, job_rx) = mpsc::channel::<LoadJob>();
        let (done_tx, done_rx) = mpsc::channel::<Completion>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let stop = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicU64::new(0));
        let delivered = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for i in 0..n {
            let (rx, tx, conn) = (
                Arc::clone(&job_rx),
                done_tx.clone(),
                StdArc::clone(connector),
            );
            let (stop, cancelled) = (Arc::clone(&stop), Arc::clone(&cancelled));
            let delivered = Arc::clone(&delivered);
            let h = thread::Builder::new()
                .name(format!("baseline-worker-{i}"))
                .spawn(move || work(&rx, &tx, conn.as_ref(), &stop, &cancelled, &delivered));
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    drop(job_tx);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(e.into());
                }
            }
        }
        let workers = Workers {
            jobs: Some(job_tx),
            stop,
            cancelled,
            delivered,
            sent: 0,
            handles,
        };
        Ok((workers, done_rx))
    }

    /// Worker threads running.
    pub(super) fn len(&self) -> usize {
        self.handles.len()
    }

    /// Queues `jobs` for the workers (none once stopped).
    pub(super) fn send(&mut self, jobs: Vec<LoadJob>) {
        if let Some(tx) = &self.jobs {
            for j in jobs {
                if tx.send(j).is_ok() {
                    self.sent += 1;
                }
            }
        }
    }

    /// Jobs queued whose completion has not been sent back yet.
    pub(super) fn in_flight(&self) -> u64 {
        // Acquire: pairs with the Release increment in `work` after a completion is sent, so
        // a completion counted here is in the channel.
        let delivered = self.delivered.load(Ordering::Acquire);
        self.sent.saturating_sub(delivered)
    }

    /// Stops the workers and joins them: loads in flight finish, queued jobs are skipped
    /// (counted in [`Workers::loads_cancelled`]).
    pub(super) fn stop(&mut self) {
        // Release: pairs with the Acquire load in the worker loop; queued jobs are skipped.
        self.stop.store(true, Ordering::Release);
        self.jobs = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }

    /// Queued jobs the workers skipped because they were stopping.
    pub(super) fn loads_cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// One worker: takes jobs until the job channel closes, runs each through `conn` as a runtime
/// worker does (skipping, and counting, those taken once `stop` is set) and sends its
/// completion back (counted in `delivered`).
fn work(
    rx: &Mutex<mpsc::Receiver<LoadJob>>,
    tx: &mpsc::Sender<Completion>,
    conn: &dyn KvConnector,
    stop: &AtomicBool,
    cancelled: &AtomicU64,
    delivered: &AtomicU64,
) {
    loop {
        let job = rx.lock().recv();
        let Ok(job) = job else { return };
        // Acquire: pairs with the Release store in `Workers::stop`.
        if stop.load(Ordering::Acquire) {
            cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // As a runtime worker: a job its shard dropped before it started is not run, and
        // nobody waits for its completion (it counts as delivered).
        let Some((c, _ran)) = take_job(conn, &job) else {
            // Release: pairs with the Acquire load in `Workers::in_flight`.
            delivered.fetch_add(1, Ordering::Release);
            continue;
        };
        if tx.send(c).is_err() {
            return;
        }
        // Release: pairs with the Acquire load in `Workers::in_flight`.
        delivered.fetch_add(1, Ordering::Release);
    }
}
