//! The judge's reference: a request decoded alone — its prompt through the model token by
//! token with private K/V and state, no prefix cache, no tier, no failure — with the token and
//! logit bits of every sample, and every value a layer keeps (K and V at each position, a
//! recurrent state after each), which the engine's reads are compared with.

// Plain index loops, on purpose: every sum runs in one fixed order (as in `net`).
#![allow(clippy::needless_range_loop)]

use super::net::{Context, TinyModel};

/// One request decoded alone, extended one token at a time as far as it is asked.
#[derive(Debug)]
pub(super) struct Reference {
    prompt_len: usize,
    tokens: Vec<u32>,
    /// Per layer: K and V of every position computed (attention layers; empty otherwise).
    kv: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    /// Per layer: the recurrent state after each position computed (recurrent layers; empty
    /// otherwise). The last is the state the next position starts from.
    states: Vec<Vec<Vec<f32>>>,
    /// `samples[i]`: (token, logit bits) sampled after position `prompt_len - 1 + i`.
    samples: Vec<(u32, u32)>,
    /// Positions computed.
    done: usize,
}

struct Private<'a>(&'a [Vec<(Vec<f32>, Vec<f32>)>]);

impl Context for Private<'_> {
    fn kv(&mut self, layer: usize, pos: u64, k: &mut [f32], v: &mut [f32]) -> bool {
        match self.0.get(layer).and_then(|l| l.get(pos as usize)) {
            Some((kk, vv)) => {
                k.copy_from_slice(kk);
                v.copy_from_slice(vv);
                true
            }
            None => false,
        }
    }
}

impl Reference {
    pub(super) fn new(model: &TinyModel, prompt: &[u32]) -> Reference {
        let layers = model.layers.len();
        Reference {
            prompt_len: prompt.len(),
            tokens: prompt.to_vec(),
            kv: vec![Vec::new(); layers],
            states: vec![Vec::new(); layers],
            samples: Vec::new(),
            done: 0,
        }
    }

    /// The reference sample number `i` (after position `prompt_len - 1 + i`), decoding as far
    /// as needed.
    pub(super) fn sample(&mut self, model: &TinyModel, i: usize) -> (u32, u32) {
        while self.samples.len() <= i && self.done < self.tokens.len() {
            self.step(model);
        }
        self.samples.get(i).copied().unwrap_or((u32::MAX, u32::MAX))
    }

    /// K and V of `layer` at `pos`, decoding as far as needed (`None`: not an attention layer,
    /// or past the tokens the reference can decode).
    pub(super) fn kv_at(
        &mut self,
        model: &TinyModel,
        layer: usize,
        pos: u64,
    ) -> Option<(&[f32], &[f32])> {
        let pos = usize::try_from(pos).ok()?;
        self.decode_through(model, pos);
        let (k, v) = self.kv.get(layer)?.get(pos)?;
        Some((k, v))
    }

    /// The state of the recurrent `layer` after position `pos`, decoding as far as needed
    /// (`None`: not a recurrent layer, or past the tokens the reference can decode).
    pub(super) fn state_after(
        &mut self,
        model: &TinyModel,
        layer: usize,
        pos: u64,
    ) -> Option<&[f32]> {
        let pos = usize::try_from(pos).ok()?;
        self.decode_through(model, pos);
        self.states.get(layer)?.get(pos).map(Vec::as_slice)
    }

    /// Decodes until position `pos` is computed, or as far as the tokens go.
    pub(super) fn decode_to(&mut self, model: &TinyModel, pos: u64) {
        if let Ok(pos) = usize::try_from(pos) {
            self.decode_through(model, pos);
        }
    }

    fn decode_through(&mut self, model: &TinyModel, pos: usize) {
        while self.done <= pos && self.done < self.tokens.len() {
            self.step(model);
        }
    }

    /// Computes the next position: the prompt's tokens first, then its own samples.
    fn step(&mut self, model: &TinyModel) {
        let d = model.shape.dim;
        let pos = self.done;
        let Some(&token) = self.tokens.get(pos) else {
            return;
        };
        let mut x = vec![0.0f32; d];
        model.embed(token, pos as u64, &mut x);
        for layer in 0..model.layers.len() {
            if model.is_attention(layer) {
                let (mut k, mut v) = (vec![0.0f32; d], vec![0.0f32; d]);
                model.project_kv(layer, &x, &mut k, &mut v);
                self.kv[layer].push((k, v));
                model.attend(layer, pos as u64, &mut x, &mut Private(&self.kv));
            } else {
                let mut h = self.states[layer]
                    .last()
                    .cloned()
                    .unwrap_or_else(|| vec![0.0; d]);
                model.recur(layer, &mut x, &mut h);
                self.states[layer].push(h);
            }
        }
        self.done += 1;
        if pos + 1 >= self.prompt_len {
            let s = model.sample(&x);
            self.samples.push(s);
            self.tokens.push(s.0);
        }
    }
}

/// The bytes a warm tier holds for `prompt`'s full blocks in every group, as the model
/// computes them alone: per token of an attention block, K and V of each of the group's layers
/// in order; at a Mamba block's end, the state of each of its layers in order.
/// `(group, index, bytes)`, groups in order.
pub(super) fn prefix_blocks(
    model: &TinyModel,
    block_sizes: &[u64],
    prompt: &[u32],
) -> Vec<(usize, usize, Vec<u8>)> {
    let mut r = Reference::new(model, prompt);
    let groups = block_sizes.len();
    let size = |g: usize| block_sizes.get(g).copied().unwrap_or(1).max(1) as usize;
    // Per group, per block end passed: the group's layers' states, in slot order.
    let mut states: Vec<Vec<Vec<u8>>> = vec![Vec::new(); groups];
    let state_bytes = model.state_bytes();
    let layers = model.layers.len();
    while r.done < prompt.len() {
        r.step(model);
        for g in 0..groups {
            if r.done % size(g) != 0 {
                continue;
            }
            let mut bytes = vec![0u8; state_bytes * model.group_layers(g)];
            let mut any = false;
            for layer in (0..layers).filter(|&l| model.slot(l).0 == g) {
                if !model.is_attention(layer) {
                    let slot = model.slot(layer).1;
                    let out = &mut bytes[slot * state_bytes..(slot + 1) * state_bytes];
                    if let Some(h) = r.states[layer].last() {
                        super::net::to_bytes(h, out);
                    }
                    any = true;
                }
            }
            if any {
                states[g].push(bytes);
            }
        }
    }
    let mut out = Vec::new();
    let kv = model.kv_bytes();
    let half = kv / 2;
    for g in 0..groups {
        let b = size(g);
        let per_token = kv * model.group_layers(g);
        let attention: Vec<usize> = (0..layers)
            .filter(|&l| model.slot(l).0 == g && model.is_attention(l))
            .collect();
        if attention.is_empty() {
            for (i, bytes) in std::mem::take(&mut states[g]).into_iter().enumerate() {
                out.push((g, i, bytes));
            }
            continue;
        }
        for i in 0..prompt.len() / b {
            let mut bytes = vec![0u8; b * per_token];
            for (j, token) in bytes.chunks_exact_mut(per_token).enumerate() {
                for &layer in &attention {
                    let slot = model.slot(layer).1;
                    let (k, v) = &r.kv[layer][i * b + j];
                    let at = &mut token[slot * kv..(slot + 1) * kv];
                    super::net::to_bytes(k, &mut at[..half]);
                    super::net::to_bytes(v, &mut at[half..]);
                }
            }
            out.push((g, i, bytes));
        }
    }
    out
}
