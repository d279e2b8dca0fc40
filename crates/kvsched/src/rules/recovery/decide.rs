//! Steps 3–5 of the rules: one request's [`Decision`] from its hits and who owns each of them
//! — the boundary it rolls back to, where it goes, what it claims, waits for and evicts.

use crate::rules::geometry::{BlockId, Geometry};
use crate::rules::recovery::boundary::{resumable_at_pre_step, resumable_boundary};
use crate::rules::recovery::trace::{BoundaryRule, Event, NoTrace, Trace};
use crate::rules::recovery::{scan_len, Hit, Mode, Policy, RequestClass, RequestView};

/// Who recomputes a hit's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitOwner<O> {
    /// This request: a *new* hit.
    Mine,
    /// Another request, earlier in canonical order: an *old* hit.
    Other(O),
}

/// Where an affected request goes (the "Then" of `docs/rules.md#mode-vllm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// No hit.
    Unaffected,
    /// `recompute`, async: its load result is cached only up to the new computed length.
    FailedRecving,
    /// `recompute`, sync: its sampled tokens from the step are discarded.
    Skip,
    /// `fail`: finished with an error.
    Failed,
}

/// One request's outcome under the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision<O> {
    /// Where the request goes.
    pub disposition: Disposition,
    /// The resulting computed length (unchanged when unaffected).
    pub num_computed_tokens: u64,
    /// Tokens to recompute: `P −` the new computed length, plus, for a request with only old
    /// hits, the step's scheduled tokens, which are discarded.
    pub affected_tokens: u64,
    /// Ids of the new hits, ascending, deduplicated.
    pub claimed_blocks: Vec<BlockId>,
    /// Old-hit blocks starting below the new computed length, with their owner, one entry
    /// per (id, owner), ascending (by id, then by owner: canonical order). An id has several owners only with one pool per group (the
    /// id in two groups' tables, owned by a different request in each): the request waits
    /// for every one of them. Mode `safe` + `recompute` only.
    pub waits_for: Vec<(BlockId, O)>,
    /// Blocks whose prefix-cache entry this request's rollback clears *as applied* under the
    /// mode and policy: non-null entries at indices `≥ boundary / b_g` in every group (mode
    /// `safe`: every affected request; `vllm`: sync requests with a new hit under `fail`).
    /// Ascending, deduplicated.
    pub evicted_blocks: Vec<BlockId>,
}

impl<O> Decision<O> {
    /// Whether the request had any hit.
    #[inline]
    pub fn affected(&self) -> bool {
        self.disposition != Disposition::Unaffected
    }

    /// The decision for a request without a hit: its computed length unchanged.
    pub fn unaffected(num_computed_tokens: u64) -> Self {
        Decision {
            disposition: Disposition::Unaffected,
            num_computed_tokens,
            affected_tokens: 0,
            claimed_blocks: Vec::new(),
            waits_for: Vec::new(),
            evicted_blocks: Vec::new(),
        }
    }
}

/// Decides one request (steps 3–5 of `docs/rules.md#mode-vllm`, and `docs/rules.md#mode-safe`):
/// `hits` from [`scan_request`](super::scan_request), `owners[k]` the owner of `hits[k]`.
///
/// The request must have passed [`validate_request`](super::validate_request); otherwise the
/// result is still defined (no panic) but meaningless.
pub fn decide<O: Ord + Clone>(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    req: RequestView<'_>,
    hits: &[Hit],
    owners: &[HitOwner<O>],
) -> Decision<O> {
    decide_traced(geo, mode, policy, req, hits, owners, &mut NoTrace)
}

