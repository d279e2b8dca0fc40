//! What a lost step output leaves behind: whether the step can be offered again where it
//! started, or the request must restart from what the prefix cache knows to be written.
//!
//! A lost output (the plan was never answered) says nothing about how much of the step ran:
//! the engine may have run none of it, or all of it, reads and writes included. Offering the
//! step again at its pre-step length `P` is right only when the bytes every group reads at
//! `P` are written and the lost step cannot have changed them:
//!
//! * every token below `P` was written by something the runtime saw finish (a landed load or
//!   an applied step): a sync load carried by the lost step may never have run;
//! * no Mamba group reads a state the step may have advanced in place. A step from `n` writes
//!   its end state (and in mode `all` every block end it passes) into the entry holding it;
//!   the state at `n` sits in entry `⌈n/b⌉ − 1`. At a block boundary (or `n = 0`) the step
//!   writes only later entries; mid-block, mode `all` always overwrites that entry (the next
//!   block end lands in it) and mode `align` does when the step ends in the same block.

use crate::rules::geometry::{CacheGroup, GroupKind, MambaMode};

/// Whether a request whose step `[pre_step, pre_step + tokens)` was lost can be offered again
/// at `pre_step`, with `written` tokens known written.
pub fn reoffer_at_pre_step(
    groups: &[CacheGroup],
    pre_step: u64,
    tokens: u64,
    written: u64,
) -> bool {
    // Planted bug `reoffer-unwritten` (scripts/plants.sh): the step is offered again at its
    // pre-step length whatever the lost step left behind.
    if planted!("reoffer-unwritten") {
        return true;
    }
    if pre_step > written {
        return false;
    }
    groups.iter().all(|g| match g.kind {
        GroupKind::Mamba { mode } => {
            let b = g.block_size;
            if pre_step % b == 0 || tokens == 0 {
                return true;
            }
            match mode {
                MambaMode::All => false,
                MambaMode::Align => (pre_step + tokens).div_ceil(b) != pre_step.div_ceil(b),
            }
        }
        _ => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_is_offered_again_where_its_bytes_are_written() {
        let g = [
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 32),
        ];
        assert!(reoffer_at_pre_step(&g, 70, 1, 70));
        assert!(reoffer_at_pre_step(&g, 0, 70, 0));
        // A sync load (0, 64) the lost step carried may never have run.
        assert!(!reoffer_at_pre_step(&g, 64, 6, 0));
    }

    #[test]
    fn a_mamba_state_advanced_in_place_is_not_read_again() {
        let align = [CacheGroup::mamba(16, MambaMode::Align)];
        let all = [CacheGroup::mamba(16, MambaMode::All)];
        // Decode at 70: the state at 71 replaces the one at 70 in entry 4.
        assert!(!reoffer_at_pre_step(&align, 70, 1, 70));
        assert!(!reoffer_at_pre_step(&all, 70, 1, 70));
        // From 70 to 90, align writes only entry 5; all writes the state at 80 into entry 4.
        assert!(reoffer_at_pre_step(&align, 70, 20, 70));
        assert!(!reoffer_at_pre_step(&all, 70, 20, 70));
        // At a block boundary the step writes only later entries.
        assert!(reoffer_at_pre_step(&align, 64, 1, 64));
        assert!(reoffer_at_pre_step(&all, 64, 40, 64));
        assert!(reoffer_at_pre_step(&all, 0, 40, 0));
    }
}
