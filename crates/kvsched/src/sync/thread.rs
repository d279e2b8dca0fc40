//! Under `cfg(kvsched_loom)`: loom's threads, with the parts of `std::thread` the runtime uses
//! and loom lacks. (Normal builds re-export `std::thread` instead.)
//!
//! * [`JoinHandle::is_finished`] — tracked with a flag the thread sets (Release) as its last
//!   action, read with Acquire: `true` means the thread's closure returned and everything it
//!   did is visible; [`JoinHandle::join`] still waits for the thread itself.
//! * [`sleep`] — a yield: loom has no clock, and a sleeping thread is one that lets the others
//!   run. Models must not rely on a sleep's duration.

use std::time::Duration;

pub use loom::thread::{current, park, yield_now, Thread, ThreadId};

use super::{Arc, AtomicBool, Ordering};

/// A spawned thread: loom's handle and the flag its closure sets when it returns.
#[derive(Debug)]
pub struct JoinHandle<T> {
    inner: loom::thread::JoinHandle<T>,
    finished: Arc<AtomicBool>,
}

impl<T> JoinHandle<T> {
    /// Waits for the thread and returns its result.
    pub fn join(self) -> std::thread::Result<T> {
        self.inner.join()
    }

    /// The thread's handle (to unpark it).
    pub fn thread(&self) -> &Thread {
        self.inner.thread()
    }

    /// Whether the thread's closure has returned.
    pub fn is_finished(&self) -> bool {
        // Acquire: pairs with the Release store at the end of the thread's closure.
        self.finished.load(Ordering::Acquire)
    }
}

/// Wraps `f` so that it sets the returned flag when it returns.
fn tracked<F, T>(f: F) -> (impl FnOnce() -> T + Send + 'static, Arc<AtomicBool>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let finished = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&finished);
    let run = move || {
        let out = f();
        // Release: pairs with the Acquire load in `is_finished`.
        flag.store(true, Ordering::Release);
        out
    };
    (run, finished)
}

/// Spawns a thread.
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (run, finished) = tracked(f);
    JoinHandle {
        inner: loom::thread::spawn(run),
        finished,
    }
}

/// A thread factory (std's `Builder`: a name, then `spawn`).
#[derive(Debug)]
pub struct Builder(loom::thread::Builder);

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// A builder with no name.
    pub fn new() -> Self {
        Builder(loom::thread::Builder::new())
    }

    /// Names the thread.
    pub fn name(self, name: String) -> Self {
        Builder(self.0.name(name))
    }

    /// Spawns the thread.
    pub fn spawn<F, T>(self, f: F) -> std::io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (run, finished) = tracked(f);
        Ok(JoinHandle {
            inner: self.0.spawn(run)?,
            finished,
        })
    }
}

/// Under loom: a yield (no clock; see the module doc).
pub fn sleep(_: Duration) {
    loom::thread::yield_now();
}
