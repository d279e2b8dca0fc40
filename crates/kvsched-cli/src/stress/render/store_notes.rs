//! Notes under the KV bytes section about where the store's chunks came from (an unwarmed sim
//! store) and why a disk store dropped saves.

use super::cells::{count, counted};
use crate::stress::config::StressConfig;
use crate::stress::report::RunReport;
use crate::stress::store::StoreSpec;

/// The share of offered saves above which a disk run says why they were dropped.
const DROP_NOTE_SHARE: f64 = 0.05;

/// The sim store without warming holds only what the run saved: its loads are the run's own
/// prefixes coming back after the device pool let go of them.
pub(super) fn sim_unwarmed_note(c: &StressConfig, r: &RunReport) -> Option<String> {
    if c.store.is_real() || r.kv.chunks_warmed > 0 {
        return None;
    }
    if c.trace.trace.is_some() {
        return Some(format!(
            "sim store: not warmed (a trace replay warms nothing, whatever --hit-ratio says): it holds the full prompt blocks the engine computed and saved, so every chunk loaded is a prefix of this run that came back after the device pool ({} blocks) let go of it",
            count(c.pool_blocks as u64)
        ));
    }
    Some(format!(
        "sim store: not warmed (--hit-ratio {}): it holds the full prompt blocks the engine computed and saved, so every chunk loaded is a prefix of this run that came back after the device pool ({} blocks) let go of it; --hit-ratio R stores share R of each prompt before its submit instead",
        c.hit_ratio,
        count(c.pool_blocks as u64)
    ))
}

/// On a disk store that dropped more than [`DROP_NOTE_SHARE`] of the saves offered: why.
pub(super) fn disk_drop_note(c: &StressConfig, r: &RunReport, who: &str) -> Option<String> {
    if !matches!(c.store, StoreSpec::Disk(_)) {
        return None;
    }
    let (saved, dropped) = (r.kv.chunks_saved, r.kv.saves_dropped);
    let offered = saved.saturating_add(dropped);
    let share = dropped as f64 / offered.max(1) as f64;
    if share <= DROP_NOTE_SHARE {
        return None;
    }
    let secs = r.elapsed_s.max(1e-9);
    Some(format!(
        "{who}disk saves: {:.0}% of the {} chunks offered were dropped. The write-behind takes at most a quarter of a core so that the engine keeps its own (each batch of up to 1,024 chunks is one pack file: create, write, rename), and it stored {} chunks/s against the {} chunks/s offered; the step never waits for it, and a dropped chunk is computed again when its prefix comes back",
        share * 100.0,
        count(offered),
        count((saved as f64 / secs) as u64),
        count((offered as f64 / secs) as u64),
    ))
}

/// The note of a run on Redis: its traffic, its connections' trouble.
pub(super) fn redis_note(r: &RunReport, who: &str) -> Option<String> {
    let t = r.kv.redis?;
    let mut s = format!(
        "{who}redis: {}, {} (MOVED/ASK), {}, {} timed out, {} refused",
        counted(t.round_trips, "round trip", "round trips"),
        counted(t.redirects, "key redirected", "keys redirected"),
        counted(t.slot_refreshes, "slot map reload", "slot map reloads"),
        counted(t.timeouts, "request", "requests"),
        counted(t.protocol_errors, "reply", "replies"),
    );
    if let (Some(lost), Some(failed)) = (r.kv.reconnects, r.kv.connect_failures) {
        s.push_str(&format!(
            "; {} lost and made again, {}",
            counted(lost, "connection", "connections"),
            counted(
                failed,
                "failed connection attempt",
                "failed connection attempts"
            ),
        ));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::redis_traffic::RedisTraffic;

    #[test]
    fn a_redis_note_names_every_count() {
        let mut r = RunReport::default();
        assert_eq!(redis_note(&r, ""), None, "no note for other stores");
        r.kv.redis = Some(RedisTraffic {
            round_trips: 20,
            redirects: 2,
            slot_refreshes: 4,
            timeouts: 6,
            protocol_errors: 8,
        });
        r.kv.reconnects = Some(5);
        r.kv.connect_failures = Some(7);
        assert_eq!(
            redis_note(&r, "kvsched: ").as_deref(),
            Some("kvsched: redis: 20 round trips, 2 keys redirected (MOVED/ASK), 4 slot map reloads, 6 requests timed out, 8 replies refused; 5 connections lost and made again, 7 failed connection attempts")
        );
        let one = RedisTraffic {
            round_trips: 1,
            redirects: 1,
            slot_refreshes: 1,
            timeouts: 1,
            protocol_errors: 1,
        };
        r.kv.redis = Some(one);
        (r.kv.reconnects, r.kv.connect_failures) = (Some(1), Some(1));
        assert_eq!(
            redis_note(&r, "").as_deref(),
            Some("redis: 1 round trip, 1 key redirected (MOVED/ASK), 1 slot map reload, 1 request timed out, 1 reply refused; 1 connection lost and made again, 1 failed connection attempt")
        );
    }
}
