//! The pure decisions of a step, shared by the shards and the mutex baseline
//! (`kvsched stress --baseline mutex`), so that the two differ only in how they synchronise:
//! plain data in, plain data out — no atomics, locks or threads, and no allocation (the
//! shard's hot path calls them every step).
//!
//! One mechanism a file: `prefix` (the local prefix search at admission), `admission` (how
//! far an admitted request's external load reaches), `growth` (the blocks a table needs, and
//! whether a request can ever get them), `scheduling` (the step's budget, the tokens a running
//! request gets, the length cap, the preemption victim), `alignment` (where a prefill chunk
//! ends when a Mamba group keeps its state in mode `align`), `caching` (which full blocks may enter
//! the prefix cache), `lost` (where a lost step is offered again) and `trust` (which blocks a
//! failure report may roll back).
//!
//! What is not here is how the two hold their state: the shards keep it in per-shard maps
//! and reach the shared pool, claim table and prefix index through atomics; the baseline keeps
//! everything behind one lock. The loops over a step's requests are the same in both, in the
//! same order (canonical order for admission and scheduling, admission sequence for landing
//! loads and applying outputs).

pub mod admission;
pub mod alignment;
pub mod caching;
pub mod growth;
pub mod lost;
pub mod prefix;
pub mod scheduling;
pub mod trust;
