//! Panics of the code the runtime calls (connectors, tiers): caught, reported by their
//! message, and disposed of where they cannot unwind again.
//!
//! A caught panic's payload, and any value a connector hands over, is the caller's type: its
//! `Drop` may panic too. Dropped outside a guard, that second panic would unwind past the
//! `catch_unwind` that caught the first — out of a worker thread, a step or the engine's call.
//! So every payload is dropped by [`dispose`] and every connector value held across calls is
//! a [`DropCaught`].

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// How many payloads, each panicking as the one before is dropped, are dropped before the
/// rest is leaked: a payload's drop may make another panicking payload, without end.
const NESTED_DROPS: usize = 8;

/// The message of a panic payload (a `&str` or `String`), or a placeholder.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// `f()`, or the message of its panic, the panic's payload disposed of ([`dispose`]).
pub(crate) fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(dispose)
}

/// The payload's message; the payload dropped where a panic of its `Drop` is caught (that
/// panic's payload in turn, up to [`NESTED_DROPS`] deep, then leaked).
pub(crate) fn dispose(payload: Box<dyn Any + Send>) -> String {
    let message = panic_message(payload.as_ref());
    if planted!("panic-payload-dropped-bare") {
        // Planted bug (scripts/plants.sh): the payload is dropped unguarded.
        drop(payload);
        return message;
    }
    let mut next = payload;
    for _ in 0..NESTED_DROPS {
        match catch_unwind(AssertUnwindSafe(move || drop(next))) {
            Ok(()) => return message,
            Err(again) => next = again,
        }
    }
    std::mem::forget(next);
    message
}

/// Drops `value` where a panic of its `Drop` is caught; whether it panicked.
pub(crate) fn drop_caught<T>(value: T) -> bool {
    caught(move || drop(value)).is_err()
}

/// A value a connector handed over (or none), dropped where a panic of its `Drop` is
/// caught ([`drop_caught`]) wherever the holder drops it: in a step, at shutdown, on a
/// submitting thread.
pub(crate) struct DropCaught<T>(Option<T>);

impl<T> DropCaught<T> {
    pub(crate) fn new(value: Option<T>) -> Self {
        DropCaught(value)
    }

    pub(crate) fn get(&self) -> Option<&T> {
        self.0.as_ref()
    }

    /// Drops the value now ([`drop_caught`]); whether its `Drop` panicked.
    pub(crate) fn clear(&mut self) -> bool {
        if planted!("connector-value-dropped-bare") {
            // Planted bug (scripts/plants.sh): the value is dropped unguarded.
            self.0 = None;
            return false;
        }
        self.0.take().is_some_and(drop_caught)
    }
}

impl<T> Default for DropCaught<T> {
    fn default() -> Self {
        DropCaught(None)
    }
}

impl<T: Clone> Clone for DropCaught<T> {
    fn clone(&self) -> Self {
        DropCaught(self.0.clone())
    }
}

impl<T> std::fmt::Debug for DropCaught<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

impl<T> Drop for DropCaught<T> {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Panics when dropped.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("bomb dropped");
        }
    }

    /// Payloads still to panic when dropped.
    static LEFT: AtomicUsize = AtomicUsize::new(0);

    /// A panic payload whose drop panics with another `Nested` while `LEFT` allows.
    struct Nested;

    impl Drop for Nested {
        fn drop(&mut self) {
            let more =
                LEFT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if more.is_ok() {
                std::panic::panic_any(Nested);
            }
        }
    }

    /// Runs `f` on a thread of its own; `Err` if a panic escaped it. The escaped payload is
    /// leaked, not dropped: dropping it would panic again in the test harness.
    fn escapes(f: impl FnOnce() + Send + 'static) -> Result<(), &'static str> {
        std::thread::spawn(f).join().map_err(|payload| {
            std::mem::forget(payload);
            "a panic escaped"
        })
    }

    #[test]
    fn a_payload_whose_drop_panics_does_not_unwind_the_catcher() {
        let r = escapes(|| {
            LEFT.store(3, Ordering::Relaxed);
            let r = caught(|| -> u32 { std::panic::panic_any(Nested) });
            assert_eq!(r, Err("(non-string panic payload)".to_string()));
            assert_eq!(
                LEFT.load(Ordering::Relaxed),
                0,
                "each nested payload was dropped"
            );
            // Payloads without end: leaked after NESTED_DROPS, never unwinding.
            LEFT.store(usize::MAX, Ordering::Relaxed);
            assert!(caught(|| std::panic::panic_any(Nested)).is_err());
            assert_eq!(LEFT.load(Ordering::Relaxed), usize::MAX - NESTED_DROPS);
            LEFT.store(0, Ordering::Relaxed);
        });
        assert_eq!(r, Ok(()));
    }

    #[test]
    fn a_value_whose_drop_panics_is_dropped_caught() {
        let r = escapes(|| {
            assert!(drop_caught(Bomb));
            assert!(!drop_caught(7u32));
            let mut held = DropCaught::new(Some(Bomb));
            assert!(held.get().is_some());
            assert!(held.clear(), "the panic of its drop is reported");
            assert!(held.get().is_none());
            drop(DropCaught::new(Some(Bomb)));
        });
        assert_eq!(r, Ok(()));
    }
}
