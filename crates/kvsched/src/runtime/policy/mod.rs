//! The pure decisions of a step, called by the shard's code (which the mutex baseline of
//! `kvsched stress --baseline mutex` runs too, over its own pool and claim words): plain data
//! in, plain data out — no atomics, locks or threads, and no allocation (the shard's hot path
//! calls them every step).
//!
//! One mechanism a file: `prefix` (the local prefix search at admission), `admission` (how
//! far an admitted request's external load reaches), `load_cost` (how much of a lookup hit it
//! loads, the rest recomputed), `growth` (the blocks a table needs, and whether a request can
//! ever get them), `scheduling` (the step's budget, the tokens a running request gets, the
//! length cap, the preemption victim), `alignment` (where a prefill chunk ends when a Mamba
//! group keeps its state in mode `align`), `caching` (which full blocks may enter the prefix
//! cache), `state_ends` (the lengths a Mamba `align` group can resume at: where its state is
//! held), `lost` (where a lost step is offered again) and `trust` (which blocks a failure
//! report may roll back).
//!
//! What is not here is how a step holds its state: the shard keeps its requests in per-shard
//! maps and reaches the shared pool, claim table and prefix index through its strategy
//! (`runtime::shard::strategy`: atomics in the runtime, plain data behind one lock in the
//! baseline).

pub mod admission;
pub mod alignment;
pub mod caching;
pub mod growth;
pub mod load_cost;
pub mod lost;
pub mod prefix;
pub mod scheduling;
pub mod state_ends;
pub mod trust;
