//! [`ModelEngine`]: the tiny model run as a serving engine runs one, on a plan: sync loads
//! first, then layer by layer over the whole batch — every scheduled token's K/V of the layer
//! written into the blocks the plan names, then every token attends — and a sample per
//! request that samples. Its KV lives in [`KvMemory`], reached only through the plan's
//! per-group block tables; null entries are never touched. The judge compares every kept
//! sample, and every value a layer reads from KV memory, with the same request decoded alone.

use std::sync::Arc as StdArc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::net::{from_bytes, to_bytes, Context, TinyModel};
use super::reference::Reference;
use super::taint::{Taint, WrongTokenCauses};
use kvsched::connector::{KvConnector, LoadResult};
use kvsched::kv::KvMemory;
use kvsched::rules::geometry::{CacheGroup, GroupKind, MambaMode};
use kvsched::{BlockRef, BlockTable, ScheduledRequest, StepPlan};

/// What the judge counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelCounts {
    /// Kept samples compared with the reference decode.
    pub tokens_checked: u64,
    /// Kept samples whose token differs from the reference's.
    pub token_mismatches: u64,
    /// Kept samples whose logit differs in any bit from the reference's (a wrong read that
    /// did not change the token shows here).
    pub logit_mismatches: u64,
    /// Requests with at least one logit mismatch.
    pub requests_affected: u64,
    /// Values read from KV memory — one layer's K and V at one position, or a recurrent
    /// layer's state — whose bits differ from the same request's decoded alone: a wrong read
    /// whether or not it changed a logit. Counted for the steps whose output was kept: the
    /// reads of a request whose output `Runtime::update` discards (a failed sync load's
    /// loader and sharers) are not, nor those of a step never settled; a request's reads are
    /// compared until it keeps a wrong token, after which its context is no longer the
    /// reference's.
    pub read_mismatches: u64,
    /// Reads through a null entry or of an unreadable block (their values count as 0).
    pub unreadable_reads: u64,
    /// Requests a plan scheduled that the engine could not run: unknown to it, or scheduled
    /// past the tokens it has (a scheduler bug: the step skips them, and any sample the
    /// driver reports for them is no token the model produced).
    pub scheduled_past_tokens: u64,
    /// Tokens the model computed (prefill, decode and recompute).
    pub tokens_computed: u64,
    /// Sync loads run, and those that reported invalid blocks.
    pub sync_loads: u64,
    /// See `sync_loads`.
    pub sync_loads_failed: u64,
    /// `token_mismatches` by what the mismatching request read: a failed sync load's blocks
    /// as its sharer (vLLM #49250), as a later hit on rolled-back blocks, as its loader, or
    /// nothing a failed load left.
    pub wrong_token_causes: WrongTokenCauses,
    /// Requests that held a sync load's blocks, scheduled in the step it failed in (its
    /// sharers), counted over every failed sync load.
    pub failed_load_sharers: u64,
    /// Reads of a slot a failed sync load left unwritten, or that a request which read one
    /// wrote since (`taint`).
    pub tainted_reads: u64,
}

/// Sums the counts of several runs. Every field is named, so a field added to the counts
/// without being summed here is a compile error, not a total that silently reads 0.
impl std::ops::AddAssign<&ModelCounts> for ModelCounts {
    fn add_assign(&mut self, other: &ModelCounts) {
        let ModelCounts {
            tokens_checked,
            token_mismatches,
            logit_mismatches,
            requests_affected,
            read_mismatches,
            unreadable_reads,
            scheduled_past_tokens,
            tokens_computed,
            sync_loads,
            sync_loads_failed,
            wrong_token_causes,
            failed_load_sharers,
            tainted_reads,
        } = other;
        self.tokens_checked += tokens_checked;
        self.token_mismatches += token_mismatches;
        self.logit_mismatches += logit_mismatches;
        self.requests_affected += requests_affected;
        self.read_mismatches += read_mismatches;
        self.unreadable_reads += unreadable_reads;
        self.scheduled_past_tokens += scheduled_past_tokens;
        self.tokens_computed += tokens_computed;
        self.sync_loads += sync_loads;
        self.sync_loads_failed += sync_loads_failed;
        self.wrong_token_causes += wrong_token_causes;
        self.failed_load_sharers += failed_load_sharers;
        self.tainted_reads += tainted_reads;
    }
}

