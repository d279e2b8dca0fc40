//! How far an admitted request's computed prefix reaches: its local prefix, extended by what
//! the connector offers to load past it.

use crate::rules::geometry::Geometry;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::geometry::{CacheGroup, DEFAULT_NULL_BLOCK};

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
}
