//! A scenario from its JSON tree (`docs/replay.md#scenario-format`): every field extracted and
//! checked with its path, the geometry built, the requests validated, and the library's
//! errors turned into the field-path messages of `docs/replay.md#bad-input`.

use crate::fields::{array, one_of, uint, uint_list, Obj};
use crate::json::{self, describe, quote, Json};
use crate::{err, Scenario, ScenarioError};
use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, GeometryError, MambaMode};
use kvsched::rules::recovery::{
    validate_requests, InvalidSet, Mode, Policy, RecoveryError, Request, RequestClass,
};

const TOP_FIELDS: &[&str] = &[
    "mode",
    "policy",
    "null_block_id",
    "scheduler_block_size",
    "groups",
    "requests",
    "invalid_blocks",
    "invalid_blocks_by_group",
];
const GROUP_FIELDS: &[&str] = &["kind", "block_size", "window", "mamba_mode"];
const REQUEST_FIELDS: &[&str] = &[
    "id",
    "class",
    "num_computed_tokens",
    "num_scheduled_tokens",
    "block_tables",
];

/// Parses and validates a scenario (`docs/replay.md#scenario-format`) from JSON text.
pub fn parse_scenario(text: &str) -> Result<Scenario, ScenarioError> {
    parse_scenario_bytes(text.as_bytes().to_vec())
}

/// Parses and validates a scenario (`docs/replay.md#scenario-format`) from JSON bytes (UTF-8).
/// The bytes are dropped as soon as the JSON tree is built, and the tree is consumed as the
/// scenario is built from it, so the input, the tree and the scenario are never all in memory
/// at once.
pub fn parse_scenario_bytes(bytes: Vec<u8>) -> Result<Scenario, ScenarioError> {
    let doc = json::read(&bytes)?;
    drop(bytes);
    scenario_from_json(doc)
}

