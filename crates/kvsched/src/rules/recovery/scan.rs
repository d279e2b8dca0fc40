//! Step 1 of the rules: the entries of one request's block tables that a report names
//! (`docs/rules.md#mode-vllm`), found with a bitmap test per entry.

use crate::rules::geometry::{BlockId, Geometry};
use crate::rules::recovery::trace::{Event, NoTrace, Trace};
use crate::rules::recovery::{scan_len, InvalidSet, RequestView};

/// One table entry of a request that is in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hit {
    /// Cache group.
    pub group: u32,
    /// Index in that group's table.
    pub index: u32,
    /// The block id.
    pub block: BlockId,
    /// Start token position `index · b_g`.
    pub position: u64,
}

/// Appends to `hits` every hit of `req` against `invalid`, in (group, index) order: for each
/// group `g`, the non-null entries at indices `< min(ceil(P / b_g), len)` that are in the
/// report's set for `g` (step 1 of `docs/rules.md#mode-vllm`).
pub fn scan_request(
    geo: &Geometry,
    req: RequestView<'_>,
    invalid: &InvalidSet,
    hits: &mut Vec<Hit>,
) {
    scan_request_traced::<(), _>(geo, req, invalid, hits, &mut NoTrace);
}

/// [`scan_request`], reporting each group's scan range to `trace` ([`Event::Scan`]).
pub fn scan_request_traced<O, T: Trace<O>>(
    geo: &Geometry,
    req: RequestView<'_>,
    invalid: &InvalidSet,
    hits: &mut Vec<Hit>,
    trace: &mut T,
) {
    let p = req.pre_step_tokens();
    for (g, (group, table)) in geo.groups().iter().zip(req.block_tables).enumerate() {
        let n = scan_len(group.blocks_for_tokens(p), table.len());
        if T::ON {
            trace.event(Event::Scan {
                group: g,
                entries: n,
            });
        }
        if invalid.group_is_empty(g) {
            continue;
        }
        if planted!("scan-one-group-less") && g > 0 && g + 1 == geo.num_groups() {
            // Planted (scripts/plants.sh): the last of several groups is never scanned, so a
            // failed block there rolls nothing back.
            continue;
        }
        let b = group.block_size;
        invalid.scan_group(g, &table[..n], |i, block| {
            hits.push(Hit {
                group: g as u32,
                index: i as u32,
                block,
                position: i as u64 * b,
            })
        });
    }
}
