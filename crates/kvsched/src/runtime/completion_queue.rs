//! A shard's bounded completion queue, whose pops wake the workers waiting for room.
//!
//! A worker that finds the queue full and has spun its while lists itself
//! ([`wait_for_room`](CompletionQueue::wait_for_room)), retries its push, and parks only if
//! the retry is refused too. A [`pop`](CompletionQueue::pop) that takes an item wakes the
//! listed workers, and only them: a pop with nobody listed costs one fence and one load more
//! than the queue's own. The listing and the pop are ordered by a SeqCst fence on each side,
//! so either the worker's retry finds the room a pop made, or that pop sees the listing: no
//! worker sleeps on a queue that has room.

use super::worker::Completion;
use crate::sync::park::Unparker;
use crate::sync::{fence, ArrayQueue, AtomicUsize, Mutex, Ordering};

/// A bounded MPMC queue of completions (the sync shim's `ArrayQueue`) with its waiting pushers.
#[derive(Debug)]
pub struct CompletionQueue {
    items: ArrayQueue<Completion>,
    /// How many pushers are listed in `waiting`: written under its lock, read by pops without.
    listed: AtomicUsize,
    /// The pushers to wake at the next pop, by id (a worker's index).
    waiting: Mutex<Vec<(usize, Unparker)>>,
}

impl CompletionQueue {
    /// A queue holding at most `cap` completions.
    pub fn new(cap: usize) -> Self {
        CompletionQueue {
            items: ArrayQueue::new(cap),
            listed: AtomicUsize::new(0),
            waiting: Mutex::new(Vec::new()),
        }
    }

    /// Pushes, or gives the completion back when full.
    pub fn push(&self, c: Completion) -> Result<(), Completion> {
        self.items.push(c)
    }

    /// Pops the oldest completion; taking one wakes every pusher listed as waiting for room.
    pub fn pop(&self) -> Option<Completion> {
        let c = self.items.pop()?;
        // SeqCst: pairs with the fence in `wait_for_room` (listing, then the retried push
        // there; this pop, then the check here): either that push finds this room or this
        // check sees the listing.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fences above; the list itself is read under its lock.
        // (Planted bug `pop-wakes-no-pusher`, scripts/plants.sh: a pop wakes nobody, and a
        // worker parked on a full queue sleeps on while the queue has room.)
        if self.listed.load(Ordering::Relaxed) != 0 && !planted!("pop-wakes-no-pusher") {
            let woken = {
                let mut w = self.waiting.lock();
                // Relaxed: under the lock, as every write of the count.
                self.listed.store(0, Ordering::Relaxed);
                std::mem::take(&mut *w)
            };
            for (_, u) in woken {
                u.unpark();
            }
        }
        Some(c)
    }

    /// Lists pusher `id` to be woken by `unparker` at the next pop (once: a listed pusher is
    /// not listed twice). The caller then retries its push, and parks if that is refused:
    /// a pop after this listing wakes it, one before it left room the retry finds.
    pub fn wait_for_room(&self, id: usize, unparker: &Unparker) {
        {
            let mut w = self.waiting.lock();
            w.retain(|(i, _)| *i != id);
            w.push((id, unparker.clone()));
            // Relaxed: the fence below orders it before the retried push.
            self.listed.store(w.len(), Ordering::Relaxed);
        }
        // SeqCst: pairs with the fence in `pop`.
        fence(Ordering::SeqCst);
    }

    /// Takes pusher `id` off the list (its push went in, or it gave up).
    pub fn unlist(&self, id: usize) {
        let mut w = self.waiting.lock();
        w.retain(|(i, _)| *i != id);
        // Relaxed: under the lock, as every write of the count.
        self.listed.store(w.len(), Ordering::Relaxed);
    }

    /// Completions queued now.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether none is queued now.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // `len`'s pair, for the tools
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}