fn scenario_from_json(doc: Json) -> Result<Scenario, ScenarioError> {
    let mut top = Obj::new(doc, "", "the scenario", TOP_FIELDS)?;

    let mode = match top.take("mode") {
        None => Mode::default(),
        Some(v) => match one_of(&v, "mode", &["vllm", "safe"])? {
            0 => Mode::Vllm,
            _ => Mode::Safe,
        },
    };
    let policy = match top.take("policy") {
        None => Policy::default(),
        Some(v) => match one_of(&v, "policy", &["recompute", "fail"])? {
            0 => Policy::Recompute,
            _ => Policy::Fail,
        },
    };
    let null_block = top
        .opt_uint("null_block_id")?
        .unwrap_or(kvsched::rules::geometry::DEFAULT_NULL_BLOCK);

    let groups = array(top.required("groups")?, "groups")?
        .enumerate()
        .map(|(i, g)| parse_group(g, &format!("groups[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let explicit_s = top.opt_uint("scheduler_block_size")?;
    let geometry = Geometry::new(groups, explicit_s, null_block).map_err(geometry_error)?;

    let requests = array(top.required("requests")?, "requests")?
        .enumerate()
        .map(|(i, r)| parse_request(r, &format!("requests[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;

    let invalid = parse_report(&mut top, &geometry)?;

    validate_requests(&geometry, &requests)
        .map_err(|(i, e)| request_error(i, e, geometry.null_block()))?;

    Ok(Scenario {
        geometry,
        mode,
        policy,
        requests,
        invalid,
    })
}

/// The report: the flat `invalid_blocks` and/or the group-qualified `invalid_blocks_by_group`
/// (at least one of them), as one [`InvalidSet`] on `geometry`.
fn parse_report(top: &mut Obj, geometry: &Geometry) -> Result<InvalidSet, ScenarioError> {
    let flat = top
        .take("invalid_blocks")
        .map(|v| uint_list(v, "invalid_blocks"))
        .transpose()?;
    let by_group = top
        .take("invalid_blocks_by_group")
        .map(|v| {
            array(v, "invalid_blocks_by_group")?
                .enumerate()
                .map(|(g, list)| uint_list(list, &format!("invalid_blocks_by_group[{g}]")))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    match (flat, by_group) {
        (None, None) => Err(err(
            "invalid_blocks",
            "missing required field (give invalid_blocks, invalid_blocks_by_group, or both)",
        )),
        (Some(flat), None) => Ok(InvalidSet::flat(flat, geometry)),
        (flat, Some(lists)) => InvalidSet::with_groups(flat.unwrap_or_default(), &lists, geometry)
            .map_err(|e| err("invalid_blocks_by_group", e.to_string())),
    }
}

fn parse_group(v: Json, path: &str) -> Result<CacheGroup, ScenarioError> {
    let mut obj = Obj::new(v, path, "a cache group", GROUP_FIELDS)?;
    const KINDS: &[&str] = &["full_attention", "sliding_window", "mamba"];
    let kind = one_of(&obj.required("kind")?, &obj.field("kind"), KINDS)?;
    let own: &[&str] = match kind {
        0 => &[],
        1 => &["window"],
        _ => &["mamba_mode"],
    };
    for extra in ["window", "mamba_mode"] {
        if obj.has(extra) && !own.contains(&extra) {
            return Err(err(
                obj.field(extra),
                format!("not a field of a {} group", KINDS[kind]),
            ));
        }
    }
    let block_size = uint(&obj.required("block_size")?, &obj.field("block_size"))?;
    let missing_for_kind = |obj: &Obj, key: &str| {
        err(
            obj.field(key),
            format!("missing required field (for a {} group)", KINDS[kind]),
        )
    };
    Ok(match kind {
        0 => CacheGroup::full_attention(block_size),
        1 => {
            let w = obj
                .take("window")
                .ok_or_else(|| missing_for_kind(&obj, "window"))?;
            CacheGroup::sliding_window(block_size, uint(&w, &obj.field("window"))?)
        }
        _ => {
            let m = obj
                .take("mamba_mode")
                .ok_or_else(|| missing_for_kind(&obj, "mamba_mode"))?;
            let mode = match one_of(&m, &obj.field("mamba_mode"), &["align", "all"])? {
                0 => MambaMode::Align,
                _ => MambaMode::All,
            };
            CacheGroup::mamba(block_size, mode)
        }
    })
}

fn parse_request(v: Json, path: &str) -> Result<Request, ScenarioError> {
    let mut obj = Obj::new(v, path, "a request", REQUEST_FIELDS)?;
    let id = match obj.required("id")? {
        Json::Str(s) if !s.is_empty() => s,
        Json::Str(_) => return Err(err(obj.field("id"), "must be a non-empty string")),
        other => {
            return Err(err(
                obj.field("id"),
                format!("expected a non-empty string, got {}", describe(&other)),
            ))
        }
    };
    let class = match one_of(
        &obj.required("class")?,
        &obj.field("class"),
        &["async", "sync"],
    )? {
        0 => RequestClass::Async,
        _ => RequestClass::Sync,
    };
    let num_computed_tokens = uint(
        &obj.required("num_computed_tokens")?,
        &obj.field("num_computed_tokens"),
    )?;
    let num_scheduled_tokens = obj.opt_uint("num_scheduled_tokens")?.unwrap_or(0);
    let tables_path = obj.field("block_tables");
    let block_tables = array(obj.required("block_tables")?, &tables_path)?
        .enumerate()
        .map(|(g, t)| uint_list(t, &format!("{tables_path}[{g}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Request {
        id,
        class,
        num_computed_tokens,
        num_scheduled_tokens,
        block_tables,
    })
}

fn geometry_error(e: GeometryError) -> ScenarioError {
    match e {
        GeometryError::NoGroups => err("groups", "at least one cache group is required"),
        GeometryError::ZeroBlockSize { group } => {
            err(format!("groups[{group}].block_size"), "must be > 0")
        }
        GeometryError::ZeroWindow { group } => {
            err(format!("groups[{group}].window"), "must be > 0")
        }
        GeometryError::ZeroSchedulerBlockSize => err("scheduler_block_size", "must be > 0"),
        GeometryError::NotAMultiple {
            scheduler_block_size,
            group,
            block_size,
        } => err(
            "scheduler_block_size",
            format!(
                "{scheduler_block_size} is not a multiple of groups[{group}].block_size {block_size}"
            ),
        ),
        other => err("groups", other.to_string()),
    }
}

fn request_error(i: usize, e: RecoveryError, null_block: BlockId) -> ScenarioError {
    let path = format!("requests[{i}]");
    match e {
        RecoveryError::TableCount { .. } => err(format!("{path}.block_tables"), e.to_string()),
        RecoveryError::ScheduledExceedsComputed { .. }
        | RecoveryError::AsyncWithScheduled { .. } => {
            err(format!("{path}.num_scheduled_tokens"), e.to_string())
        }
        RecoveryError::NullInFullAttention {
            group,
            index,
            pre_step_tokens,
        } => err(
            format!("{path}.block_tables[{group}][{index}]"),
            format!(
                "the null block {null_block} in a full_attention table below P = {pre_step_tokens}"
            ),
        ),
        RecoveryError::DuplicateRequestId { id } => err(
            format!("{path}.id"),
            format!("duplicate request id {}", quote(&id)),
        ),
        other => err(path, other.to_string()),
    }
}
