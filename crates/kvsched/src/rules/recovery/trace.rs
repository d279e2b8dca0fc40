//! Why a request was decided as it was: the events the rules emit while they decide, and a
//! sink that collects them per request.
//!
//! The rules themselves report their reasons: [`scan_request_traced`](super::scan_request_traced)
//! and [`decide_traced`](super::decide_traced) (and the resumable boundary under them) call
//! [`Trace::event`] at each step. With [`NoTrace`] (what [`scan_request`](super::scan_request),
//! [`decide`](super::decide) and [`recover`](super::recover) use) [`Trace::ON`] is `false`:
//! every event, and the work done only to describe it, compiles away.

use crate::rules::geometry::BlockId;
use crate::rules::recovery::{Hit, HitOwner};

/// A receiver of the rules' reasons. Owners are of type `O`, as in [`HitOwner`].
pub trait Trace<O> {
    /// Whether the sink wants events. When `false`, the rules skip building them.
    const ON: bool;
    /// One step of a decision.
    fn event(&mut self, event: Event<O>);
}

/// The sink that wants nothing: tracing compiled out.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTrace;

impl<O> Trace<O> for NoTrace {
    const ON: bool = false;
    #[inline(always)]
    fn event(&mut self, _event: Event<O>) {}
}

/// Why an entry cannot serve a resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// The table has no entry at that index.
    Missing,
    /// The entry is the null block.
    Null,
    /// The entry is one of this request's own new hits (the given block): it holds garbage
    /// the request itself must recompute.
    OwnNewHit(BlockId),
}

/// The rule that set a request's resulting `num_computed_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundaryRule {
    /// No hit: `num_computed_tokens` unchanged.
    NoHit,
    /// Only old hits: back to the pre-step length `P` (in mode `safe`, when every group can
    /// resume there).
    OldHitsOnly,
    /// Mode `safe`, only old hits, and some group cannot resume at `P`: the largest multiple
    /// of `S` at or below `P` from which every group can resume, else 0
    /// (`docs/rules.md#only-old-hits-in-mode-safe`).
    SafeOldHitsResumable {
        /// The pre-step length `P`.
        pre_step: u64,
    },
    /// Mode `vllm`: `floor(earliest_new / S) · S`.
    VllmRoundDown {
        /// The earliest new-hit position.
        earliest_new: u64,
    },
    /// Mode `safe`: the largest multiple of `S` at or below `earliest_new` from which every
    /// group can resume, else 0 (`docs/rules.md#the-resumable-boundary`).
    SafeResumable {
        /// The earliest new-hit position.
        earliest_new: u64,
    },
}

/// One step of a decision, in the order the rules take them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event<O> {
    /// The scan range of `group`: its entries at indices `0 .. entries` (step 1 of
    /// `docs/rules.md#scanning-a-request`).
    Scan {
        /// Cache group.
        group: usize,
        /// Entries in range, `min(ceil(P / b_g), len)`.
        entries: usize,
    },
    /// A hit and who owns its block: [`HitOwner::Mine`] for a new hit, the earlier request
    /// that marked it for an old one.
    Hit {
        /// The hit.
        hit: Hit,
        /// Its owner.
        owner: HitOwner<O>,
    },
    /// Mode `safe`: where the candidate boundaries start.
    Candidates(Candidates),
    /// Mode `safe`: `group` cannot resume at `candidate` because the entry at `index`, which
    /// it needs (`docs/rules.md#the-resumable-boundary`), is unusable.
    Rejected {
        /// The candidate boundary.
        candidate: u64,
        /// The group that rejects it.
        group: usize,
        /// The needed entry that is unusable (the first such in the needed range).
        index: u64,
        /// Why it is unusable.
        why: Unusable,
    },
    /// The resulting `num_computed_tokens` and the rule that set it.
    Chosen {
        /// The new computed length.
        boundary: u64,
        /// The rule.
        rule: BoundaryRule,
    },
    /// An old hit and whether it gives a wait edge: under `safe` + `recompute`, the request
    /// waits for `owner` when the block starts below its new computed length; otherwise it
    /// rewrites the block as part of its own recompute (or no waits apply: `waits` false).
    OldHit {
        /// The block.
        block: BlockId,
        /// Its start position.
        position: u64,
        /// The request that owns it.
        owner: O,
        /// Whether this old hit is a wait edge (before `waits_for` keeps one entry per id and owner).
        waits: bool,
    },
}

