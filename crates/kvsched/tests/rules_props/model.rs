//! The rules read again from docs/rules.md: mode `vllm`'s scan, the marked sets and who owns
//! each hit, the resumable boundary.

use std::collections::{BTreeSet, HashMap, HashSet};

use kvsched::rules::geometry::{BlockId, GroupKind};
use kvsched::rules::recovery::{Mode, RequestClass};

use super::case::{Case, Hit};

/// Mode `vllm`'s scan (docs/rules.md#scanning-a-request), from the text: indices `0 .. min(ceil(P / b_g), len) - 1`, nulls skipped.
pub fn hits_of(case: &Case, r: usize) -> Vec<Hit> {
    let p = case.p(r);
    let null = case.geo.null_block();
    let mut out = Vec::new();
    for (g, group) in case.geo.groups().iter().enumerate() {
        let b = group.block_size;
        let table = &case.requests[r].block_tables[g];
        let mut i = 0usize;
        while i < table.len() && (i as u64) * b < p {
            let id = table[i];
            if id != null && case.reported(g, id) {
                out.push(Hit {
                    g,
                    idx: i,
                    id,
                    pos: i as u64 * b,
                });
            }
            i += 1;
        }
    }
    out
}

/// Per request: its hits and, for each, the request that owns it (itself for a new hit),
/// from marked sets walked in canonical order — one per scan in `vllm`, one in `safe`.
pub fn ownership(case: &Case, mode: Mode) -> Vec<Vec<(Hit, usize)>> {
    let mut out = vec![Vec::new(); case.requests.len()];
    let mut marked: HashMap<(usize, BlockId), usize> = HashMap::new();
    let mut last_class = None;
    for r in case.canonical() {
        let class = case.requests[r].class;
        if mode == Mode::Vllm
            && last_class == Some(RequestClass::Async)
            && class == RequestClass::Sync
        {
            marked.clear(); // the sync scan has its own marked set
        }
        last_class = Some(class);
        let hits = hits_of(case, r);
        let owned: Vec<(Hit, usize)> = hits
            .iter()
            .map(|h| (*h, *marked.get(&(h.g, h.id)).unwrap_or(&r)))
            .collect();
        for (h, o) in &owned {
            if *o == r {
                marked.insert((h.g, h.id), r);
            }
        }
        out[r] = owned;
    }
    out
}

pub fn min_new_pos(owned: &[(Hit, usize)], r: usize) -> Option<u64> {
    owned
        .iter()
        .filter(|(_, o)| *o == r)
        .map(|(h, _)| h.pos)
        .min()
}

/// The resumable boundary (docs/rules.md#the-resumable-boundary): can request `r` resume at `c`
/// (a multiple of `S`, or, for a request with only old hits, its pre-step length
/// (docs/rules.md#only-old-hits-in-mode-safe): a Mamba group then needs `c` to be a multiple of
/// its block size, the only lengths whose state is kept)?
pub fn can_resume(case: &Case, r: usize, owned: &[(Hit, usize)], c: u64) -> bool {
    if c == 0 {
        return true;
    }
    let null = case.geo.null_block();
    let mine: HashSet<(usize, usize)> = owned
        .iter()
        .filter(|(_, o)| *o == r)
        .map(|(h, _)| (h.g, h.idx))
        .collect();
    case.geo.groups().iter().enumerate().all(|(g, group)| {
        let b = group.block_size;
        let table = &case.requests[r].block_tables[g];
        // real (present, non-null) and not an invalid entry owned by this request
        let usable = |i: u64| {
            let i = i as usize;
            i < table.len() && table[i] != null && !mine.contains(&(g, i))
        };
        match group.kind {
            GroupKind::FullAttention => (0..c.div_ceil(b)).all(usable),
            GroupKind::SlidingWindow { window } => {
                // entries holding tokens [max(0, c - window + 1), c): none for a window of
                // one token (docs/rules.md, "One-token sliding window")
                let first_token = (c + 1).saturating_sub(window);
                first_token >= c || (first_token / b..=(c - 1) / b).all(usable)
            }
            GroupKind::Mamba { .. } => c % b == 0 && usable(c / b - 1),
        }
    })
}

pub fn non_null_from(case: &Case, r: usize, boundary: u64) -> BTreeSet<BlockId> {
    let null = case.geo.null_block();
    let mut out = BTreeSet::new();
    for (g, group) in case.geo.groups().iter().enumerate() {
        let from = (boundary / group.block_size) as usize;
        for &id in case.requests[r].block_tables[g].iter().skip(from) {
            if id != null {
                out.insert(id);
            }
        }
    }
    out
}
