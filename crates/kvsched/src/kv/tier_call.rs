//! Calls into a [`Tier`](super::Tier) that may panic: the connector's loading, get, save and
//! probe threads make them, and a tier's panic must cost what a tier's error costs — the
//! call's chunks fail — never a thread, a count of busy threads left up for good, or a
//! waiter left waiting.

use super::TierError;
use crate::panics::caught;

/// `f`, a call named `what` into a tier; a panic in it is [`TierError::Unavailable`] saying
/// so, as any failure of the store.
pub(super) fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, TierError>,
) -> Result<T, TierError> {
    // Planted bug `tier-panic-escapes` (scripts/plants.sh): the panic unwinds the caller.
    if planted!("tier-panic-escapes") {
        return f();
    }
    match caught(f) {
        Ok(r) => r,
        Err(message) => Err(TierError::Unavailable(format!(
            "the tier panicked in {what}: {message}"
        ))),
    }
}

/// `f`, a question named `what` asked of a tier (one of its properties); `default` if it
/// panics, so a tier's panic there costs its properties' safest answer, never the caller.
pub(super) fn asked(what: &str, default: bool, f: impl FnOnce() -> bool) -> bool {
    guarded(what, || Ok(f())).unwrap_or(default)
}
