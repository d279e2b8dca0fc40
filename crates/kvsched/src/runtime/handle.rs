//! Submission: a [`SubmitRequest`] goes to its shard's inbox, from the engine thread
//! ([`Runtime::submit`]) or any other ([`Handle`]); so does a cancellation.

use std::sync::Arc as StdArc;
use std::time::Duration;

use crate::runtime::claim::RequestKey;
use crate::runtime::error::RuntimeError;
#[cfg(doc)]
use crate::runtime::settings::Settings;
#[cfg(doc)]
use crate::runtime::shard::Metrics;
use crate::runtime::shard::{Command, NewRequest, PreparedPrompt};
use crate::runtime::shared::Inner;
use crate::runtime::step::Runtime;
use crate::sync::{Arc, Ordering};

/// A request to submit.
#[derive(Clone, Debug)]
pub struct SubmitRequest {
    /// Unique among live requests.
    pub id: String,
    /// The prompt's token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Tokens to generate before the runtime finishes it (0: until the engine finishes it).
    pub max_new_tokens: u32,
    /// The request's place in canonical order: a lower value comes first, among requests of
    /// the same class (waiting for a load, or running), before the admission sequence. It is
    /// admitted, scheduled and handed claims before higher values, and preempted after them:
    /// a preemption takes the running request with the highest value (the latest admitted
    /// among equal values). Any `i16`; `SubmitRequest` has no `Default`, so every request
    /// gives one, 0 being the usual neutral value.
    pub priority: i16,
    /// This request's load deadline, overriding [`Settings::load_deadline`]; `Some` must be
    /// above zero ([`RuntimeError::ZeroLoadDeadline`]).
    pub load_deadline: Option<Duration>,
}

/// A cheap, cloneable, `Send + Sync` handle to a [`Runtime`], for [`submit`](Handle::submit)
/// and [`cancel`](Handle::cancel) from threads other than the engine's. It keeps the
/// runtime's shared state alive but not its threads: once no step will run again — after
/// [`Runtime::shutdown`], after the `Runtime` is dropped, or once a shard panicked (the
/// runtime is poisoned) — `submit` returns [`RuntimeError::ShutDown`] and `cancel` does
/// nothing, so a handle queues nothing that no step will take.
#[derive(Clone)]
pub struct Handle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("shards", &self.inner.shards.len())
            .finish()
    }
}

impl Handle {
    /// Queues a request; it is admitted at a following step. Errors: an empty id or prompt,
    /// a zero `load_deadline`, a request longer than the pool can ever hold, an id already
    /// live, or a runtime that is shut down.
    pub fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        self.inner.submit(req)
    }

    /// Cancels a request at the next step (once its in-flight load, if any, lands). Unknown
    /// ids are counted in [`Metrics::unknown_commands`].
    pub fn cancel(&self, id: &str) {
        self.inner.cancel(id)
    }
}

impl Inner {
    /// Queues a request (under the read lock of `open`, so shutdown cannot miss it). The
    /// connector prepares the prompt before that lock is taken: a slow `prepare` delays this
    /// submit only, never shutdown.
    pub(super) fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        if !*self.open.read() {
            return Err(RuntimeError::ShutDown);
        }
        NewRequest::check(&self.geo, self.pool.num_blocks(), &req)?;
        // Planted bug (scripts/plants.sh): the connector prepares under the read lock of
        // `open`, so shutdown waits for a slow `prepare`.
        let held = planted!("prepare-under-open-lock").then(|| self.open.read());
        let prepared = PreparedPrompt::by(self.connector.as_ref(), &req.id, &req.prompt);
        drop(held);
        let open = self.open.read();
        if !*open {
            return Err(RuntimeError::ShutDown);
        }
        let i = self.shard_of(&req.id);
        let id: StdArc<str> = req.id.as_str().into();
        if !self.shards[i].ids.lock().insert(id.clone()) {
            return Err(RuntimeError::DuplicateId(req.id));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.submitted.fetch_add(1, Ordering::Relaxed);
        let key = RequestKey::new(false, req.priority, seq);
        self.shards[i].inbox.push(Command::Submit(Box::new(
            NewRequest::new(&self.geo, req, id, key).with_prepared(prepared),
        )));
        self.queued();
        Ok(())
    }

    /// Cancels a request at the next step (once its in-flight load, if any, lands). Unknown
    /// ids are counted in [`Metrics::unknown_commands`].
    pub(super) fn cancel(&self, id: &str) {
        // As `submit`: nothing is queued once no step will take it.
        let open = self.open.read();
        if !*open {
            return;
        }
        let i = self.shard_of(id);
        self.shards[i].inbox.push(Command::Cancel(id.into()));
        self.queued();
    }

    /// A command was queued: an engine idle in `wait_for_work` has work for a step.
    /// (Planted bug `submit-wakes-nobody`, scripts/plants.sh: it sleeps on.)
    fn queued(&self) {
        if !planted!("submit-wakes-nobody") {
            self.signal.notify();
        }
    }
}

impl Runtime {
    /// A thread-safe handle for [`Handle::submit`] and [`Handle::cancel`] from other threads.
    pub fn handle(&self) -> Handle {
        Handle {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Queues a request; it is admitted at a following step. Same as
    /// [`Handle::submit`].
    pub fn submit(&self, req: SubmitRequest) -> Result<(), RuntimeError> {
        self.inner.submit(req)
    }

    /// Cancels a request at the next step. Same as [`Handle::cancel`].
    pub fn cancel(&self, id: &str) {
        self.inner.cancel(id)
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;

    fn req(id: &str) -> SubmitRequest {
        SubmitRequest {
            id: id.into(),
            prompt: (0..40).collect(),
            max_new_tokens: 2,
            priority: 0,
            load_deadline: None,
        }
    }

    fn queued(inner: &Inner) -> usize {
        inner.shards.iter().map(|s| s.inbox.len()).sum()
    }

    /// Submits and cancels through `h` 100 times each: every submit refused, nothing queued.
    fn queues_nothing(h: &Handle) {
        for i in 0..100 {
            assert!(matches!(
                h.submit(req(&format!("s{i}"))),
                Err(RuntimeError::ShutDown)
            ));
            h.cancel(&format!("c{i}"));
        }
        assert_eq!(queued(&h.inner), 0);
        assert!(h.inner.shards.iter().all(|s| s.ids.lock().is_empty()));
    }

    #[test]
    fn a_handle_queues_nothing_once_no_step_will_run() {
        // After shutdown.
        let rt = Runtime::builder().shards(2).build().unwrap();
        let h = rt.handle();
        let _ = rt.shutdown();
        queues_nothing(&h);
        // After a drop without shutdown.
        let rt = Runtime::builder().shards(2).build().unwrap();
        let h = rt.handle();
        drop(rt);
        queues_nothing(&h);
    }
}
