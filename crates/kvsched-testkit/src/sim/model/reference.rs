//! The judge's reference: a request decoded alone — its prompt through the model token by
//! token with private K/V and state, no prefix cache, no tier, no failure — with the token and
//! logit bits of every sample.

use super::net::{Context, TinyModel};

/// One request decoded alone, extended one token at a time as far as it is asked.
#[derive(Debug)]
pub(super) struct Reference {
    prompt_len: usize,
    tokens: Vec<u32>,
    /// Per layer: K and V of every position computed (attention layers; empty otherwise).
    kv: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    /// Per layer: the recurrent state (recurrent layers).
    state: Vec<Vec<f32>>,
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
            state: vec![vec![0.0; model.shape.dim]; layers],
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
                model.recur(layer, &mut x, &mut self.state[layer]);
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
