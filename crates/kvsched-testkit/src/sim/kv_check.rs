//! [`KvChecker`]: the verifying half of a simulated engine. It runs a step on real KV bytes
//! the way a model would — sync loads write, every scheduled request reads what its tables
//! name, computed tokens are written — and checks every byte it reads against a reference
//! computed from the request's own tokens.
//!
//! # The contract (what "garbage" means)
//!
//! 1. Reference bytes of attention token `t` in group `g`: `H(tag, g, t, chain(x[0..=t]))`;
//!    of a Mamba state after `m` tokens: `H(tag, g, m, chain(x[0..m]))` — from the request's
//!    tokens only, never from memory or a tier.
//! 2. A full-attention or sliding-window entry `k` holds the references of tokens
//!    `[k·b, (k+1)·b)`; a Mamba entry `k` the state at `min((k+1)·b, computed)`.
//! 3. A request scheduled for `[n, n+k)` reads: full attention `[0, n)`; a window of `w`
//!    tokens `[max(0, n−w+1), n)`; Mamba the state at `n` (none at `n = 0`).
//! 4. A step: (a) sync loads write; (b) every scheduled request reads memory as (a) left it;
//!    (c) all computed tokens are written — as garbage by a request that read garbage.
//! 5. A read unit (request, step, group, position; one per Mamba state) is garbage if its
//!    bytes differ from the reference or it is read through a null entry.
//! 6. A load writes poison into every block it reports invalid (the connector's job).
//! 7. Garbage units of steps whose output the engine keeps are `garbage_reads`; those of
//!    steps [`Runtime::update`](kvsched::Runtime::update) says to discard are
//!    `garbage_reads_discarded`.
//! 8. A request's tokens are its prompt and its kept samples, so a step that samples ends
//!    where they end: `n + k` = their count. A kept sample of a step that ends elsewhere (the
//!    scheduler asked again for a position the engine already emitted, or skipped one) is a
//!    `misplaced_samples` — a wrong output in any mode.
//!
//! # What is checked when
//!
//! Every read unit of every step is accounted for (`units_read`), but its bytes are compared
//! only when they may have changed, so verifying costs in proportion to the bytes written
//! and loaded, not to context × steps. The memory keeps a write epoch per block
//! ([`KvMemory::write_epoch`]) that every write changes — the engine's computed tokens, a
//! load's payload, a poisoned block — and each request remembers, per entry of its tables,
//! the block, its epoch and the positions that matched there. A unit is compared:
//!
//! * the first time the request reads it (after the load or the write that filled it);
//! * whenever its entry names another block than at the last match (a table changed: a
//!   preempted request back on new blocks, a block reused);
//! * whenever its block's epoch moved since the last match: any write into the block by
//!   anyone (a sharer's recompute, a late load landing in a reused block, a poison) makes
//!   every unit of the block compared again at the next read — so a request's last, still
//!   growing block is compared at every step it is written;
//! * always, when the memory keeps no epochs (`write_epoch` is `None`);
//! * and a unit found garbage is never recorded as matched, so it is compared and counted
//!   again at every read, exactly as if everything were compared every step.
//!
//! A unit through a null entry is garbage at every read (nothing is recorded for it). The
//! rest, bytes that matched at the block's current epoch, are `units_skipped`: they still
//! match, since a reference depends only on the request's tokens and no write reached them.
//! The epoch is loaded before the bytes (Acquire, against the writer's Release after its
//! bytes), so a write racing a read either shows in the bytes read or leaves the epoch past
//! the one recorded. The counts of garbage are therefore those of comparing every unit at
//! every step; `kv_bytes_verified` counts the bytes actually compared.

use std::sync::Arc as StdArc;

use rustc_hash::FxHashMap;

use super::kv_seen::Seen;
use kvsched::connector::{KvConnector, LoadResult};
use kvsched::kv::KvMemory;
use kvsched::rules::geometry::{CacheGroup, GroupKind, MambaMode};
use kvsched::{BlockRef, BlockTable, ScheduledRequest, StepPlan};

