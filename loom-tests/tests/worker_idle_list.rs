//! **Race: a dispatch against a worker going idle** (the real `WorkerPool`: `dispatch` pushes
//! the job, then takes the first worker listed idle — a CAS of its flag true → false — and
//! unparks it; `worker_loop`, finding no job, lists itself, re-checks the jobs and parks
//! untimed, and once awake takes its listing back before it runs anything).
//!
//! * `dispatch_races_worker_going_idle`: one worker; the engine dispatches a job while the
//!   worker starts and goes idle, waits for its completion, dispatches a second while the
//!   worker goes idle again, waits, and shuts the pool down.
//! * `two_workers_dispatch_one_at_a_time`: two workers; the engine dispatches a job, waits for
//!   its completion, and dispatches another, each while either worker may be listed, going
//!   idle or still busy.
//! * `a_second_job_runs_while_the_first_hangs`: two workers; the first job's load blocks until
//!   the engine has the second's completion, so the second must run on the other worker.
//!
//! No lost wake-up: every dispatched job is run (the engine parks untimed until its
//! completion, so a job nobody runs leaves every thread asleep: loom reports the deadlock).
//! No busy worker is woken in an idle one's place: a worker listed before its re-check found
//! the first job, left listed while it runs it, would take the second job's wake-up while the
//! other worker sleeps — deadlock in the third model.
//!
//! Catches: a worker that parks without re-checking the jobs after listing itself (plant
//! `worker-no-recheck`: a dispatch whose scan came before the listing wakes nobody — deadlock),
//! the SeqCst fences left out of the pairing (plant `worker-no-fence`: the worker's re-check
//! misses the job while the dispatch's scan misses the listing — deadlock), a worker that
//! stays listed while it runs a load (plant `worker-busy-listed`: the third model's deadlock).
//!
//! The fences are checked because the shim's queue models, like crossbeam's queues, see an
//! empty queue without taking a lock (a lock there would order the re-check after the
//! dispatch by itself); loom models their SeqCst length word, as every SeqCst access, no
//! stronger than acquire/release, so only the fences order a listing against a dispatch —
//! as the pool's argument has it, relying on no more than crossbeam promises. loom models a
//! SeqCst fence as a join with every earlier one, which gives exactly the fence–fence rule
//! this pairing needs: no false positive with the fences, a lost wake-up without them.

#![cfg(kvsched_loom)]

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::runtime::worker::model_job_key;
use kvsched::sync::condvar::Condvar;
use kvsched::sync::Mutex;
use kvsched_loom_tests::{model, Engine};

#[test]
fn dispatch_races_worker_going_idle() {
    model(|| {
        let e = Engine::start(1, 2);
        e.dispatch(1, 0);
        let first = e.drain_until(1);
        assert_eq!(first.len(), 1);
        e.dispatch(2, 0);
        let second = e.drain_until(1);
        assert_eq!(second.len(), 1);
        assert_eq!(
            e.pool.counts().loads.load(kvsched::sync::Ordering::Relaxed),
            2
        );
        let (applied, stale, left) = e.shutdown();
        assert_eq!((applied, stale, left), (vec![], vec![], vec![]));
        assert_eq!(first[0].key.seq() + second[0].key.seq(), 3);
    });
}

#[test]
fn two_workers_dispatch_one_at_a_time() {
    model(|| {
        let e = Engine::start(2, 2);
        for seq in 1..=2 {
            e.dispatch(seq, 0);
            let got = e.drain_until(1);
            assert_eq!(got.iter().map(|c| c.key.seq()).collect::<Vec<_>>(), [seq]);
        }
        let (applied, stale, left) = e.shutdown();
        assert_eq!((applied, stale, left), (vec![], vec![], vec![]));
    });
}

/// Job 1's load waits for this to open.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

/// Loads that succeed, job 1's only once its gate opens.
struct Gated(std::sync::Arc<Gate>);

impl KvConnector for Gated {
    fn lookup(&self, _: LookupQuery<'_>) -> LookupResult {
        LookupResult::default()
    }
    fn load(&self, job: &LoadJob) -> LoadResult {
        if model_job_key(job).seq() == 1 {
            let mut open = self.0.open.lock();
            while !*open {
                open = self.0.opened.wait(open);
            }
        }
        LoadResult::Ok
    }
}

#[test]
fn a_second_job_runs_while_the_first_hangs() {
    model(|| {
        let gate = std::sync::Arc::new(Gate::default());
        let e = Engine::start_with(2, 2, std::sync::Arc::new(Gated(gate.clone())));
        e.dispatch(1, 0);
        e.dispatch(2, 0);
        // Job 1 hangs until job 2 is done: the other worker must run job 2.
        let mut got = Vec::new();
        while !got.contains(&2) {
            got.extend(e.drain_until(1).iter().map(|c| c.key.seq()));
        }
        *gate.open.lock() = true;
        gate.opened.notify_all();
        let (applied, stale, left) = e.shutdown();
        assert!(stale.is_empty() && left.is_empty(), "{stale:?} {left:?}");
        got.extend(applied);
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}
