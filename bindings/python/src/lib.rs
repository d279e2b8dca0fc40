//! `kvsched._native`, the extension module under the Python package `kvsched`
//! (`python/kvsched/`): the recovery rules on a replay scenario (`recover`), and the native
//! half of the vLLM secondary tier (`tier`). The Python modules around it hold what needs no
//! Rust: the dict in and out of `recover`, the vLLM scheduler adapter, the tier's vLLM-facing
//! class.

use pyo3::prelude::*;

mod recover;
mod tier;
mod tier_bounded;
mod tier_index;
mod tier_jobs;
mod tier_ops;
mod tier_region;
mod tier_store;

/// The module: `recover_json`, `NativeTier`, and `HAS_REDIS` (whether this build has the Redis
/// tier).
#[pymodule(name = "_native")]
fn native_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(recover::recover_json, m)?)?;
    m.add_class::<tier::NativeTier>()?;
    m.add("HAS_REDIS", cfg!(feature = "redis"))?;
    // The plant `align-wait-inexact` (scripts/plants.sh; `planted!` of crates/kvsched/src/
    // plant.rs, spelled out here as the macro is the library's own): `kvsched.recovery` takes a
    // Mamba `align` state for rewritten once its owner has gone past it.
    m.add(
        "_PLANT_ALIGN_WAIT_INEXACT",
        cfg!(kvsched_plant = "align-wait-inexact"),
    )?;
    // The plant `wait-any-group` (scripts/plants.sh): `kvsched.recovery` releases a sharer
    // once its owner has passed the id's first entry in any group, though with one pool per
    // group that entry is another block.
    m.add(
        "_PLANT_WAIT_ANY_GROUP",
        cfg!(kvsched_plant = "wait-any-group"),
    )?;
    // The plant `legacy-loader-at-zero` (scripts/plants.sh): `kvsched.vllm` takes an older
    // vLLM's async loader at the 0 tokens that vLLM has not set yet, so its failed load goes
    // unnoticed.
    m.add(
        "_PLANT_LEGACY_LOADER_AT_ZERO",
        cfg!(kvsched_plant = "legacy-loader-at-zero"),
    )?;
    // The plant `owner-freed-still-waited-for` (scripts/plants.sh): `kvsched.vllm` takes an
    // owner whose blocks vLLM freed (an async loader failed at 0 tokens, recomputing into new
    // blocks) for rewriting the shared block, and releases its sharers to read garbage.
    m.add(
        "_PLANT_OWNER_FREED_STILL_WAITED_FOR",
        cfg!(kvsched_plant = "owner-freed-still-waited-for"),
    )?;
    // The plant `async-pre-step-counts-next-step` (scripts/plants.sh): `kvsched.vllm` takes
    // the pre-step length under async scheduling as `num_computed_tokens` less the reported
    // step's tokens only, counting the next step's, already scheduled, as computed before.
    m.add(
        "_PLANT_ASYNC_PRE_STEP_COUNTS_NEXT_STEP",
        cfg!(kvsched_plant = "async-pre-step-counts-next-step"),
    )?;
    // The plant `ended-by-status-list` (scripts/plants.sh): `kvsched.vllm` takes a request
    // for ended by a fixed list of status names, missing vLLM's newer finished statuses.
    m.add(
        "_PLANT_ENDED_BY_STATUS_LIST",
        cfg!(kvsched_plant = "ended-by-status-list"),
    )?;
    Ok(())
}