/// What a [`KvChecker`] counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvCheckCounts {
    /// Garbage read units in steps whose output was kept (must be 0 in mode `safe`).
    pub garbage_reads: u64,
    /// Garbage read units in steps whose output was discarded.
    pub garbage_reads_discarded: u64,
    /// Of all garbage units, those read through a null entry.
    pub null_reads: u64,
    /// Read units the steps made (contract rule 5), checked now or skipped.
    pub units_read: u64,
    /// Of `units_read`, those whose bytes were not read again: they matched their reference
    /// at an earlier read of the same request, and no write has reached their block since.
    pub units_skipped: u64,
    /// Bytes compared against their reference.
    pub kv_bytes_verified: u64,
    /// Bytes the engine wrote for computed tokens.
    pub kv_bytes_written: u64,
    /// Sync loads run, and those that reported invalid blocks.
    pub sync_loads: u64,
    /// See `sync_loads`.
    pub sync_loads_failed: u64,
    /// Kept samples of steps that did not end at the request's next token (contract rule 8;
    /// must be 0 in every mode).
    pub misplaced_samples: u64,
}

/// One request's tokens and their chained prefix hashes.
#[derive(Debug)]
struct Tokens {
    tokens: Vec<u32>,
    /// `chain[t]` = hash of `x[0..t]` (so `chain[0]` is the empty prefix).
    chain: Vec<u64>,
    prompt_len: usize,
    /// What this request already checked (see `kv_seen`).
    seen: Seen,
}

