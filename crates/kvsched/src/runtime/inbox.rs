//! A shard's command inbox: submissions, cancels, sampled tokens and engine finishes, in the
//! order they were queued, taken whole at the start of the shard's next step.
//!
//! A list behind a short lock, with a spare list the step swaps in: a push is one
//! uncontended lock and a vector push, a batch (the engine's output of a step, split by
//! shard) one lock for the whole batch, and taking the inbox one lock and a swap — no
//! allocation once both lists have grown to a step's worth of commands. A lock-free queue
//! costs more here: every command is pushed once and popped once, each a few atomic
//! read-modify-writes, and a linked segment allocated and freed every few dozen commands,
//! while the only contention is a submitting thread meeting the step's swap.
//!
//! # Guarantees
//!
//! * Commands are taken in the order they were pushed (a batch keeps its own order), each
//!   exactly once, by the step that takes the inbox after the push returned.
//! * [`take`](Inbox::take) holds the lock for a swap only: a thread submitting during a step
//!   waits at most that long, never for the step.

use crate::runtime::shard::Command;
use crate::sync::Mutex;

/// One shard's queued commands.
#[derive(Default)]
pub(super) struct Inbox {
    /// Commands queued since the last take.
    queued: Mutex<Vec<Command>>,
    /// The list the last take left empty, kept for its capacity; only the stepping shard
    /// (which holds the shard's state lock) touches it.
    spare: Mutex<Vec<Command>>,
}

impl Inbox {
    /// Queues one command.
    pub(super) fn push(&self, cmd: Command) {
        self.queued.lock().push(cmd);
    }

    /// Queues `batch` in its order, under one lock; `batch` is left empty with its capacity.
    pub(super) fn push_all(&self, batch: &mut Vec<Command>) {
        if !batch.is_empty() {
            self.queued.lock().append(batch);
        }
    }

    /// Commands queued now (a hint: others may push right after).
    pub(super) fn len(&self) -> usize {
        self.queued.lock().len()
    }

    /// Takes every queued command, oldest first, and hands them to `apply`; the inbox is
    /// empty after the swap, and pushes during `apply` wait for the next take.
    pub(super) fn take<R>(&self, apply: impl FnOnce(std::vec::Drain<'_, Command>) -> R) -> R {
        let mut spare = self.spare.lock();
        // Planted bug (scripts/plants.sh): the queued list stays locked while the commands
        // are applied, so a submit waits for the whole step.
        if planted!("inbox-apply-under-lock") {
            let mut queued = self.queued.lock();
            std::mem::swap(&mut *queued, &mut *spare);
            return apply(spare.drain(..));
        }
        std::mem::swap(&mut *self.queued.lock(), &mut *spare);
        apply(spare.drain(..))
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::sync::{thread, Arc, AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    fn ids(cmds: std::vec::Drain<'_, Command>) -> Vec<String> {
        cmds.map(|c| match c {
            Command::Cancel(id)
            | Command::Sampled(id)
            | Command::Discarded(id)
            | Command::Finish(id) => id.to_string(),
            _ => "other".to_owned(),
        })
        .collect()
    }

    #[test]
    fn commands_come_out_once_in_the_order_they_went_in() {
        let inbox = Inbox::default();
        inbox.push(Command::Cancel("a".into()));
        let mut batch = vec![Command::Sampled("b".into()), Command::Finish("c".into())];
        inbox.push_all(&mut batch);
        assert!(batch.is_empty());
        inbox.push(Command::Cancel("d".into()));
        assert_eq!(inbox.len(), 4);
        assert_eq!(inbox.take(ids), ["a", "b", "c", "d"]);
        assert_eq!(inbox.len(), 0);
        assert!(inbox.take(ids).is_empty());
        inbox.push(Command::Cancel("e".into()));
        assert_eq!(inbox.take(ids), ["e"]);
    }

    #[test]
    fn a_push_during_a_take_waits_for_the_swap_only_and_lands_in_the_next_one() {
        let inbox = Arc::new(Inbox::default());
        let pushed = Arc::new(AtomicBool::new(false));
        let mut pusher = None;
        let (first, in_time) = inbox.take(|cmds| {
            let (other, done) = (Arc::clone(&inbox), Arc::clone(&pushed));
            pusher = Some(thread::spawn(move || {
                other.push(Command::Cancel("late".into()));
                done.store(true, Ordering::Release);
            }));
            // The step is still applying its commands: the push must not wait for it.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !pushed.load(Ordering::Acquire) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            (ids(cmds), pushed.load(Ordering::Acquire))
        });
        if let Some(p) = pusher {
            p.join().expect("pusher");
        }
        assert!(in_time, "a push waited for the step applying the inbox");
        assert!(first.is_empty());
        assert_eq!(inbox.take(ids), ["late"]);
    }
}
