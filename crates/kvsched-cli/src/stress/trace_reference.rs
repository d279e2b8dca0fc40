//! The reference a trace replay is compared with: the share of the replayed requests' prompt
//! tokens a prefix cache could serve at all (unbounded) and with a given capacity (LRU), on
//! the trace's 512-token blocks.
//!
//! A block is cached under its prefix — the ids at positions `0..=i` — not under its id
//! alone: a prefix cache serves block `i` of a request only if an earlier request had the
//! same ids at positions `0..=i`, and at most the tokens that earlier request held in that
//! block (a partial last block holds fewer than 512). An id that comes back at another
//! position is another prefix, never matched with the first, as the run's own prefix cache
//! (whose block hashes chain over the prompt) never matches it. Like the run, the reference
//! never serves a prompt's last token: the engine computes it to sample the first output.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::config::StressConfig;
use super::trace::{TraceRequest, TRACE_BLOCK_TOKENS};

/// The share of the replayed requests' prompt tokens a prefix cache could serve, counted on
/// the trace's 512-token blocks ([`cache_served`]).
#[derive(Clone, Debug, Serialize)]
pub struct TraceReference {
    pub(crate) requests: u64,
    pub(crate) prompt_tokens: u64,
    /// An unbounded prefix cache.
    pub(crate) infinite_cache_share: f64,
    /// An LRU cache as large as the device pool.
    pub(crate) device_pool_lru_share: f64,
    /// The device pool, in 512-token blocks: how many 512-token prefixes of every cache
    /// group's blocks it holds ([`pool_blocks_512`]).
    pub(crate) device_pool_blocks_512: u64,
    /// An LRU cache as large as the device pool and the tier together (the unbounded share
    /// when the tier is unbounded: a Redis store without `--redis-maxmemory`).
    pub(crate) device_and_tier_lru_share: f64,
    /// The tier, in 512-token blocks of chunks (`null`: unbounded).
    pub(crate) tier_blocks_512: Option<u64>,
}

/// The reference of `reqs`, the requests replayed with `cfg`.
pub(crate) fn reference(cfg: &StressConfig, reqs: &[TraceRequest]) -> TraceReference {
    let blocks_512 = pool_blocks_512(cfg);
    let (total, infinite) = cache_served(reqs, None);
    let (_, lru) = cache_served(reqs, Some(blocks_512));
    let tier_blocks_512 = tier_tokens(cfg).map(|t| t / TRACE_BLOCK_TOKENS);
    let with_tier = match tier_blocks_512 {
        Some(t) => cache_served(reqs, Some(blocks_512.saturating_add(t))).1,
        None => infinite,
    };
    let share = |n: u64| (n as f64 / total.max(1) as f64 * 1e4).round() / 1e4;
    TraceReference {
        requests: reqs.len() as u64,
        prompt_tokens: total,
        infinite_cache_share: share(infinite),
        device_pool_lru_share: share(lru),
        device_pool_blocks_512: blocks_512,
        device_and_tier_lru_share: share(with_tier),
        tier_blocks_512,
    }
}

