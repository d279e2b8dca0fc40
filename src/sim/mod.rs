//! A simulated engine's parts, for tests, examples and the stress tool: they drive the
//! runtime through its public API the way an engine would.
//!
//! * `kv_check` — [`KvChecker`], the verifying memory model: runs a step's reads and writes
//!   on real KV bytes and counts every byte read that differs from its reference.

mod kv_check;

pub use kv_check::{KvCheckCounters, KvChecker, StepCheck};
