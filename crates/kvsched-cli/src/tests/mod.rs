//! Tests of the tools that reach crate internals: the scenario format, the claim path, the
//! mutex baseline, the stress driver, and that the baseline and the runtime decide alike. The CLI itself is tested through the binary in
//! `tests/cli_*.rs`.

mod baseline_mutex;
mod claim_path;
mod replay_scenarios;
mod same_decisions;