/// One request as the engine knows it: its tokens (prompt, then kept samples) and the judge's
/// reference.
#[derive(Debug)]
struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    reference: Reference,
    affected: bool,
    /// It kept a token the reference did not sample: its reads are no longer compared.
    diverged: bool,
}

/// The result of [`ModelEngine::run_step`], settled by [`ModelEngine::settle`].
#[derive(Debug, Default)]
pub struct ModelStep {
    /// Blocks the step's sync loads reported invalid (for `StepOutput::invalid_blocks`).
    pub invalid_blocks: Vec<BlockRef>,
    /// Per sampling request: (token, logit bits).
    samples: FxHashMap<StdArc<str>, (u32, u32)>,
    /// Per request: the values it read that differ from its reference's (counted once the
    /// step's output is known kept).
    read_mismatches: FxHashMap<StdArc<str>, u64>,
}

/// The tiny model as an engine: runs plans on KV memory and judges every kept sample.
pub struct ModelEngine {
    model: StdArc<TinyModel>,
    groups: Vec<CacheGroup>,
    memory: StdArc<dyn KvMemory>,
    seqs: FxHashMap<StdArc<str>, Seq>,
    counters: ModelCounts,
    taint: Taint,
}

impl std::fmt::Debug for ModelEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEngine")
            .field("groups", &self.groups)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// The K/V a step reads: KV memory through one request's tables.
struct Tables<'a> {
    id: &'a StdArc<str>,
    model: &'a TinyModel,
    /// The position being computed.
    pos: u64,
    taint: &'a mut Taint,
    memory: &'a dyn KvMemory,
    groups: &'a [CacheGroup],
    tables: &'a [BlockTable],
    buf: Vec<u8>,
    unreadable: u64,
    /// The request decoded alone, while its reads are compared.
    reference: Option<&'a mut Reference>,
    /// Reads whose bits differ from the reference's.
    mismatches: u64,
}

/// Whether `a` and `b` hold the same floats, bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

impl Context for Tables<'_> {
    fn kv(&mut self, layer: usize, pos: u64, k: &mut [f32], v: &mut [f32]) -> bool {
        let (g, slot) = self.model.slot(layer);
        let (Some(grp), Some(table)) = (self.groups.get(g), self.tables.get(g)) else {
            self.unreadable += 1;
            return false;
        };
        let b = grp.block_size.max(1);
        // One layer's K and V; a token's slot holds them for each of the group's layers.
        let bpt = self.buf.len();
        let per_token = bpt * self.model.group_layers(g);
        let Some(r) = usize::try_from(pos / b)
            .ok()
            .and_then(|i| table.get(i))
            .filter(|r| r.id != 0)
        else {
            // Planted bug `model-null-read-uncounted` (scripts/plants.sh): a read through a
            // null entry is not counted, so a run that reads one reports none.
            if !cfg!(kvsched_plant = "model-null-read-uncounted") {
                self.unreadable += 1;
            }
            return false;
        };
        self.taint.read(self.id, self.pos, *r, pos % b);
        let off = (pos % b) as usize * per_token + slot * bpt;
        if self.memory.read(g, r.id, off, &mut self.buf).is_err() {
            self.unreadable += 1;
            return false;
        }
        let half = bpt / 2;
        from_bytes(&self.buf[..half], k);
        from_bytes(&self.buf[half..], v);
        // Planted bug `model-kv-read-unjudged` (scripts/plants.sh): K and V reads are not
        // compared, so a wrong one that changes no logit goes unseen.
        if let Some(want) = self
            .reference
            .as_deref_mut()
            .filter(|_| !cfg!(kvsched_plant = "model-kv-read-unjudged"))
        {
            if let Some((wk, wv)) = want.kv_at(self.model, layer, pos) {
                if !same_bits(k, wk) || !same_bits(v, wv) {
                    self.mismatches += 1;
                }
            }
        }
        true
    }
}

