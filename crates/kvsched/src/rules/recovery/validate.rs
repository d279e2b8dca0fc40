//! A request's bad input, checked against the geometry before the rules run: table count,
//! scheduled and computed tokens, nulls in full-attention tables, and id uniqueness across a
//! report's requests.

use crate::rules::geometry::{Geometry, GroupKind};
use crate::rules::recovery::{scan_len, RecoveryError, Request, RequestClass, RequestView};

/// Checks one request against the geometry (the request-level bad input of
/// `docs/replay.md#bad-input`).
pub fn validate_request(geo: &Geometry, req: RequestView<'_>) -> Result<(), RecoveryError> {
    if req.block_tables.len() != geo.num_groups() {
        return Err(RecoveryError::TableCount {
            given: req.block_tables.len(),
            groups: geo.num_groups(),
        });
    }
    if req.num_scheduled_tokens > req.num_computed_tokens {
        return Err(RecoveryError::ScheduledExceedsComputed {
            scheduled: req.num_scheduled_tokens,
            computed: req.num_computed_tokens,
        });
    }
    if req.class == RequestClass::Async && req.num_scheduled_tokens != 0 {
        return Err(RecoveryError::AsyncWithScheduled {
            scheduled: req.num_scheduled_tokens,
        });
    }
    let p = req.pre_step_tokens();
    for (g, (group, table)) in geo.groups().iter().zip(req.block_tables).enumerate() {
        if group.kind == GroupKind::FullAttention {
            let below_p = scan_len(group.blocks_for_tokens(p), table.len());
            if let Some(index) = table[..below_p]
                .iter()
                .position(|&id| id == geo.null_block())
            {
                return Err(RecoveryError::NullInFullAttention {
                    group: g,
                    index,
                    pre_step_tokens: p,
                });
            }
        }
    }
    Ok(())
}

/// Validates every request (and id uniqueness); errors carry the request index.
pub fn validate_requests(
    geo: &Geometry,
    requests: &[Request],
) -> Result<(), (usize, RecoveryError)> {
    let mut seen = rustc_hash::FxHashSet::default();
    for (i, r) in requests.iter().enumerate() {
        validate_request(geo, r.view()).map_err(|e| (i, e))?;
        if !seen.insert(r.id.as_str()) {
            return Err((i, RecoveryError::DuplicateRequestId { id: r.id.clone() }));
        }
    }
    Ok(())
}
