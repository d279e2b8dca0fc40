//! [`RequestOrder`]: a request's place in canonical order, as the engine sees it.

use crate::runtime::claim::RequestKey;

/// A request's place in canonical order: requests waiting for a load before running ones,
/// then by priority (lower first), then by admission sequence. Compare two with `Ord`: the
/// lesser is earlier. It is what [`RecoveredRequest`](crate::RecoveredRequest) and
/// [`ScannedRequest`](crate::ScannedRequest) are keyed by, and what a recovery's
/// `waits_for` names owners by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestOrder(pub(crate) RequestKey);

impl RequestOrder {
    /// The request's priority (lower runs first).
    pub fn priority(self) -> i16 {
        self.0.priority()
    }

    /// The admission sequence number (from 1, in submission order).
    pub fn sequence(self) -> u64 {
        self.0.seq()
    }

    /// Whether the key is the request's running-class key (its async one otherwise): in a
    /// report, every request waiting for a load comes before every running one.
    pub fn is_running(self) -> bool {
        self.0.is_sync()
    }
}

impl From<RequestKey> for RequestOrder {
    fn from(k: RequestKey) -> Self {
        RequestOrder(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpacks_what_the_key_packed_and_orders_canonically() {
        for (sync, prio, seq) in [
            (false, i16::MIN, 1),
            (true, -1, 7),
            (false, 0, 42),
            (true, i16::MAX, RequestKey::MAX_SEQ),
        ] {
            let o = RequestOrder::from(RequestKey::new(sync, prio, seq));
            assert_eq!(
                (o.is_running(), o.priority(), o.sequence()),
                (sync, prio, seq)
            );
        }
        let k = |sync, prio, seq| RequestOrder::from(RequestKey::new(sync, prio, seq));
        assert!(k(false, 5, 9) < k(true, -5, 1), "loading before running");
        assert!(k(true, -1, 9) < k(true, 0, 1), "then by priority");
        assert!(k(true, 0, 1) < k(true, 0, 2), "then by admission");
    }
}
