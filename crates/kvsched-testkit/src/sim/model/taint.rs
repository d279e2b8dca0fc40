//! [`Taint`]: which failed sync load each wrong read comes from, and how the reader came to
//! hold the block — counted from what the engine actually read and wrote, not estimated.
//!
//! When a step's sync load reports blocks invalid, every slot of those blocks (a token's K/V
//! in an attention block, the state of a Mamba entry) is marked as holding that load's
//! garbage, and the requests of that step, other than the loader, whose tables hold one of
//! them are its **sharers**. A read of a marked slot taints the reader from the position
//! that read it, with a cause:
//!
//! * [`Cause::HeldAtFailure`] — the reader held the block in the step its load failed: a
//!   sharer admitted onto the load's destinations before the load ran, or the loader itself.
//!   vLLM's rules send every such request but the first (in canonical order) back to its
//!   pre-step length, trusting the first to rewrite the blocks: while that recompute lasts,
//!   the others read garbage (vLLM #49250). Reads in the failing step itself count too, but
//!   their samples are discarded and so never judged.
//! * [`Cause::CachedAfterRollback`] — the reader came to the block after the failure: the
//!   prefix cache still offered it (vLLM keeps rolled-back blocks cached under `recompute`).
//!
//! A tainted request's writes carry its cause, so a request reading them is tainted with the
//! same cause; an untainted write clears a slot. A request scheduled from a computed length at
//! or below the position it was tainted from recomputes everything its taint touched: its
//! taint is cleared. Reads in the step whose load failed count like any other: recovery
//! discards that step's samples, and a kept sample is judged only once settled.

use std::sync::Arc as StdArc;

use rustc_hash::{FxHashMap, FxHashSet};

use kvsched::rules::geometry::{CacheGroup, GroupKind};
use kvsched::{BlockRef, StepPlan};

/// Which behaviour a wrong read comes from (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// A request that held a failed sync load's block when it failed read it (vLLM #49250).
    HeldAtFailure,
    /// A request reached a failed load's block after the failure, through the prefix cache.
    CachedAfterRollback,
}

/// Wrong tokens by the cause of the reads that made them (module docs of `taint`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WrongTokenCauses {
    /// Requests that held a failed sync load's blocks when it failed (its sharers, or its
    /// loader) read them before they were rewritten (vLLM #49250).
    pub sharers_read_failed_load: u64,
    /// Requests hit a failed load's rolled-back blocks the prefix cache still held.
    pub rolled_back_blocks_cached: u64,
    /// Wrong tokens of a request that read no failed load's slot.
    pub unattributed: u64,
}

impl WrongTokenCauses {
    /// Counts one wrong token of a request tainted by `cause` (`None`: untainted).
    pub(super) fn count(&mut self, cause: Option<Cause>) {
        match cause {
            Some(Cause::HeldAtFailure) => self.sharers_read_failed_load += 1,
            Some(Cause::CachedAfterRollback) => self.rolled_back_blocks_cached += 1,
            None => self.unattributed += 1,
        }
    }
}

/// Sums the causes of several runs (every field named, as for `ModelCounts`).
impl std::ops::AddAssign<&WrongTokenCauses> for WrongTokenCauses {
    fn add_assign(&mut self, other: &WrongTokenCauses) {
        let WrongTokenCauses {
            sharers_read_failed_load,
            rolled_back_blocks_cached,
            unattributed,
        } = other;
        self.sharers_read_failed_load += sharers_read_failed_load;
        self.rolled_back_blocks_cached += rolled_back_blocks_cached;
        self.unattributed += unattributed;
    }
}

/// What a slot holds, when it is not what the request decoded alone would read.
#[derive(Clone, Copy, Debug)]
enum Mark {
    /// The garbage of failed load `i` (an index into `Taint::loads`).
    Failed(usize),
    /// What a request tainted by the cause wrote.
    Derived(Cause),
}

/// A failed sync load: its loader and its sharers.
#[derive(Debug)]
struct FailedLoad {
    loader: StdArc<str>,
    sharers: FxHashSet<StdArc<str>>,
}

