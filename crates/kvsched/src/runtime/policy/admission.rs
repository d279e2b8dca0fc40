//! How far an admitted request's computed prefix reaches: its local prefix, extended by what
//! the connector offers to load past it; and which entries of that external range hold
//! nothing, so nothing is loaded into them.

use super::growth::blocks_needed;
use super::state_ends::state_only;
use crate::rules::geometry::{CacheGroup, Geometry};

/// Where an admitted request's computed prefix ends, for a prompt of `prompt_len` tokens with
/// a local prefix of `local` tokens and `offered` external tokens past it: the offer rounded
/// down to `S`, never past the last multiple of `S` below the prompt's last token (which is
/// always computed), never below `local`. A result above `local` is the external range
/// `local..end` to load.
pub fn external_end(geo: &Geometry, prompt_len: u64, local: u64, offered: u64) -> u64 {
    let limit = geo.round_down_to_s(prompt_len.saturating_sub(1));
    geo.round_down_to_s(local.saturating_add(offered))
        .clamp(local, limit.max(local))
}

/// The entries of group `grp` below which an admitted request's table holds the null block
/// when its computed prefix ends at `end` (local prefix and external range): a Mamba `align`
/// group's states before the one at `end`, which no step of its wrote and no tier needs to
/// hold (`policy::state_ends`); none for other groups, whose fresh blocks the load fills.
pub fn external_nulls(grp: &CacheGroup, end: u64) -> usize {
    if state_only(grp) {
        grp.nullable_below(end) as usize
    } else {
        0
    }
}

/// The fewest fresh blocks, all groups together, that admitting a prompt of `prompt_len`
/// tokens with `held` entries per group from its local prefix `local` can take, whatever the
/// connector offers: the need at the longest external range [`external_end`] allows, whose
/// Mamba `align` nulls only lower it. A pool with fewer allocatable blocks cannot admit the
/// prompt, so the connector need not be asked.
pub fn fewest_blocks_needed(
    geo: &Geometry,
    prompt_len: u64,
    local: u64,
    held: impl IntoIterator<Item = usize>,
) -> usize {
    let end = external_end(geo, prompt_len, local, u64::MAX);
    blocks_needed_at(geo, prompt_len, end, held)
}

/// The fresh blocks, all groups together, that admitting a prompt of `prompt_len` tokens
/// with `held` entries per group takes when its computed prefix ends at `end`: each group's
/// table filled up to the prompt's end, past its held entries and its [`external_nulls`].
pub fn blocks_needed_at(
    geo: &Geometry,
    prompt_len: u64,
    end: u64,
    held: impl IntoIterator<Item = usize>,
) -> usize {
    let held = geo
        .groups()
        .iter()
        .zip(held)
        .map(|(grp, n)| n.max(external_nulls(grp, end)));
    blocks_needed(geo.groups(), held, prompt_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::geometry::{MambaMode, DEFAULT_NULL_BLOCK};

    #[test]
    fn only_the_mamba_align_state_at_the_end_is_loaded() {
        let align = CacheGroup::mamba(64, MambaMode::Align);
        assert_eq!(
            external_nulls(&align, 640),
            9,
            "entry 9, the state after 640, is loaded"
        );
        assert_eq!(external_nulls(&align, 64), 0);
        assert_eq!(external_nulls(&align, 0), 0);
        assert_eq!(
            external_nulls(&CacheGroup::mamba(64, MambaMode::All), 640),
            0
        );
        assert_eq!(external_nulls(&CacheGroup::full_attention(16), 640), 0);
        assert_eq!(external_nulls(&CacheGroup::sliding_window(16, 32), 640), 0);
    }

    #[test]
    fn the_offer_is_rounded_down_and_stops_before_the_last_token() {
        let g = Geometry::new(
            vec![CacheGroup::full_attention(16)],
            None,
            DEFAULT_NULL_BLOCK,
        )
        .expect("geometry");
        assert_eq!(external_end(&g, 100, 32, 40), 64);
        assert_eq!(external_end(&g, 100, 32, 1000), 96);
        assert_eq!(external_end(&g, 97, 32, 1000), 96);
        assert_eq!(external_end(&g, 96, 32, 1000), 80);
        assert_eq!(external_end(&g, 100, 32, 0), 32);
        assert_eq!(external_end(&g, 100, 32, u64::MAX), 96);
    }

    #[test]
    fn the_fewest_blocks_needed_bound_every_offer_and_meet_the_longest() {
        let g = Geometry::new(
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::mamba(64, MambaMode::Align),
                CacheGroup::sliding_window(16, 64),
            ],
            None,
            DEFAULT_NULL_BLOCK,
        )
        .expect("geometry");
        // 640 tokens from nothing: the longest offer ends at 576, where the Mamba group needs
        // only the states after 512 (2 of its 10 entries).
        assert_eq!(fewest_blocks_needed(&g, 640, 0, [0, 0, 0]), 40 + 2 + 40);
        for (prompt, local, held) in [
            (640, 0, [0, 0, 0]),
            (1000, 128, [8, 1, 8]),
            (70, 64, [4, 0, 4]),
        ] {
            let fewest = fewest_blocks_needed(&g, prompt, local, held);
            let need =
                |offer| blocks_needed_at(&g, prompt, external_end(&g, prompt, local, offer), held);
            assert!(
                (0..=prompt).all(|offer| need(offer) >= fewest),
                "{prompt} {local}"
            );
            assert_eq!(need(u64::MAX), fewest);
        }
    }
}
