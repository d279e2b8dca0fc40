//! Deterministic recovery scenarios for benchmarks and `examples/gen_scenario.rs`.
//!
//! The reference scenario is the speed target of the recovery core: 1,000 sync requests of
//! 1,000 blocks of one full-attention group of block size 16, a quarter of them sharing a
//! 500-block prefix, 1 % of the requests with one invalid block, 16 scheduled tokens each.
//! Everything comes from a seeded SplitMix64, so a parameter set always gives the same
//! scenario.
#![allow(dead_code)] // each user of this module needs a different part of it

use std::io::{self, Write};

use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, GroupKind, MambaMode};
use kvsched::rules::recovery::{Mode, Policy, Request, RequestClass};

pub use kvsched_testkit::SplitMix64;

/// `k` distinct indices out of `0..n`, in random order (partial Fisher–Yates).
pub fn choose(rng: &mut SplitMix64, n: usize, k: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let k = k.min(n);
    for i in 0..k {
        let j = i + rng.below((n - i) as u64) as usize;
        v.swap(i, j);
    }
    v.truncate(k);
    v
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct ScenarioParams {
    /// Cache groups; the first one's block size is the unit of `blocks_per_request`.
    pub groups: Vec<CacheGroup>,
    /// Number of requests.
    pub num_requests: usize,
    /// Blocks per request, in blocks of the first group: a request holds
    /// `blocks_per_request · b_0` computed tokens (including the scheduled ones).
    pub blocks_per_request: u64,
    /// Percentage of the requests that share the prefix.
    pub shared_percent: u32,
    /// Length of the shared prefix, in blocks of the first group.
    pub shared_prefix_blocks: u64,
    /// Percentage of the requests given one invalid block (inside their scan range).
    pub invalid_percent: u32,
    /// Tokens scheduled in the step, per request (they are sync).
    pub scheduled_tokens: u64,
    /// PRNG seed.
    pub seed: u64,
}

impl ScenarioParams {
    /// The speed target: 1,000 × 1,000 blocks, one full-attention group of 16, 25 % sharing a
    /// 500-block prefix, 1 % with an invalid block, 16 scheduled tokens.
    pub fn reference() -> Self {
        ScenarioParams {
            groups: vec![CacheGroup::full_attention(16)],
            num_requests: 1000,
            blocks_per_request: 1000,
            shared_percent: 25,
            shared_prefix_blocks: 500,
            invalid_percent: 1,
            scheduled_tokens: 16,
            seed: 0x6b76_7363_6865_6400,
        }
    }

    /// The reference shape on a hybrid model: full attention 16, sliding window 32 (window
    /// 4,096 tokens), Mamba 64 in `align` mode.
    pub fn hybrid() -> Self {
        ScenarioParams {
            groups: vec![
                CacheGroup::full_attention(16),
                CacheGroup::sliding_window(32, 4096),
                CacheGroup::mamba(64, MambaMode::Align),
            ],
            ..Self::reference()
        }
    }

    /// The reference with another share of requests holding an invalid block.
    pub fn with_invalid_percent(percent: u32) -> Self {
        ScenarioParams {
            invalid_percent: percent,
            ..Self::reference()
        }
    }
}

/// A generated scenario: valid requests (sync, in running order) and a flat report.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The geometry (`S` = lcm, null block 0).
    pub geo: Geometry,
    /// The requests, in canonical order.
    pub requests: Vec<Request>,
    /// The flat report, ascending.
    pub invalid_blocks: Vec<BlockId>,
}