impl ModelEngine {
    /// An engine running `model` (built for `groups`) on `memory`, whose layout must be
    /// `model.kv_layout(groups)`.
    pub fn new(
        model: StdArc<TinyModel>,
        groups: Vec<CacheGroup>,
        memory: StdArc<dyn KvMemory>,
    ) -> ModelEngine {
        ModelEngine {
            model,
            groups,
            memory,
            seqs: FxHashMap::default(),
            counters: ModelCounts::default(),
            taint: Taint::default(),
        }
    }

    /// Counters so far.
    pub fn counts(&self) -> ModelCounts {
        ModelCounts {
            failed_load_sharers: self.taint.sharers,
            tainted_reads: self.taint.reads,
            ..self.counters.clone()
        }
    }

    /// Registers a request's prompt (before its first step).
    pub fn add_request(&mut self, id: &str, prompt: &[u32]) {
        let reference = Reference::new(&self.model, prompt);
        self.seqs.insert(
            id.into(),
            Seq {
                tokens: prompt.to_vec(),
                prompt_len: prompt.len(),
                reference,
                affected: false,
                diverged: false,
            },
        );
    }

    /// What a warm tier holds for `prompt`'s full blocks, as the model computes them alone:
    /// `(group, index, bytes)` for
    /// [`TierConnector::store_now`](kvsched::kv::TierConnector::store_now).
    pub fn reference_blocks(&self, prompt: &[u32]) -> Vec<(usize, usize, Vec<u8>)> {
        let sizes: Vec<u64> = self.groups.iter().map(|g| g.block_size).collect();
        super::reference::prefix_blocks(&self.model, &sizes, prompt)
    }

    /// Forgets a request that ended.
    pub fn end_request(&mut self, id: &str) {
        self.seqs.remove(id);
        self.taint.end(id);
    }

    /// The prompt of a live request.
    pub fn prompt(&self, id: &str) -> Option<&[u32]> {
        self.seqs.get(id).map(|s| &s.tokens[..s.prompt_len])
    }

    /// The tokens a live request has (prompt, then the samples kept so far).
    pub fn tokens(&self, id: &str) -> Option<&[u32]> {
        self.seqs.get(id).map(|s| &s.tokens[..])
    }

    /// Decodes each request `plan` schedules alone as far as the step computes it: the
    /// reference values its reads are compared with. [`ModelEngine::run_step`] decodes as far
    /// as each read needs when this was not called; an engine timing its steps calls it first
    /// to keep the judge's work out of the model's time.
    pub fn decode_references(&mut self, plan: &StepPlan) {
        for s in &plan.scheduled {
            let Some(seq) = self.seqs.get_mut(&s.id).filter(|q| !q.diverged) else {
                continue;
            };
            let last = s.num_computed_tokens.saturating_add(s.num_tokens);
            if let Some(pos) = last.checked_sub(1) {
                seq.reference.decode_to(&self.model, pos);
            }
        }
    }

