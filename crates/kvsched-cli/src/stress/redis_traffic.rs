//! [`RedisTraffic`]: what a Redis store's tier did on a run's behalf beyond the chunks it
//! moved — round trips, keys sent again after a redirect, slot map reloads, requests that
//! timed out, replies refused — from `RedisTier::counts`. JSON `kv.redis` (`null` for other
//! stores); the human report says it in a note under the KV section
//! (`render::store_notes::redis_note`), so a run on a cluster that changed under it shows how
//! much of that it met.

use serde::{Deserialize, Serialize};

/// A Redis store's traffic over a run (totals since its tier was built).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RedisTraffic {
    /// Pipelines sent, one round trip to one node each (slot map reloads and checks too).
    pub round_trips: u64,
    /// Keys sent again after a `MOVED` or `ASK` reply.
    pub redirects: u64,
    /// Slot map reloads (`CLUSTER SLOTS`), the first one included; 0 on one server.
    pub slot_refreshes: u64,
    /// Requests that ran past their call's deadline.
    pub timeouts: u64,
    /// Replies refused as malformed, over the limits or out of step with their commands.
    pub protocol_errors: u64,
}

impl RedisTraffic {
    /// Two runs' (engines') together.
    pub(super) fn merge(&self, o: &Self) -> RedisTraffic {
        let add = u64::saturating_add;
        RedisTraffic {
            round_trips: add(self.round_trips, o.round_trips),
            redirects: add(self.redirects, o.redirects),
            slot_refreshes: add(self.slot_refreshes, o.slot_refreshes),
            timeouts: add(self.timeouts, o.timeouts),
            protocol_errors: add(self.protocol_errors, o.protocol_errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_merges_by_sum() {
        let a = RedisTraffic {
            round_trips: 10,
            redirects: 1,
            slot_refreshes: 2,
            timeouts: 3,
            protocol_errors: 4,
        };
        let m = a.merge(&a);
        assert_eq!(
            (
                m.round_trips,
                m.redirects,
                m.slot_refreshes,
                m.timeouts,
                m.protocol_errors
            ),
            (20, 2, 4, 6, 8)
        );
    }
}
