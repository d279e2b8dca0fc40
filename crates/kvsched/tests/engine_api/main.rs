//! An engine written on the public API alone, judging every guarantee README and docs/ state
//! by what it can see: each block the plan tells it to read is checked against a
//! deterministic KV function (`support`), every between-step invariant is collected, and the
//! connectors, tiers, KV memories and engine answers around the runtime are hostile in every
//! way the API lets them be. One test target, a module per concern.

mod support;

mod chaos;
mod engine;
mod hostile;
mod limits;
mod liveness;
mod memory;
mod misuse;
mod sharers;
mod tier;