impl Tokens {
    fn new(prompt: &[u32]) -> Tokens {
        let mut t = Tokens {
            tokens: Vec::with_capacity(prompt.len() + 16),
            chain: vec![0x9e37_79b9_7f4a_7c15],
            prompt_len: prompt.len(),
            seen: Seen::default(),
        };
        for &x in prompt {
            t.push(x);
        }
        t
    }
    fn push(&mut self, x: u32) {
        let last = *self.chain.last().unwrap_or(&0);
        self.chain.push(mix(last ^ u64::from(x)));
        self.tokens.push(x);
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The reference bytes of position `pos` (a Mamba state: after `pos` tokens) of group `g`
/// whose prefix hashes to `chain`, for tag `tag` (contract rule 1).
fn reference(tag: u64, g: usize, pos: u64, chain: u64, out: &mut [u8]) {
    let mut h = mix(tag ^ mix(g as u64 ^ mix(pos ^ chain)));
    for c in out.chunks_mut(8) {
        let b = h.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
        h = mix(h);
    }
}

/// The first `len` bytes of `buf`, grown as needed.
fn scratch(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

/// The per-step result of [`KvChecker::run_step`], settled by [`KvChecker::settle`].
#[derive(Debug, Default)]
pub struct StepCheck {
    /// Blocks the step's sync loads reported invalid (for `StepOutput::invalid_blocks`).
    pub invalid_blocks: Vec<BlockRef>,
    garbage: FxHashMap<StdArc<str>, (u64, u64)>,
    /// Requests that read garbage this step.
    pub tainted: Vec<StdArc<str>>,
}

/// The verifying engine's memory model: see the module docs for the contract.
pub struct KvChecker {
    groups: Vec<CacheGroup>,
    tag: u64,
    bytes_per_token: usize,
    state_bytes: usize,
    memory: StdArc<dyn KvMemory>,
    reqs: FxHashMap<StdArc<str>, Tokens>,
    counters: KvCheckCounts,
    verify: bool,
    /// Bytes read or written by one access (reused).
    scratch: Vec<u8>,
}

impl std::fmt::Debug for KvChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvChecker")
            .field("groups", &self.groups)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl KvChecker {
    /// A checker over `memory`, whose layout must be `bytes_per_token · b` for attention
    /// groups and `state_bytes` for Mamba groups (`KvLayout::for_groups`).
    pub fn new(
        groups: Vec<CacheGroup>,
        tag: u64,
        bytes_per_token: usize,
        state_bytes: usize,
        memory: StdArc<dyn KvMemory>,
    ) -> KvChecker {
        KvChecker {
            groups,
            tag,
            bytes_per_token: bytes_per_token.max(1),
            state_bytes: state_bytes.max(1),
            memory,
            reqs: FxHashMap::default(),
            counters: KvCheckCounts::default(),
            verify: true,
            scratch: Vec::new(),
        }
    }

    /// Whether phase (b) reads and checks (on by default). Off, a step still runs its sync
    /// loads and writes what it computes (the bytes move as before) but reads nothing, so no
    /// garbage is counted: this measures what verifying costs.
    pub fn set_verify(&mut self, on: bool) {
        self.verify = on;
    }

    /// Counters so far.
    pub fn counts(&self) -> &KvCheckCounts {
        &self.counters
    }

    /// Registers a request's prompt (before its first step).
    pub fn add_request(&mut self, id: &str, prompt: &[u32]) {
        self.reqs.insert(id.into(), Tokens::new(prompt));
    }

    /// Forgets a request that ended.
    pub fn end_request(&mut self, id: &str) {
        self.reqs.remove(id);
    }

    /// The token a request samples at its current length (deterministic).
    fn next_token(id: &str, len: usize) -> u32 {
        (mix(crate::rng::hash_str(id) ^ len as u64) % 50_000) as u32
    }

    fn reference(&self, g: usize, pos: u64, chain: u64, out: &mut [u8]) {
        reference(self.tag, g, pos, chain, out);
    }

    /// The reference payload of entry `i` of group `g` for a prompt (what a warm tier holds):
    /// `None` past the prompt's full blocks.
    pub fn reference_block(&self, prompt: &[u32], g: usize, i: usize) -> Option<Vec<u8>> {
        let grp = self.groups.get(g)?;
        let b = usize::try_from(grp.block_size).ok()?;
        if (i + 1).checked_mul(b)? > prompt.len() {
            return None;
        }
        let t = Tokens::new(&prompt[..(i + 1) * b]);
        Some(self.block_bytes(g, &t, i, ((i + 1) * b) as u64))
    }

    /// The reference payloads of every full block of group `g` of `prompt`, in order (what
    /// [`reference_block`](Self::reference_block) gives for each, hashing the prompt once).
    pub(crate) fn reference_blocks(&self, prompt: &[u32], g: usize) -> Vec<Vec<u8>> {
        let Some(b) = self
            .groups
            .get(g)
            .and_then(|grp| usize::try_from(grp.block_size).ok())
        else {
            return Vec::new();
        };
        let full = prompt.len() / b.max(1);
        let t = Tokens::new(&prompt[..full * b]);
        (0..full)
            .map(|i| self.block_bytes(g, &t, i, ((i + 1) * b) as u64))
            .collect()
    }

    /// The bytes entry `i` of group `g` holds after `computed` tokens of `t`.
    fn block_bytes(&self, g: usize, t: &Tokens, i: usize, computed: u64) -> Vec<u8> {
        let grp = self.groups[g];
        let b = grp.block_size;
        match grp.kind {
            GroupKind::Mamba { .. } => {
                let m = ((i as u64 + 1) * b).min(computed);
                let mut out = vec![0; self.state_bytes];
                self.reference(g, m, t.chain[m as usize], &mut out);
                out
            }
            _ => {
                let mut out = vec![0; self.bytes_per_token * b as usize];
                for (j, c) in out.chunks_mut(self.bytes_per_token).enumerate() {
                    let pos = i as u64 * b + j as u64;
                    if (pos as usize) < t.tokens.len() {
                        self.reference(g, pos, t.chain[pos as usize + 1], c);
                    }
                }
                out
            }
        }
    }

    /// Phases (a) and (b) of a step: runs the plan's sync loads through `connector` (their
    /// invalid blocks are returned for the step's output), then checks every read unit of
    /// every scheduled request; then phase (c): writes what each request computes.
    pub fn run_step(&mut self, plan: &StepPlan, connector: Option<&dyn KvConnector>) -> StepCheck {
        let mut check = StepCheck::default();
        for s in &plan.scheduled {
            if let (Some(job), Some(c)) = (&s.sync_load, connector) {
                self.counters.sync_loads += 1;
                if let LoadResult::Failed(bad) = c.load(job) {
                    self.counters.sync_loads_failed += 1;
                    check.invalid_blocks.extend(bad.into_flat());
                }
            }
        }
        for s in &plan.scheduled {
            let (garbage, nulls) = self.read_at(&s.id, s.num_computed_tokens, &s.block_tables);
            if garbage > 0 {
                check.tainted.push(s.id.clone());
            }
            check.garbage.insert(s.id.clone(), (garbage, nulls));
        }
        for s in &plan.scheduled {
            let tainted = check.garbage.get(&s.id).is_some_and(|g| g.0 > 0);
            self.write_at(
                &s.id,
                s.num_computed_tokens,
                s.num_tokens,
                &s.block_tables,
                tainted,
            );
        }
        check
    }

    /// One request's step outside a runtime (constructed cases): reads at
    /// `num_computed_tokens` through `tables`, then writes `[num_computed_tokens,
    /// num_computed_tokens + num_tokens)` (as garbage if a read was). Counts its garbage as
    /// kept and returns it.
    pub fn compute(
        &mut self,
        id: &str,
        num_computed_tokens: u64,
        num_tokens: u64,
        tables: &[BlockTable],
    ) -> u64 {
        let (garbage, nulls) = self.read_at(id, num_computed_tokens, tables);
        self.write_at(id, num_computed_tokens, num_tokens, tables, garbage > 0);
        self.counters.garbage_reads += garbage;
        self.counters.null_reads += nulls;
        garbage
    }

    /// Settles a step once the runtime said which outputs to discard: counts its garbage as
    /// kept or discarded, and appends the sampled token of every kept sampler. Returns the
    /// requests whose samples the engine may emit.
    pub fn settle(
        &mut self,
        plan: &StepPlan,
        check: StepCheck,
        discarded: &[StdArc<str>],
    ) -> Vec<StdArc<str>> {
        let mut emitted = Vec::new();
        for s in &plan.scheduled {
            let dropped = discarded.iter().any(|d| d == &s.id);
            let (garbage, nulls) = check.garbage.get(&s.id).copied().unwrap_or((0, 0));
            self.counters.null_reads += nulls;
            if dropped {
                self.counters.garbage_reads_discarded += garbage;
            } else {
                self.counters.garbage_reads += garbage;
                if s.samples {
                    if let Some(t) = self.reqs.get_mut(&s.id) {
                        let len = t.tokens.len();
                        if s.num_computed_tokens.saturating_add(s.num_tokens) != len as u64 {
                            self.counters.misplaced_samples += 1;
                        }
                        t.push(Self::next_token(&s.id, len));
                    }
                    emitted.push(s.id.clone());
                }
            }
        }
        emitted
    }

    /// The entries `[lo, hi)` of an attention group a request at `n` reads, as token range.
    fn read_range(grp: &CacheGroup, n: u64) -> (u64, u64) {
        match grp.kind {
            GroupKind::SlidingWindow { window } => ((n + 1).saturating_sub(window), n),
            _ => (0, n),
        }
    }

    /// Phase (b) for one request at `n` computed tokens: (garbage units, of which through
    /// null entries). Reads, per entry, only the positions not checked at the block's current
    /// write epoch (`kv_seen`); every garbage unit is counted again at every read, as a
    /// position found wrong is never recorded as checked.
    fn read_at(&mut self, id: &str, n: u64, tables: &[BlockTable]) -> (u64, u64) {
        let Some(t) = self.reqs.get_mut(id).filter(|_| self.verify) else {
            return (0, 0);
        };
        let (tag, bpt, sb) = (self.tag, self.bytes_per_token, self.state_bytes);
        let memory = &*self.memory;
        let (mut garbage, mut nulls, mut units, mut skipped, mut bytes) = (0u64, 0, 0, 0, 0);
        let mut want = vec![0u8; bpt.max(sb)];
        for (g, grp) in self.groups.iter().enumerate() {
            let table = tables.get(g).map_or(&[][..], |t| &t[..]);
            let b = grp.block_size;
            if let GroupKind::Mamba { .. } = grp.kind {
                if n == 0 {
                    continue;
                }
                units += 1;
                let i = (n.div_ceil(b) - 1) as usize;
                let Some(r) = table.get(i).filter(|r| r.id != 0) else {
                    garbage += 1;
                    nulls += 1;
                    continue;
                };
                let epoch = memory.write_epoch(r.id);
                let [todo, _] = t.seen.unchecked(g, i, r.id, epoch, (n, n + 1), false);
                if todo.0 >= todo.1 {
                    skipped += 1;
                    continue;
                }
                let got = scratch(&mut self.scratch, sb);
                let ok = memory.read(g, r.id, 0, got).is_ok();
                let exp = &mut want[..sb];
                reference(
                    tag,
                    g,
                    n,
                    t.chain.get(n as usize).copied().unwrap_or(0),
                    exp,
                );
                bytes += sb as u64;
                if ok && got == exp {
                    t.seen.checked(g, i, r.id, epoch, (n, n + 1), false);
                } else {
                    garbage += 1;
                }
                continue;
            }
            let (lo, hi) = Self::read_range(grp, n);
            let mut e = lo / b;
            while e * b < hi {
                let (plo, phi) = (lo.max(e * b), hi.min((e + 1) * b));
                let i = e as usize;
                e += 1;
                units += phi - plo;
                let Some(r) = table.get(i).filter(|r| r.id != 0) else {
                    garbage += phi - plo;
                    nulls += phi - plo;
                    continue;
                };
                let epoch = memory.write_epoch(r.id);
                let mut right = true;
                let mut read = 0;
                for (slo, shi) in t.seen.unchecked(g, i, r.id, epoch, (plo, phi), true) {
                    if slo >= shi {
                        continue;
                    }
                    let got = scratch(&mut self.scratch, (shi - slo) as usize * bpt);
                    let ok = memory.read(g, r.id, (slo % b) as usize * bpt, got).is_ok();
                    for (pos, c) in (slo..shi).zip(got.chunks(bpt)) {
                        let chain = t.chain.get(pos as usize + 1).copied().unwrap_or(0);
                        reference(tag, g, pos, chain, &mut want[..bpt]);
                        if !ok || c != &want[..bpt] {
                            garbage += 1;
                            right = false;
                        }
                    }
                    read += shi - slo;
                }
                bytes += read * bpt as u64;
                skipped += phi - plo - read;
                // Nothing read: the record already covers the range at this epoch.
                if right && read > 0 {
                    t.seen.checked(g, i, r.id, epoch, (plo, phi), true);
                }
            }
        }
        self.counters.units_read += units;
        self.counters.units_skipped += skipped;
        self.counters.kv_bytes_verified += bytes;
        (garbage, nulls)
    }

    /// Phase (c) for one request: the bytes of `[n, n+k)` (garbage when `tainted`), one
    /// write per entry.
    fn write_at(&mut self, id: &str, n: u64, k: u64, tables: &[BlockTable], tainted: bool) {
        let Some(t) = self.reqs.get(id) else {
            return;
        };
        let end = n + k;
        // The tokens a step computes are known: prompt, or decode tokens sampled so far.
        if end as usize > t.tokens.len() + 1 {
            return;
        }
        let (tag, bpt, sb) = (self.tag, self.bytes_per_token, self.state_bytes);
        let memory = &*self.memory;
        let mut written = 0u64;
        for (g, grp) in self.groups.iter().enumerate() {
            let table = tables.get(g).map_or(&[][..], |t| &t[..]);
            let b = grp.block_size;
            // (entry, byte offset, first position, positions): one write each; 0 positions
            // is a Mamba state after `first` tokens.
            let mut writes: Vec<(usize, usize, u64, u64)> = Vec::new();
            match grp.kind {
                GroupKind::Mamba { mode } => {
                    // The state at the end of the step, and (mode `all`) at each block end.
                    let mut ends: Vec<u64> = Vec::new();
                    if mode == MambaMode::All {
                        let mut e = (n / b + 1) * b;
                        while e < end {
                            ends.push(e);
                            e += b;
                        }
                    }
                    ends.push(end);
                    for m in ends
                        .into_iter()
                        .filter(|&m| m > 0 && m as usize <= t.tokens.len())
                    {
                        writes.push(((m.div_ceil(b) - 1) as usize, 0, m, 0));
                    }
                }
                _ => {
                    let stop = end.min(t.tokens.len() as u64);
                    let mut pos = n;
                    while pos < stop {
                        let next = stop.min((pos / b + 1) * b);
                        let off = (pos % b) as usize * bpt;
                        writes.push(((pos / b) as usize, off, pos, next - pos));
                        pos = next;
                    }
                }
            }
            for (i, off, first, count) in writes {
                let Some(r) = table.get(i).filter(|r| r.id != 0) else {
                    continue;
                };
                let len = if count == 0 { sb } else { count as usize * bpt };
                let out = scratch(&mut self.scratch, len);
                if count == 0 {
                    reference(tag, g, first, t.chain[first as usize], out);
                } else {
                    for (pos, c) in (first..first + count).zip(out.chunks_mut(bpt)) {
                        reference(tag, g, pos, t.chain[pos as usize + 1], c);
                    }
                }
                if tainted {
                    out.iter_mut().for_each(|x| *x ^= 0xFF);
                }
                if memory.write(g, r.id, off, out).is_ok() {
                    written += len as u64;
                }
            }
        }
        self.counters.kv_bytes_written += written;
    }

    /// The entries a request's step completed that a tier can hold (full prompt blocks), as
    /// `(group, index, block)`, for [`TierConnector::save_blocks`](kvsched::kv::TierConnector::save_blocks)
    /// ([`completed_prompt_blocks`](kvsched::kv::completed_prompt_blocks) on its prompt).
    pub fn completed_prompt_blocks(&self, s: &ScheduledRequest) -> Vec<(usize, usize, u64)> {
        match self.reqs.get(&s.id) {
            Some(t) => kvsched::kv::completed_prompt_blocks(&self.groups, t.prompt_len, s),
            None => Vec::new(),
        }
    }

    /// The prompt of a live request.
    pub fn prompt(&self, id: &str) -> Option<&[u32]> {
        self.reqs.get(id).map(|t| &t.tokens[..t.prompt_len])
    }
}