    /// Runs a step: the plan's sync loads through `connector`, then every layer over the
    /// whole batch. A request unknown to the engine or scheduled past the tokens it has is
    /// skipped and counted (`scheduled_past_tokens`).
    pub fn run_step(&mut self, plan: &StepPlan, connector: Option<&dyn KvConnector>) -> ModelStep {
        let mut step = ModelStep::default();
        for s in &plan.scheduled {
            if let (Some(job), Some(c)) = (&s.sync_load, connector) {
                self.counters.sync_loads += 1;
                if let LoadResult::Failed(bad) = c.load(job) {
                    self.counters.sync_loads_failed += 1;
                    let bad = bad.into_flat();
                    self.taint.failed_load(&self.groups, plan, &s.id, &bad);
                    step.invalid_blocks.extend(bad);
                }
            }
        }
        let d = self.model.shape.dim;
        // Hidden states of every scheduled token, request by request.
        let mut batch: Vec<(&ScheduledRequest, Vec<Vec<f32>>)> = Vec::new();
        for s in &plan.scheduled {
            let (n, k) = (s.num_computed_tokens as usize, s.num_tokens as usize);
            let Some(tokens) = self
                .seqs
                .get(&s.id)
                .and_then(|seq| seq.tokens.get(n..n.saturating_add(k)))
            else {
                self.counters.scheduled_past_tokens += 1;
                continue;
            };
            let xs = tokens
                .iter()
                .enumerate()
                .map(|(j, &t)| {
                    let mut x = vec![0.0f32; d];
                    self.model.embed(t, (n + j) as u64, &mut x);
                    x
                })
                .collect();
            self.counters.tokens_computed += k as u64;
            self.taint.schedule(&s.id, s.num_computed_tokens);
            batch.push((s, xs));
        }
        for layer in 0..self.model.layers.len() {
            if self.model.is_attention(layer) {
                self.attention_layer(layer, &mut batch, &mut step);
            } else {
                self.recurrent_layer(layer, &mut batch, &mut step);
            }
        }
        for (s, xs) in &batch {
            if let (true, Some(x)) = (s.samples, xs.last()) {
                step.samples.insert(s.id.clone(), self.model.sample(x));
            }
        }
        step
    }

    /// An attention layer over the batch: every token's K/V written first, then every token
    /// attends (so a token reads what any token of the step wrote before it in this layer).
    fn attention_layer(
        &mut self,
        layer: usize,
        batch: &mut [(&ScheduledRequest, Vec<Vec<f32>>)],
        step: &mut ModelStep,
    ) {
        let d = self.model.shape.dim;
        let (g, slot) = self.model.slot(layer);
        let grp = self.groups[g];
        let b = grp.block_size.max(1);
        let bpt = self.model.kv_bytes();
        let per_token = bpt * self.model.group_layers(g);
        let mut bytes = vec![0u8; bpt];
        let (mut k, mut v) = (vec![0.0f32; d], vec![0.0f32; d]);
        for (s, xs) in batch.iter() {
            let table = s.block_tables.get(g).map_or(&[][..], |t| &t[..]);
            for (j, x) in xs.iter().enumerate() {
                let pos = s.num_computed_tokens + j as u64;
                self.model.project_kv(layer, x, &mut k, &mut v);
                to_bytes(&k, &mut bytes[..bpt / 2]);
                to_bytes(&v, &mut bytes[bpt / 2..]);
                if let Some(r) = table.get((pos / b) as usize).filter(|r| r.id != 0) {
                    self.taint.write(&s.id, pos, *r, pos % b);
                    let off = (pos % b) as usize * per_token + slot * bpt;
                    let _ = self.memory.write(g, r.id, off, &bytes);
                }
            }
        }
        for (s, xs) in batch.iter_mut() {
            let reference = self
                .seqs
                .get_mut(&s.id)
                .filter(|q| !q.diverged)
                .map(|q| &mut q.reference);
            let mut ctx = Tables {
                id: &s.id,
                model: &self.model,
                pos: 0,
                taint: &mut self.taint,
                memory: self.memory.as_ref(),
                groups: &self.groups,
                tables: &s.block_tables,
                buf: vec![0u8; bpt],
                unreadable: 0,
                reference,
                mismatches: 0,
            };
            for (j, x) in xs.iter_mut().enumerate() {
                let pos = s.num_computed_tokens + j as u64;
                ctx.pos = pos;
                self.model.attend(layer, pos, x, &mut ctx);
            }
            self.counters.unreadable_reads += ctx.unreadable;
            if ctx.mismatches > 0 {
                *step.read_mismatches.entry(s.id.clone()).or_default() += ctx.mismatches;
            }
        }
    }