/// The device pool of `cfg` in 512-token blocks: the most `n` such that a prefix of
/// `n × 512` tokens, in the blocks of every cache group (each group draws its own blocks
/// from the one pool, the count `trace_fit::check_fits` makes), fits `--pool-blocks`.
pub(crate) fn pool_blocks_512(cfg: &StressConfig) -> u64 {
    let groups = cfg.groups.groups();
    let pool = cfg.pool_blocks as u64;
    let cost = |n: u64| -> u64 {
        let tokens = n.saturating_mul(TRACE_BLOCK_TOKENS);
        groups
            .iter()
            .map(|g| g.blocks_for_tokens(tokens))
            .fold(0u64, u64::saturating_add)
    };
    // A group of block size `b` costs at least ⌈n × 512 / b⌉ blocks, so `hi` past
    // `pool × b_max / 512` costs more than the pool holds (and the cost grows with `n`).
    let widest = groups.iter().map(|g| g.block_size).max().unwrap_or(1);
    let (mut lo, mut hi) = (0u64, pool.saturating_mul(widest) / TRACE_BLOCK_TOKENS + 1);
    if cost(hi) <= pool {
        return hi;
    }
    // Invariant: cost(lo) ≤ pool < cost(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if cost(mid) <= pool {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// How many tokens of KV the tier of `cfg` holds (`None`: unbounded): its capacity over the
/// stored bytes per token, each chunk one block of one group behind its header.
fn tier_tokens(cfg: &StressConfig) -> Option<u64> {
    let capacity = if cfg.store.is_redis() {
        cfg.redis_maxmemory?
    } else {
        cfg.store_capacity
    };
    let header = kvsched::kv::HEADER_LEN as f64;
    let per_token: f64 = cfg
        .groups
        .groups()
        .iter()
        .map(|g| {
            let payload = match g.kind {
                kvsched::rules::geometry::GroupKind::Mamba { .. } => cfg.mamba_state_bytes,
                _ => cfg.kv_bytes_per_token.saturating_mul(g.block_size),
            };
            (header + payload as f64) / g.block_size.max(1) as f64
        })
        .sum();
    Some((capacity as f64 / per_token.max(1e-9)) as u64)
}

/// Tokens of block `i` of `r` (512, or what the last block holds).
fn block_len(r: &TraceRequest, i: usize) -> u64 {
    r.input_length
        .saturating_sub(i as u64 * TRACE_BLOCK_TOKENS)
        .min(TRACE_BLOCK_TOKENS)
}

/// Prompt tokens in all of `reqs`, and those a prefix cache of `capacity` 512-token blocks
/// (`None`: unbounded) would serve (see the [module docs](self)): each request reads its
/// blocks in order, by prefix, until the first the cache does not hold or holds only in
/// part, never its last token; then it inserts all its blocks as most recently used (LRU),
/// each holding the most tokens any request put in it.
pub(crate) fn cache_served(reqs: &[TraceRequest], capacity: Option<u64>) -> (u64, u64) {
    let (mut total, mut served) = (0u64, 0u64);
    // (prefix up to block i - 1, id of block i) → the prefix up to block i, numbered from 1
    // (0: the empty prefix). Names only: kept when the cache lets the block go, so that a
    // prefix cached again has its old name and the blocks after it theirs.
    let mut names: HashMap<(u64, u64), u64> = HashMap::new();
    // Cached prefix → (last use, tokens held); last use → prefix (the oldest first).
    let mut held: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut order: BTreeMap<u64, u64> = BTreeMap::new();
    let mut tick = 0u64;
    let mut prefixes = Vec::new();
    for r in reqs {
        total += r.input_length;
        prefixes.clear();
        let mut parent = 0u64;
        for &h in &r.hash_ids {
            let next = names.len() as u64 + 1;
            parent = *names.entry((parent, h)).or_insert(next);
            prefixes.push(parent);
        }
        let mut hit = 0u64;
        for (i, p) in prefixes.iter().enumerate() {
            let Some(&(_, tokens)) = held.get(p) else {
                break;
            };
            let len = block_len(r, i);
            hit += tokens.min(len);
            if tokens < len {
                break;
            }
        }
        served += hit.min(r.input_length.saturating_sub(1));
        for (i, &p) in prefixes.iter().enumerate() {
            tick += 1;
            let mut tokens = block_len(r, i);
            if let Some((old, t)) = held.get(&p).copied() {
                order.remove(&old);
                tokens = tokens.max(t);
            }
            held.insert(p, (tick, tokens));
            order.insert(tick, p);
        }
        if let Some(cap) = capacity {
            while held.len() as u64 > cap {
                let Some((_, p)) = order.pop_first() else {
                    break;
                };
                held.remove(&p);
            }
        }
    }
    (total, served)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(input_length: u64, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest {
            line: 1,
            arrival_ms: 0,
            input_length,
            output_length: 1,
            hash_ids: hash_ids.to_vec(),
        }
    }

    /// An id that comes back at another position is another prefix: nothing is served.
    #[test]
    fn an_id_at_another_position_is_not_a_prefix_hit() {
        // [1, 2] then [2, 1]: block 0 of the second is id 2 after nothing, which no earlier
        // request had at position 0, so the cache serves 0 of its 1,024 tokens (the old,
        // id-keyed count served all 1,024: 50% of 2,048).
        let reqs = [req(1024, &[1, 2]), req(1024, &[2, 1])];
        assert_eq!(cache_served(&reqs, None), (2048, 0));
        // [1, 2] then [3, 2]: id 2 follows another block: 0 again.
        let reqs = [req(1024, &[1, 2]), req(1024, &[3, 2])];
        assert_eq!(cache_served(&reqs, None), (2048, 0));
        // [1, 2] then [1, 3]: block 0 is served (512), block 1 is not.
        let reqs = [req(1024, &[1, 2]), req(1024, &[1, 3])];
        assert_eq!(cache_served(&reqs, None), (2048, 512));
    }

    /// A partial last block serves only the tokens it held, and the prompt's last token is
    /// never served.
    #[test]
    fn a_partial_block_serves_what_it_held_and_never_the_last_token() {
        // 600 tokens [1, 2] hold 512 of block 1 and 88 of block 2; then 1,024 tokens [1, 2]
        // find 512 + 88 = 600 of them (the old count served 512 + 512 = 1,024 of 1,624,
        // 63.0%; now 600 of 1,624, 36.9%).
        let reqs = [req(600, &[1, 2]), req(1024, &[1, 2])];
        assert_eq!(cache_served(&reqs, None), (1624, 600));
        // Then a third 1,024 [1, 2]: block 2 now holds 512, all but the last token served:
        // 600 + 1,023.
        let reqs = [req(600, &[1, 2]), req(1024, &[1, 2]), req(1024, &[1, 2])];
        assert_eq!(cache_served(&reqs, None), (2648, 600 + 1023));
        // The same prompt twice: all but its last token (599 of 600).
        let reqs = [req(600, &[1, 2]), req(600, &[1, 2])];
        assert_eq!(cache_served(&reqs, None), (1200, 599));
    }

    /// An LRU cache of one block keeps only the last request's last block; a prefix evicted
    /// and cached again finds its later blocks under their old names.
    #[test]
    fn the_lru_cache_evicts_the_oldest_prefix() {
        // Capacity 1: after [1, 2] only prefix [1, 2] is held, so [1, 2] again misses block
        // 0 and serves nothing.
        let reqs = [req(1024, &[1, 2]), req(1024, &[1, 2])];
        assert_eq!(cache_served(&reqs, Some(1)), (2048, 0));
        // Capacity 2: both blocks held: 1,023 served.
        assert_eq!(cache_served(&reqs, Some(2)), (2048, 1023));
    }

    /// The device pool in 512-token blocks counts every group's blocks: dense (16-token
    /// blocks) 16,384 / 32 = 512; hybrid-mamba (16 + 64) 16,384 / (32 + 8) = 409.
    #[test]
    fn the_pool_counts_the_blocks_of_every_group() {
        let mut cfg = StressConfig::default();
        assert_eq!(cfg.pool_blocks, 16_384);
        assert_eq!(pool_blocks_512(&cfg), 512);
        cfg.groups = "hybrid-mamba".parse().expect("preset");
        assert_eq!(pool_blocks_512(&cfg), 409);
    }
}
