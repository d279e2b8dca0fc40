//! The outcome of a replayed scenario as JSON (`docs/replay.md#outcome-format`), with request
//! ids in place of the engine's request indices.

use serde::Serialize;

use crate::explain::{explain_json, ExplainJson};
use crate::Scenario;
use kvsched::rules::geometry::BlockId;
use kvsched::rules::recovery::trace::RequestTrace;
use kvsched::rules::recovery::Outcome;

#[derive(Serialize)]
struct OutcomeJson<'a> {
    affected: Vec<&'a str>,
    skip: Vec<&'a str>,
    failed: Vec<&'a str>,
    failed_recving: Vec<&'a str>,
    total_affected_tokens: u128,
    evicted_blocks: &'a [BlockId],
    requests: Vec<RequestJson<'a>>,
    /// Only with `--explain`.
    #[serde(skip_serializing_if = "Option::is_none")]
    explain: Option<Vec<ExplainJson<'a>>>,
}

#[derive(Serialize)]
struct RequestJson<'a> {
    id: &'a str,
    affected: bool,
    num_computed_tokens: u64,
    affected_tokens: u64,
    claimed_blocks: &'a [BlockId],
    waits_for: Vec<WaitJson<'a>>,
    num_computed_tokens_in: u64,
    pre_step_tokens: u64,
}

#[derive(Serialize)]
struct WaitJson<'a> {
    block: BlockId,
    owner: &'a str,
}

/// Renders `outcome` (which must come from [`Scenario::run`] on `scenario`) as the outcome JSON
/// of `docs/replay.md#outcome-format`: pretty-printed with two-space indentation and a trailing
/// newline, keys in the order of the example there, request indices replaced by request ids.
pub fn render_outcome(scenario: &Scenario, outcome: &Outcome) -> String {
    render(scenario, outcome, None)
}

/// [`render_outcome`] with the `explain` key (`docs/replay.md#explain`): `traces` from
/// [`recover_explained`](kvsched::rules::recovery::recover_explained) on `scenario`, in input
/// order.
pub fn render_outcome_explained(
    scenario: &Scenario,
    outcome: &Outcome,
    traces: &[RequestTrace<usize>],
) -> String {
    render(scenario, outcome, Some(traces))
}

fn render(
    scenario: &Scenario,
    outcome: &Outcome,
    traces: Option<&[RequestTrace<usize>]>,
) -> String {
    let id = |i: usize| scenario.requests.get(i).map_or("", |r| r.id.as_str());
    let ids = |v: &[usize]| v.iter().map(|&i| id(i)).collect::<Vec<_>>();
    let json = OutcomeJson {
        affected: ids(&outcome.affected),
        skip: ids(&outcome.skip),
        failed: ids(&outcome.failed),
        failed_recving: ids(&outcome.failed_recving),
        total_affected_tokens: outcome.total_affected_tokens,
        evicted_blocks: &outcome.evicted_blocks,
        requests: outcome
            .requests
            .iter()
            .zip(&scenario.requests)
            .map(|(d, r)| RequestJson {
                id: &r.id,
                affected: d.affected(),
                num_computed_tokens: d.num_computed_tokens,
                affected_tokens: d.affected_tokens,
                claimed_blocks: &d.claimed_blocks,
                waits_for: d
                    .waits_for
                    .iter()
                    .map(|&(block, owner)| WaitJson {
                        block,
                        owner: id(owner),
                    })
                    .collect(),
                num_computed_tokens_in: r.num_computed_tokens,
                pre_step_tokens: r.view().pre_step_tokens(),
            })
            .collect(),
        explain: traces.map(|t| explain_json(scenario, outcome, t)),
    };
    // Serializing plain structs with string keys cannot fail.
    let mut text = serde_json::to_string_pretty(&json).unwrap_or_default();
    text.push('\n');
    text
}