    /// A recurrent (Mamba) layer: each request's state at its computed length is read from
    /// the entry holding its last token, advanced token by token, and written back — at the
    /// step's end (mode `align`) and at every block end it passes (mode `all`), each into the
    /// entry holding its last token.
    fn recurrent_layer(
        &mut self,
        layer: usize,
        batch: &mut [(&ScheduledRequest, Vec<Vec<f32>>)],
        step: &mut ModelStep,
    ) {
        let d = self.model.shape.dim;
        let (g, slot) = self.model.slot(layer);
        let grp = self.groups[g];
        let b = grp.block_size.max(1);
        let all = grp.kind
            == (GroupKind::Mamba {
                mode: MambaMode::All,
            });
        let mut bytes = vec![0u8; self.model.state_bytes()];
        // A Mamba entry holds the state of each of the group's layers, in order.
        let off = slot * bytes.len();
        for (s, xs) in batch.iter_mut() {
            let table = s.block_tables.get(g).map_or(&[][..], |t| &t[..]);
            let entry = |m: u64| {
                usize::try_from(m.div_ceil(b) - 1)
                    .ok()
                    .and_then(|i| table.get(i))
                    .filter(|r| r.id != 0)
            };
            let n = s.num_computed_tokens;
            let mut h = vec![0.0f32; d];
            if n > 0 {
                if let Some(r) = entry(n) {
                    self.taint.read(&s.id, n, *r, 0);
                }
                match entry(n) {
                    Some(r) if self.memory.read(g, r.id, off, &mut bytes).is_ok() => {
                        from_bytes(&bytes, &mut h);
                        // Planted bug `model-state-read-unjudged` (scripts/plants.sh): a
                        // state read is not compared.
                        let want = self
                            .seqs
                            .get_mut(&s.id)
                            .filter(|q| {
                                !q.diverged && !cfg!(kvsched_plant = "model-state-read-unjudged")
                            })
                            .and_then(|q| q.reference.state_after(&self.model, layer, n - 1));
                        if want.is_some_and(|w| !same_bits(&h, w)) {
                            *step.read_mismatches.entry(s.id.clone()).or_default() += 1;
                        }
                    }
                    _ => self.counters.unreadable_reads += 1,
                }
            }
            let end = n + xs.len() as u64;
            for (j, x) in xs.iter_mut().enumerate() {
                self.model.recur(layer, x, &mut h);
                let m = n + j as u64 + 1;
                if m == end || (all && m % b == 0) {
                    if let Some(r) = entry(m) {
                        self.taint.write(&s.id, m - 1, *r, 0);
                        to_bytes(&h, &mut bytes);
                        let _ = self.memory.write(g, r.id, off, &bytes);
                    }
                }
            }
        }
    }

    /// Settles a step once `Runtime::update` said which outputs to discard: each kept sample
    /// is appended to its request's tokens and judged against the reference, and the wrong
    /// reads of the requests whose output is kept are counted. Returns the requests whose
    /// samples the engine may emit.
    pub fn settle(
        &mut self,
        plan: &StepPlan,
        step: ModelStep,
        discarded: &[StdArc<str>],
    ) -> Vec<StdArc<str>> {
        let discarded: FxHashSet<&StdArc<str>> = discarded.iter().collect();
        for (id, n) in &step.read_mismatches {
            if !discarded.contains(id) {
                self.counters.read_mismatches += n;
            }
        }
        let mut emitted = Vec::new();
        for s in plan.scheduled.iter().filter(|s| s.samples) {
            let (Some(&(token, bits)), false) =
                (step.samples.get(&s.id), discarded.contains(&s.id))
            else {
                continue;
            };
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            let i = seq.tokens.len() - seq.prompt_len;
            let (want, want_bits) = seq.reference.sample(&self.model, i);
            self.counters.tokens_checked += 1;
            if token != want {
                seq.diverged = true;
                self.counters.token_mismatches += 1;
                let cause = self.taint.cause(&s.id);
                self.counters.wrong_token_causes.count(cause);
            }
            if bits != want_bits || token != want {
                self.counters.logit_mismatches += 1;
                if !std::mem::replace(&mut seq.affected, true) {
                    self.counters.requests_affected += 1;
                }
            }
            seq.tokens.push(token);
            emitted.push(s.id.clone());
        }
        emitted
    }
}
