//! Notes under the KV bytes section about where the store's chunks came from (an unwarmed sim
//! store) and why a disk store dropped saves.

use super::cells::count;
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