/// Builds the scenario of `p`. Block ids come from one pool (unique across groups), null = 0.
pub fn generate(p: &ScenarioParams) -> Scenario {
    let geo = Geometry::new(p.groups.clone(), None, 0).expect("valid benchmark geometry");
    let null = geo.null_block();
    let mut rng = SplitMix64::new(p.seed);
    let mut next_id: BlockId = 1;
    let mut fresh = || {
        let id = next_id;
        next_id += 1;
        id
    };
    let b0 = p.groups[0].block_size;
    let computed = p.blocks_per_request * b0;
    let scheduled = p.scheduled_tokens.min(computed);
    let pre_step = computed - scheduled;
    let prefix_tokens = p.shared_prefix_blocks.min(p.blocks_per_request) * b0;

    // The shared prefix, per group.
    let prefix: Vec<Vec<BlockId>> = p
        .groups
        .iter()
        .map(|g| (0..prefix_tokens / g.block_size).map(|_| fresh()).collect())
        .collect();
    let n = p.num_requests;
    let mut sharing = vec![false; n];
    for i in choose(&mut rng, n, n * p.shared_percent as usize / 100) {
        sharing[i] = true;
    }

    let mut requests = Vec::with_capacity(n);
    for (r, &shares) in sharing.iter().enumerate() {
        let mut tables = Vec::with_capacity(p.groups.len());
        for (g, group) in p.groups.iter().enumerate() {
            let b = group.block_size;
            let len = computed.div_ceil(b) as usize;
            let mut t: Vec<BlockId> = Vec::with_capacity(len);
            if shares {
                t.extend_from_slice(&prefix[g]);
            }
            while t.len() < len {
                t.push(fresh());
            }
            // Nulls where the kind has them.
            match group.kind {
                GroupKind::FullAttention => {}
                GroupKind::SlidingWindow { window } => {
                    for (i, e) in t.iter_mut().enumerate() {
                        // entirely outside the window of the pre-step length
                        if (i as u64 + 1) * b + window <= pre_step + 1 {
                            *e = null;
                        }
                    }
                }
                GroupKind::Mamba {
                    mode: MambaMode::Align,
                } => {
                    let last = t.len().saturating_sub(1);
                    t[..last].fill(null);
                }
                GroupKind::Mamba {
                    mode: MambaMode::All,
                } => {}
            }
            tables.push(t);
        }
        requests.push(Request {
            id: format!("r{r}"),
            class: RequestClass::Sync,
            num_computed_tokens: computed,
            num_scheduled_tokens: scheduled,
            block_tables: tables,
        });
    }

    // One invalid block in each chosen request: a random non-null entry of its scan range.
    let mut invalid = Vec::new();
    for r in choose(&mut rng, n, n * p.invalid_percent as usize / 100) {
        let candidates: Vec<BlockId> = p
            .groups
            .iter()
            .zip(&requests[r].block_tables)
            .flat_map(|(group, t)| {
                let scan = (pre_step.div_ceil(group.block_size) as usize).min(t.len());
                t[..scan].iter().copied()
            })
            .filter(|&id| id != null)
            .collect();
        if !candidates.is_empty() {
            invalid.push(candidates[rng.below(candidates.len() as u64) as usize]);
        }
    }
    invalid.sort_unstable();
    invalid.dedup();
    Scenario {
        geo,
        requests,
        invalid_blocks: invalid,
    }
}

impl Scenario {
    /// Table entries the recovery scan visits: `Σ_requests Σ_groups min(ceil(P / b_g), len)`.
    pub fn scanned_entries(&self) -> u64 {
        self.requests
            .iter()
            .map(|r| {
                let p = r.num_computed_tokens - r.num_scheduled_tokens;
                self.geo
                    .groups()
                    .iter()
                    .zip(&r.block_tables)
                    .map(|(g, t)| p.div_ceil(g.block_size).min(t.len() as u64))
                    .sum::<u64>()
            })
            .sum()
    }

    /// Writes the scenario as `kvsched replay` input (docs/replay.md).
    pub fn write_json(&self, mode: Mode, policy: Policy, out: &mut impl Write) -> io::Result<()> {
        let mode = match mode {
            Mode::Vllm => "vllm",
            Mode::Safe => "safe",
        };
        let policy = match policy {
            Policy::Recompute => "recompute",
            Policy::Fail => "fail",
        };
        write!(
            out,
            "{{\"mode\":\"{mode}\",\"policy\":\"{policy}\",\"null_block_id\":{},\"groups\":[",
            self.geo.null_block()
        )?;
        for (i, g) in self.geo.groups().iter().enumerate() {
            if i > 0 {
                write!(out, ",")?;
            }
            write!(
                out,
                "{{\"kind\":\"{}\",\"block_size\":{}",
                g.kind.name(),
                g.block_size
            )?;
            match g.kind {
                GroupKind::FullAttention => {}
                GroupKind::SlidingWindow { window } => write!(out, ",\"window\":{window}")?,
                GroupKind::Mamba { mode } => write!(
                    out,
                    ",\"mamba_mode\":\"{}\"",
                    match mode {
                        MambaMode::Align => "align",
                        MambaMode::All => "all",
                    }
                )?,
            }
            write!(out, "}}")?;
        }
        write!(out, "],\n\"requests\":[")?;
        for (i, r) in self.requests.iter().enumerate() {
            if i > 0 {
                write!(out, ",")?;
            }
            let class = match r.class {
                RequestClass::Async => "async",
                RequestClass::Sync => "sync",
            };
            // Request ids are generated as "r<number>": no escaping needed.
            write!(
                out,
                "\n{{\"id\":\"{}\",\"class\":\"{class}\",\"num_computed_tokens\":{},\
                 \"num_scheduled_tokens\":{},\"block_tables\":[",
                r.id, r.num_computed_tokens, r.num_scheduled_tokens
            )?;
            for (g, t) in r.block_tables.iter().enumerate() {
                if g > 0 {
                    write!(out, ",")?;
                }
                write_ids(out, t)?;
            }
            write!(out, "]}}")?;
        }
        write!(out, "],\n\"invalid_blocks\":")?;
        write_ids(out, &self.invalid_blocks)?;
        writeln!(out, "}}")
    }
}

fn write_ids(out: &mut impl Write, ids: &[BlockId]) -> io::Result<()> {
    write!(out, "[")?;
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            write!(out, ",")?;
        }
        write!(out, "{id}")?;
    }
    write!(out, "]")
}
