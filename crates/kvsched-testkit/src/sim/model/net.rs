//! The network: seeded f32 weights and the per-token computations, in fixed-order loops.
//!
//! Every function here computes one token's values from its inputs alone, in the same order
//! whatever batch or chunk the token is computed in, so a token's result is bit-identical
//! whether it is computed in a prefill chunk, alone, or recomputed after a failure. The
//! layers read their context through [`Context`], so the engine (KV memory through the plan's
//! block tables) and the reference decoder (private vectors) run the very same code.

// Plain index loops, on purpose: every sum runs in one fixed order, whatever the batch.
#![allow(clippy::needless_range_loop)]

use crate::rng::SplitMix64;
use kvsched::kv::{KvLayout, KvMemoryError};
use kvsched::rules::geometry::{CacheGroup, GroupKind};

/// The shape of a [`TinyModel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Tokens the sampler chooses from. Any `u32` token id has an embedding of its own (its
    /// full id is hashed into it): ids equal modulo `vocab` are different tokens.
    pub vocab: usize,
    /// Width of the hidden state, of each K and V vector, and of a Mamba state.
    pub dim: usize,
}

impl Default for ModelShape {
    /// 64 tokens, width 16.
    fn default() -> Self {
        ModelShape { vocab: 64, dim: 16 }
    }
}

/// One layer: an attention layer (full or windowed) or a gated linear recurrence.
#[derive(Clone, Debug)]
pub(super) enum Layer {
    Attention {
        window: Option<u64>,
        wq: Vec<f32>,
        wk: Vec<f32>,
        wv: Vec<f32>,
        wo: Vec<f32>,
    },
    Recurrent {
        /// The gate: `a = sigmoid(wa · x)`.
        wa: Vec<f32>,
        /// The input: `u = wb · x`.
        wb: Vec<f32>,
        /// The output: `y = wc · h`.
        wc: Vec<f32>,
    },
}

/// A tiny hybrid language model with seeded random weights, greedy decoding. Its layers are
/// one per cache group (full attention, sliding window, or a Mamba-style gated linear
/// recurrence), in order, then a second layer of group 0: a KV cache group may hold several
/// layers of one kind (vLLM groups the layers of one spec), and group 0's second layer reads
/// the output of every layer before it, so every cached block's bytes — group 0's included,
/// on a dense model too — depend on the whole context before the block, not only on its own
/// tokens and positions.
#[derive(Clone, Debug)]
pub struct TinyModel {
    pub(super) shape: ModelShape,
    /// Seeds the hashed embedding.
    embed_seed: u64,
    pub(super) layers: Vec<Layer>,
    /// Per layer: its cache group and its slot among the group's layers.
    slots: Vec<(usize, usize)>,
    /// Per cache group: how many layers it holds.
    group_layers: Vec<usize>,
    pub(super) unembed: Vec<f32>,
}

/// What a layer reads of the tokens before the one it computes.
pub(super) trait Context {
    /// The K and V of position `pos` in layer `layer` (`None`: unreadable).
    fn kv(&mut self, layer: usize, pos: u64, k: &mut [f32], v: &mut [f32]) -> bool;
}

fn random(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.unit() as f32) * 2.0 - 1.0) * scale)
        .collect()
}

/// `out = m · x` for a `dim × dim` row-major `m`.
fn matvec(m: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for c in 0..d {
            acc += m[r * d + c] * x[c];
        }
        *o = acc;
    }
}