/// Mode `safe`: the first candidate boundary, `floor(min(earliest_new, cap) / S) · S`, where
/// `cap` is the fewest tokens a group's table holds (`len_g · b_g`, one-token windows aside).
/// Candidates go down from `start` by `S` to 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidates {
    /// The earliest new-hit position.
    pub earliest_new: u64,
    /// The first (largest) candidate.
    pub start: u64,
    /// The table that lowered the first candidate below `floor(earliest_new / S) · S`, if
    /// one did.
    pub short_table: Option<ShortTable>,
}

/// A table too short to resume beyond `len · b_g`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortTable {
    /// Its group.
    pub group: usize,
    /// Its length.
    pub len: usize,
}

/// A group's scan range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanRange {
    /// Cache group.
    pub group: usize,
    /// Entries in range.
    pub entries: usize,
}

/// A rejected candidate boundary: which group, which entry, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The candidate.
    pub candidate: u64,
    /// The group.
    pub group: usize,
    /// The needed entry that is unusable.
    pub index: u64,
    /// Why.
    pub why: Unusable,
}

/// An old hit and whether it is a wait edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OldHit<O> {
    /// The block.
    pub block: BlockId,
    /// Its start position.
    pub position: u64,
    /// Its owner.
    pub owner: O,
    /// Whether the request waits for it (before `waits_for` keeps one entry per id and owner).
    pub waits: bool,
}

/// The reasons of one request's decision, collected from its [`Event`]s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestTrace<O> {
    /// Scan range per group, in group order.
    pub scan: Vec<ScanRange>,
    /// Every hit, in (group, index) order, with its owner.
    pub hits: Vec<(Hit, HitOwner<O>)>,
    /// Mode `safe` with a new hit: where the candidates start.
    pub candidates: Option<Candidates>,
    /// Every rejection, candidates in descending order, groups in order within one.
    pub rejected: Vec<Rejection>,
    /// The resulting computed length and its rule.
    pub chosen: Option<(u64, BoundaryRule)>,
    /// Every old hit, in hit order, with whether it is a wait edge.
    pub old_hits: Vec<OldHit<O>>,
}

impl<O> Default for RequestTrace<O> {
    fn default() -> Self {
        RequestTrace {
            scan: Vec::new(),
            hits: Vec::new(),
            candidates: None,
            rejected: Vec::new(),
            chosen: None,
            old_hits: Vec::new(),
        }
    }
}

impl<O> RequestTrace<O> {
    /// The same trace with every owner mapped through `f`.
    pub fn map_owners<P>(self, mut f: impl FnMut(O) -> P) -> RequestTrace<P> {
        RequestTrace {
            scan: self.scan,
            hits: self
                .hits
                .into_iter()
                .map(|(h, o)| {
                    let o = match o {
                        HitOwner::Mine => HitOwner::Mine,
                        HitOwner::Other(o) => HitOwner::Other(f(o)),
                    };
                    (h, o)
                })
                .collect(),
            candidates: self.candidates,
            rejected: self.rejected,
            chosen: self.chosen,
            old_hits: self
                .old_hits
                .into_iter()
                .map(|w| OldHit {
                    block: w.block,
                    position: w.position,
                    owner: f(w.owner),
                    waits: w.waits,
                })
                .collect(),
        }
    }
}

impl<O> Trace<O> for RequestTrace<O> {
    const ON: bool = true;
    fn event(&mut self, event: Event<O>) {
        match event {
            Event::Scan { group, entries } => self.scan.push(ScanRange { group, entries }),
            Event::Hit { hit, owner } => self.hits.push((hit, owner)),
            Event::Candidates(c) => self.candidates = Some(c),
            Event::Rejected {
                candidate,
                group,
                index,
                why,
            } => self.rejected.push(Rejection {
                candidate,
                group,
                index,
                why,
            }),
            Event::Chosen { boundary, rule } => self.chosen = Some((boundary, rule)),
            Event::OldHit {
                block,
                position,
                owner,
                waits,
            } => self.old_hits.push(OldHit {
                block,
                position,
                owner,
                waits,
            }),
        }
    }
}
