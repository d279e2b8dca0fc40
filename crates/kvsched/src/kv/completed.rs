//! Which blocks a step completed that a tier can hold: what an engine offers for saving after
//! each kept step.

use crate::rules::geometry::{BlockId, CacheGroup, GroupKind, MambaMode};
use crate::runtime::ScheduledRequest;

/// The entries the step `s` of a request with a `prompt_len`-token prompt completed that a
/// tier can hold, as `(group, index, block)` for
/// [`TierConnector::save_blocks`](super::TierConnector::save_blocks): the full prompt blocks
/// whose end the step reached, skipping null entries. A Mamba entry counts only if the step
/// wrote the state at its block's end: in mode `all` every block end it passed, in mode
/// `align` only its own last state (so only when the step ended on that block's end).
///
/// Call it only for a step whose output `Runtime::update` did not return for discard.
pub fn completed_prompt_blocks(
    groups: &[CacheGroup],
    prompt_len: usize,
    s: &ScheduledRequest,
) -> Vec<(usize, usize, BlockId)> {
    let (n, end) = (s.num_computed_tokens, s.num_computed_tokens + s.num_tokens);
    let limit = end.min(prompt_len as u64);
    let mut out = Vec::new();
    for (g, grp) in groups.iter().enumerate() {
        let b = grp.block_size.max(1);
        let table = s.block_tables.get(g).map_or(&[][..], |t| &t[..]);
        let mut k = n / b;
        while (k + 1) * b <= limit {
            let block_end = (k + 1) * b;
            let holds = match grp.kind {
                GroupKind::Mamba {
                    mode: MambaMode::Align,
                } => block_end == end,
                _ => block_end > n,
            };
            if holds {
                if let Some(r) = usize::try_from(k)
                    .ok()
                    .and_then(|i| table.get(i))
                    .filter(|r| r.id != 0)
                {
                    out.push((g, k as usize, r.id));
                }
            }
            k += 1;
        }
    }
    out
}
