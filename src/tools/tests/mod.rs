//! Tests of the tools that reach crate internals: the scenario format, the claim path, the
//! mutex baseline and the stress driver. The CLI itself is tested through the binary in
//! `tests/cli_*.rs`.

mod baseline_mutex;
mod claim_path;
mod replay_scenarios;