/// [`decide`], reporting its reasons to `trace` (see [`Trace`]): every hit with its owner, in
/// mode `safe` the candidate boundaries and each group's reason for rejecting one, the chosen
/// boundary and its rule, and every old hit with whether it is a wait edge.
pub fn decide_traced<O: Ord + Clone, T: Trace<O>>(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    req: RequestView<'_>,
    hits: &[Hit],
    owners: &[HitOwner<O>],
    trace: &mut T,
) -> Decision<O> {
    debug_assert_eq!(hits.len(), owners.len());
    if T::ON {
        for (h, o) in hits.iter().zip(owners) {
            trace.event(Event::Hit {
                hit: *h,
                owner: o.clone(),
            });
        }
    }
    if hits.is_empty() {
        if T::ON {
            trace.event(Event::Chosen {
                boundary: req.num_computed_tokens,
                rule: BoundaryRule::NoHit,
            });
        }
        return Decision::unaffected(req.num_computed_tokens);
    }
    let p = req.pre_step_tokens();
    let min_new = hits
        .iter()
        .zip(owners)
        .filter(|(_, o)| matches!(o, HitOwner::Mine))
        .map(|(h, _)| h.position)
        .min();
    let (nct, affected_tokens, rule) = match min_new {
        Some(pos) => {
            let (boundary, rule) = match mode {
                Mode::Vllm => (
                    geo.round_down_to_s(pos),
                    BoundaryRule::VllmRoundDown { earliest_new: pos },
                ),
                Mode::Safe => (
                    resumable_boundary(geo, req, hits, owners, pos, trace),
                    BoundaryRule::SafeResumable { earliest_new: pos },
                ),
            };
            (boundary, p.saturating_sub(boundary), rule)
        }
        // Only old hits. Mode `safe` returns to `P` only where every group can resume: a
        // Mamba state inside a block is the one the discarded step advanced in place.
        // Planted bug for the rules' properties: back to `P` whether or not it is resumable.
        None => match mode {
            Mode::Safe
                if !planted!("old-hits-back-to-p") && !resumable_at_pre_step(geo, req, p) =>
            {
                let boundary = resumable_boundary(geo, req, hits, owners, p, trace);
                (
                    boundary,
                    req.num_scheduled_tokens.saturating_add(p - boundary),
                    BoundaryRule::SafeOldHitsResumable { pre_step: p },
                )
            }
            _ => (p, req.num_scheduled_tokens, BoundaryRule::OldHitsOnly),
        },
    };
    if T::ON {
        trace.event(Event::Chosen {
            boundary: nct,
            rule,
        });
    }
    let disposition = match (policy, req.class) {
        (Policy::Fail, _) => Disposition::Failed,
        (Policy::Recompute, RequestClass::Async) => Disposition::FailedRecving,
        (Policy::Recompute, RequestClass::Sync) => Disposition::Skip,
    };
    let mut claimed_blocks: Vec<BlockId> = hits
        .iter()
        .zip(owners)
        .filter(|(_, o)| matches!(o, HitOwner::Mine))
        .map(|(h, _)| h.block)
        .collect();
    claimed_blocks.sort_unstable();
    claimed_blocks.dedup();

    let waits_apply = mode == Mode::Safe && policy == Policy::Recompute;
    let mut waits_for = Vec::new();
    for (h, o) in hits.iter().zip(owners) {
        if let HitOwner::Other(owner) = o {
            let waits = waits_apply && h.position < nct;
            if waits {
                waits_for.push((h.block, owner.clone()));
            }
            if T::ON {
                trace.event(Event::OldHit {
                    block: h.block,
                    position: h.position,
                    owner: owner.clone(),
                    waits,
                });
            }
        }
    }
    // One entry per (id, owner): an id with an owner in each of two groups (one pool per
    // group) is waited for until both have rewritten it.
    waits_for.sort_unstable();
    if planted!("waits-one-owner-per-id") {
        // Planted bug for the rules' examples: one entry per id, its least owner only.
        waits_for.dedup_by(|later, first| later.0 == first.0);
    } else {
        waits_for.dedup();
    }

    // Mode `safe`: every affected request, whatever wrote its entries from the boundary on
    // (a load that failed, or a step that read a block that did) may have left garbage in
    // them. Mode `vllm`: sync requests with a new hit under `fail`.
    let applies_eviction = match mode {
        // Planted bug for the rules' properties: a request with only old hits evicts nothing.
        Mode::Safe if planted!("old-hits-evict-nothing") => min_new.is_some(),
        // Planted bug for the model test: nothing is evicted, so a Mamba `all` block a
        // request rolled back below stays cached while its steps write the states of lengths
        // inside it there, and a prefix hit reads one as the block-end state.
        Mode::Safe if planted!("safe-evicts-nothing") => false,
        Mode::Safe => true,
        Mode::Vllm => {
            // Planted bug for the model test: mode vllm evicts a failed sync load's blocks
            // under `recompute` too, so none stays cached for a later request to hit.
            min_new.is_some()
                && req.class == RequestClass::Sync
                && (policy == Policy::Fail || planted!("vllm-evicts-on-recompute"))
        }
    };
    let evicted_blocks = if applies_eviction {
        entries_from(geo, req, nct)
    } else {
        Vec::new()
    };

    Decision {
        disposition,
        num_computed_tokens: nct,
        affected_tokens,
        claimed_blocks,
        waits_for,
        evicted_blocks,
    }
}

/// Non-null entries at indices `≥ boundary / b_g` of every group, ascending, deduplicated.
fn entries_from(geo: &Geometry, req: RequestView<'_>, boundary: u64) -> Vec<BlockId> {
    let null = geo.null_block();
    let mut out = Vec::new();
    for (group, table) in geo.groups().iter().zip(req.block_tables) {
        let from = scan_len(boundary / group.block_size, table.len());
        out.extend(table[from..].iter().copied().filter(|&id| id != null));
    }
    out.sort_unstable();
    out.dedup();
    out
}