/// A slot: (block, generation, offset) — the offset a token's index in an attention block,
/// 0 for a Mamba entry.
type Slot = (u64, u32, u64);

/// The tracker (module docs).
#[derive(Debug, Default)]
pub(super) struct Taint {
    /// Sharers counted over every failed sync load.
    pub(super) sharers: u64,
    /// Reads of a slot a failed load left, or a tainted request wrote.
    pub(super) reads: u64,
    loads: Vec<FailedLoad>,
    marks: FxHashMap<Slot, Mark>,
    /// Tainted requests: (position tainted from, cause).
    reqs: FxHashMap<StdArc<str>, (u64, Cause)>,
}

impl Taint {
    /// Marks every slot of the `bad` blocks `loader`'s sync load in `plan` reported, and takes
    /// the step's other requests holding one of them as the load's sharers.
    pub(super) fn failed_load(
        &mut self,
        groups: &[CacheGroup],
        plan: &StepPlan,
        loader: &StdArc<str>,
        bad: &[BlockRef],
    ) {
        if bad.is_empty() {
            return;
        }
        let i = self.loads.len();
        let bad_ids: FxHashSet<u64> = bad.iter().map(|b| b.id).collect();
        let mut sharers = FxHashSet::default();
        for s in plan.scheduled.iter().filter(|s| &s.id != loader) {
            let holds = s
                .block_tables
                .iter()
                .any(|t| t.iter().any(|b| bad_ids.contains(&b.id)));
            if holds {
                sharers.insert(s.id.clone());
            }
        }
        let Some(own) = plan.scheduled.iter().find(|s| &s.id == loader) else {
            return;
        };
        for (g, table) in own.block_tables.iter().enumerate() {
            let Some(grp) = groups.get(g) else {
                continue;
            };
            let slots = match grp.kind {
                GroupKind::Mamba { .. } => 1,
                _ => grp.block_size,
            };
            for b in table.iter().filter(|b| bad.contains(b)) {
                for off in 0..slots {
                    self.marks
                        .insert((b.id, b.generation, off), Mark::Failed(i));
                }
            }
        }
        self.sharers += sharers.len() as u64;
        self.loads.push(FailedLoad {
            loader: loader.clone(),
            sharers,
        });
    }

    /// The start of `id`'s step at computed length `n`: a request recomputing from at or
    /// below where it was tainted is clean again.
    pub(super) fn schedule(&mut self, id: &StdArc<str>, n: u64) {
        if self.reqs.get(id).is_some_and(|&(from, _)| n <= from) {
            self.reqs.remove(id);
        }
    }

    /// `id`, computing position `pos`, read slot (`b`, `off`).
    pub(super) fn read(&mut self, id: &StdArc<str>, pos: u64, b: BlockRef, off: u64) {
        let Some(&mark) = self.marks.get(&(b.id, b.generation, off)) else {
            return;
        };
        self.reads += 1;
        let cause = match mark {
            Mark::Derived(c) => c,
            Mark::Failed(i) => match self.loads.get(i) {
                Some(l) if &l.loader == id || l.sharers.contains(id) => Cause::HeldAtFailure,
                _ => Cause::CachedAfterRollback,
            },
        };
        let e = self.reqs.entry(id.clone()).or_insert((pos, cause));
        if pos < e.0 {
            *e = (pos, e.1);
        }
    }

    /// `id`, computing position `pos`, wrote slot (`b`, `off`).
    pub(super) fn write(&mut self, id: &StdArc<str>, pos: u64, b: BlockRef, off: u64) {
        let slot = (b.id, b.generation, off);
        match self.reqs.get(id) {
            Some(&(from, cause)) if from <= pos => {
                self.marks.insert(slot, Mark::Derived(cause));
            }
            _ => {
                self.marks.remove(&slot);
            }
        }
    }

    /// The cause `id` is tainted by, if it is.
    pub(super) fn cause(&self, id: &str) -> Option<Cause> {
        self.reqs.get(id).map(|&(_, c)| c)
    }

    /// Forgets an ended request.
    pub(super) fn end(&mut self, id: &str) {
        self.reqs.remove(id);
    }
}
