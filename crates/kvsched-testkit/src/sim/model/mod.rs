//! A tiny hybrid language model, written by hand, behind the plan: f32, seeded random
//! weights, a small vocabulary, one layer per cache group — full attention, sliding window, or
//! a Mamba-style gated linear recurrence — then a second layer of group 0 (so every cached
//! block's bytes depend on the whole context before it), and greedy decoding.
//!
//! Every token goes through the same fixed-order loops whether it is computed in a prefill
//! chunk, alone, or recomputed after a failure, so its outputs are bit-identical by
//! construction. That makes the model a judge no reading of the rules can argue with: each
//! kept sample is compared, token and logit bits, with the same request decoded alone (no
//! prefix cache, no tier, no failure). A wrong read anywhere — a block a failed load left
//! unwritten, a state another step advanced — changes a logit.
//!
//! * `net` — [`TinyModel`]: weights and the per-token computations;
//! * `engine` — [`ModelEngine`]: a plan run on KV memory through its block tables, layer by
//!   layer over the batch, and the judge;
//! * `reference` — a request decoded alone;
//! * `taint` — which failed sync load, reached how, each wrong token comes from.

mod engine;
mod net;
mod reference;
mod taint;

pub use engine::{ModelCounts, ModelEngine, ModelStep};
pub use net::{ModelShape, TinyModel};
pub use taint::WrongTokenCauses;