/// `x` scaled to unit root mean square (what each layer and the sampler read).
fn rms_norm(x: &[f32]) -> Vec<f32> {
    let mut ss = 0.0f32;
    for v in x {
        ss += v * v;
    }
    let scale = 1.0 / (ss / x.len() as f32 + 1e-6).sqrt();
    x.iter().map(|v| v * scale).collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl TinyModel {
    /// A model for `groups` (one layer per group, in order, then a second layer of group 0)
    /// with weights drawn from `seed`.
    pub fn new(groups: &[CacheGroup], shape: ModelShape, seed: u64) -> TinyModel {
        let d = shape.dim.max(1);
        let shape = ModelShape {
            vocab: shape.vocab.max(2),
            dim: d,
        };
        let mut rng = SplitMix64::new(seed ^ 0x7e57_0de1);
        // Layers outweigh the embedding, so a token depends on its context, not mostly on
        // the token before it: a wrong read anywhere shows in the sampled tokens.
        let s = 2.0 / (d as f32).sqrt();
        let embed_seed = rng.next_u64();
        let layer = |rng: &mut SplitMix64, g: &CacheGroup| match g.kind {
            GroupKind::Mamba { .. } => Layer::Recurrent {
                wa: random(rng, d * d, s),
                wb: random(rng, d * d, s),
                wc: random(rng, d * d, s),
            },
            GroupKind::FullAttention | GroupKind::SlidingWindow { .. } => Layer::Attention {
                window: match g.kind {
                    GroupKind::SlidingWindow { window } => Some(window),
                    _ => None,
                },
                wq: random(rng, d * d, s),
                wk: random(rng, d * d, s),
                wv: random(rng, d * d, s),
                wo: random(rng, d * d, s),
            },
        };
        let mut layers = Vec::new();
        let mut slots = Vec::new();
        for (g, grp) in groups.iter().enumerate() {
            layers.push(layer(&mut rng, grp));
            slots.push((g, 0));
        }
        let mut group_layers = vec![1; groups.len()];
        if let Some(first) = groups.first() {
            layers.push(layer(&mut rng, first));
            slots.push((0, 1));
            group_layers[0] = 2;
        }
        let unembed = random(&mut rng, shape.vocab * d, s);
        TinyModel {
            shape,
            embed_seed,
            layers,
            slots,
            group_layers,
            unembed,
        }
    }

    /// The shape.
    pub fn shape(&self) -> ModelShape {
        self.shape
    }

    /// Bytes of one token's K and V of one attention layer.
    pub(super) fn kv_bytes(&self) -> usize {
        2 * self.shape.dim * 4
    }

    /// Bytes of one Mamba state of one recurrent layer.
    pub(super) fn state_bytes(&self) -> usize {
        self.shape.dim * 4
    }

    /// The KV memory layout the model's engine needs for its groups: an attention group's
    /// block holds, per token, the K and V of each of the group's layers in order; a Mamba
    /// entry holds the state of each of its layers in order.
    ///
    /// # Errors
    ///
    /// [`KvMemoryError::Layout`] when a size overflows.
    pub fn kv_layout(&self, groups: &[CacheGroup]) -> Result<KvLayout, KvMemoryError> {
        let sizes = groups
            .iter()
            .enumerate()
            .map(|(g, grp)| {
                let n = self.group_layers.get(g).copied().unwrap_or(1);
                let per = match grp.kind {
                    GroupKind::Mamba { .. } => Some(self.state_bytes()),
                    _ => usize::try_from(grp.block_size)
                        .ok()
                        .and_then(|b| b.checked_mul(self.kv_bytes())),
                };
                per.and_then(|p| p.checked_mul(n)).ok_or_else(|| {
                    KvMemoryError::Layout(format!("group {g}: block bytes overflow"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        KvLayout::new(sizes)
    }

    /// Layer `layer`'s cache group, and its slot among the group's layers.
    pub(super) fn slot(&self, layer: usize) -> (usize, usize) {
        self.slots.get(layer).copied().unwrap_or((layer, 0))
    }

    /// How many layers cache group `g` holds.
    pub(super) fn group_layers(&self, g: usize) -> usize {
        self.group_layers.get(g).copied().unwrap_or(1)
    }

    /// The hidden state of `token` at position `pos` entering the first layer: its
    /// embedding — drawn from the full token id hashed with the model's seed, so no two ids
    /// share one — plus a sinusoidal position code.
    pub(super) fn embed(&self, token: u32, pos: u64, x: &mut [f32]) {
        let d = self.shape.dim;
        let mut rng =
            SplitMix64::new(self.embed_seed ^ u64::from(token).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        for v in x.iter_mut() {
            *v = (rng.unit() as f32) * 2.0 - 1.0;
        }
        for (c, v) in x.iter_mut().enumerate() {
            let freq = 1.0 / 10_000f32.powf((c / 2 * 2) as f32 / d as f32);
            let angle = (pos % 65_536) as f32 * freq;
            *v += if c % 2 == 0 { angle.sin() } else { angle.cos() };
        }
    }

    /// The K and V layer `layer` stores for hidden state `x`.
    pub(super) fn project_kv(&self, layer: usize, x: &[f32], k: &mut [f32], v: &mut [f32]) {
        if let Some(Layer::Attention { wk, wv, .. }) = self.layers.get(layer) {
            let n = rms_norm(x);
            matvec(wk, &n, k);
            matvec(wv, &n, v);
        }
    }

    /// Attention of the token at `pos` (hidden state `x`, updated in place) over the
    /// positions its window covers, `pos` itself included, read through `ctx` in ascending
    /// order. Returns `false` if a position could not be read (its values then count as 0).
    pub(super) fn attend(
        &self,
        layer: usize,
        pos: u64,
        x: &mut [f32],
        ctx: &mut dyn Context,
    ) -> bool {
        let Some(Layer::Attention { window, wq, wo, .. }) = self.layers.get(layer) else {
            return true;
        };
        let d = self.shape.dim;
        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let mut q = vec![0.0f32; d];
        matvec(wq, &rms_norm(x), &mut q);
        let n = (pos + 1 - lo) as usize;
        let mut scores = vec![0.0f32; n];
        let mut values = vec![0.0f32; n * d];
        let (mut k, mut v) = (vec![0.0f32; d], vec![0.0f32; d]);
        let mut ok = true;
        let scale = 1.0 / (d as f32).sqrt();
        for (i, p) in (lo..=pos).enumerate() {
            if !ctx.kv(layer, p, &mut k, &mut v) {
                ok = false;
                k.iter_mut().chain(v.iter_mut()).for_each(|z| *z = 0.0);
            }
            let mut dot = 0.0f32;
            for c in 0..d {
                dot += q[c] * k[c];
            }
            scores[i] = dot * scale;
            values[i * d..(i + 1) * d].copy_from_slice(&v);
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f32;
        for s in &mut scores {
            *s = (*s - max).exp();
            total += *s;
        }
        let mut mixed = vec![0.0f32; d];
        for (i, s) in scores.iter().enumerate() {
            let w = s / total;
            for c in 0..d {
                mixed[c] += w * values[i * d + c];
            }
        }
        let mut out = vec![0.0f32; d];
        matvec(wo, &mixed, &mut out);
        for c in 0..d {
            x[c] += out[c];
        }
        ok
    }

    /// One step of the recurrence: the state `h` advances over hidden state `x` (updated in
    /// place with the layer's output).
    pub(super) fn recur(&self, layer: usize, x: &mut [f32], h: &mut [f32]) {
        let Some(Layer::Recurrent { wa, wb, wc }) = self.layers.get(layer) else {
            return;
        };
        let d = self.shape.dim;
        let (mut a, mut u, mut y) = (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d]);
        let n = rms_norm(x);
        matvec(wa, &n, &mut a);
        matvec(wb, &n, &mut u);
        for c in 0..d {
            let g = sigmoid(a[c]);
            h[c] = g * h[c] + (1.0 - g) * u[c].tanh();
        }
        matvec(wc, h, &mut y);
        for c in 0..d {
            x[c] += y[c];
        }
    }

    /// The greedy next token after hidden state `x`, and its logit's bits.
    pub(super) fn sample(&self, x: &[f32]) -> (u32, u32) {
        let d = self.shape.dim;
        let x = rms_norm(x);
        let mut best = (0u32, f32::NEG_INFINITY);
        for t in 0..self.shape.vocab {
            let mut acc = 0.0f32;
            for c in 0..d {
                acc += self.unembed[t * d + c] * x[c];
            }
            // NaN never wins; ties go to the lower token.
            if acc > best.1 {
                best = (t as u32, acc);
            }
        }
        (best.0, best.1.to_bits())
    }

    /// Whether layer `layer` is an attention layer.
    pub(super) fn is_attention(&self, layer: usize) -> bool {
        matches!(self.layers.get(layer), Some(Layer::Attention { .. }))
    }
}

/// f32s to little-endian bytes.
pub(super) fn to_bytes(xs: &[f32], out: &mut [u8]) {
    for (x, b) in xs.iter().zip(out.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

/// Little-endian bytes to f32s.
pub(super) fn from_bytes(bytes: &[u8], out: &mut [f32]) {
    for (x, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}
