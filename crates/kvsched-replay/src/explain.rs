//! `kvsched replay --explain` (`docs/replay.md#explain`): why each request was decided as it
//! was, from the traces the rules recorded while deciding
//! ([`recover_explained`](kvsched::rules::recovery::recover_explained)) — as the `explain` key of
//! the outcome JSON, or as plain lines (`--explain=text`).
//!
//! Nothing here applies a rule: every number and reason comes from a trace event. This module
//! only names groups, owners and rules in words.

use std::fmt::Write as _;

use serde::Serialize;

use crate::json::{quote, SHOW_MAX};
use crate::Scenario;
use kvsched::rules::geometry::{CacheGroup, GroupKind, MambaMode};
use kvsched::rules::recovery::trace::{BoundaryRule, RequestTrace, Unusable};
use kvsched::rules::recovery::{canonical_order, Disposition, HitOwner, Mode, Outcome, Policy};

/// One request's explanation, in the outcome JSON.
#[derive(Serialize)]
pub(super) struct ExplainJson<'a> {
    id: &'a str,
    class: &'static str,
    num_computed_tokens_in: u64,
    num_scheduled_tokens: u64,
    pre_step_tokens: u64,
    scan: Vec<ScanJson>,
    hits: Vec<HitJson<'a>>,
    earliest_new_hit: Option<u64>,
    candidates: Option<CandidatesJson>,
    rejected: Vec<RejectJson>,
    num_computed_tokens: u64,
    rule: &'static str,
    reason: String,
    old_hits: Vec<OldHitJson<'a>>,
}

#[derive(Serialize)]
struct ScanJson {
    group: usize,
    entries: usize,
}

#[derive(Serialize)]
struct HitJson<'a> {
    group: u32,
    index: u32,
    position: u64,
    block: u64,
    new: bool,
    owner: &'a str,
}

#[derive(Serialize)]
struct CandidatesJson {
    start: u64,
    step: u64,
    short_table: Option<ShortTableJson>,
}

#[derive(Serialize)]
struct ShortTableJson {
    group: usize,
    len: usize,
}

#[derive(Serialize)]
struct RejectJson {
    candidate: u64,
    group: usize,
    entry: u64,
    problem: &'static str,
    reason: String,
}

#[derive(Serialize)]
struct OldHitJson<'a> {
    block: u64,
    position: u64,
    owner: &'a str,
    waits: bool,
    reason: String,
}

/// The `explain` key: one element per request, in canonical order.
pub(super) fn explain_json<'a>(
    scenario: &'a Scenario,
    outcome: &Outcome,
    traces: &[RequestTrace<usize>],
) -> Vec<ExplainJson<'a>> {
    let id = |i: usize| scenario.requests.get(i).map_or("", |r| r.id.as_str());
    let groups = scenario.geometry.groups();
    let s = scenario.geometry.scheduler_block_size();
    canonical_order(&scenario.requests)
        .into_iter()
        .filter_map(|i| {
            let (r, t, d) = (
                scenario.requests.get(i)?,
                traces.get(i)?,
                outcome.requests.get(i)?,
            );
            let (boundary, rule) = t
                .chosen
                .unwrap_or((d.num_computed_tokens, BoundaryRule::NoHit));
            Some(ExplainJson {
                id: &r.id,
                class: class_name(r.class),
                num_computed_tokens_in: r.num_computed_tokens,
                num_scheduled_tokens: r.num_scheduled_tokens,
                pre_step_tokens: r.view().pre_step_tokens(),
                scan: t
                    .scan
                    .iter()
                    .map(|x| ScanJson {
                        group: x.group,
                        entries: x.entries,
                    })
                    .collect(),
                hits: t
                    .hits
                    .iter()
                    .map(|(h, o)| HitJson {
                        group: h.group,
                        index: h.index,
                        position: h.position,
                        block: h.block,
                        new: matches!(o, HitOwner::Mine),
                        owner: match o {
                            HitOwner::Mine => &r.id,
                            HitOwner::Other(o) => id(*o),
                        },
                    })
                    .collect(),
                earliest_new_hit: earliest_new(rule),
                candidates: t.candidates.map(|c| CandidatesJson {
                    start: c.start,
                    step: s,
                    short_table: c.short_table.map(|x| ShortTableJson {
                        group: x.group,
                        len: x.len,
                    }),
                }),
                rejected: t
                    .rejected
                    .iter()
                    .map(|x| RejectJson {
                        candidate: x.candidate,
                        group: x.group,
                        entry: x.index,
                        problem: match x.why {
                            Unusable::Missing => "missing",
                            Unusable::Null => "null",
                            Unusable::OwnNewHit(_) => "own_new_hit",
                        },
                        reason: reject_reason(groups.get(x.group), x.candidate, x.index, x.why),
                    })
                    .collect(),
                num_computed_tokens: boundary,
                rule: rule_name(rule),
                reason: rule_reason(
                    scenario,
                    rule,
                    boundary,
                    r.view().pre_step_tokens(),
                    r.num_scheduled_tokens,
                ),
                old_hits: t
                    .old_hits
                    .iter()
                    .map(|w| OldHitJson {
                        block: w.block,
                        position: w.position,
                        owner: id(w.owner),
                        waits: w.waits,
                        reason: wait_reason(scenario, w.waits, w.position, boundary, id(w.owner)),
                    })
                    .collect(),
            })
        })
        .collect()
}

/// `--explain=text`: the explanation as plain lines, a header and then one block per request
/// in canonical order.
pub fn render_explain_text(
    scenario: &Scenario,
    outcome: &Outcome,
    traces: &[RequestTrace<usize>],
) -> String {
    let geo = &scenario.geometry;
    let s = geo.scheduler_block_size();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mode {}, policy {}, S = {s}, null block {}",
        match scenario.mode {
            Mode::Vllm => "vllm",
            Mode::Safe => "safe",
        },
        match scenario.policy {
            Policy::Recompute => "recompute",
            Policy::Fail => "fail",
        },
        geo.null_block()
    );
    for (g, group) in geo.groups().iter().enumerate() {
        let _ = writeln!(out, "group {g}: {}", group_name(group));
    }
    let ex = explain_json(scenario, outcome, traces);
    for (e, i) in ex.iter().zip(canonical_order(&scenario.requests)) {
        let name = shown_id(e.id);
        let _ = writeln!(
            out,
            "request {name} ({}): num_computed_tokens {}, num_scheduled_tokens {}, P = {}",
            e.class, e.num_computed_tokens_in, e.num_scheduled_tokens, e.pre_step_tokens
        );
        for x in &e.scan {
            let b = geo.groups().get(x.group).map_or(1, |g| g.block_size);
            let _ = if x.entries == 0 {
                writeln!(out, "  scan group {}: no entries", x.group)
            } else {
                writeln!(
                    out,
                    "  scan group {}: entries 0..{} (tokens [0, {}))",
                    x.group,
                    x.entries - 1,
                    (x.entries as u64).saturating_mul(b)
                )
            };
        }
        if e.hits.is_empty() {
            let _ = writeln!(
                out,
                "  no hit: unaffected, num_computed_tokens stays {}",
                e.num_computed_tokens
            );
            continue;
        }
        for h in &e.hits {
            let whose = if h.new {
                "new, this request claims it".to_owned()
            } else {
                format!("old, already marked by {}", shown_id(h.owner))
            };
            let _ = writeln!(
                out,
                "  hit group {} entry {} (position {}): block {}, {whose}",
                h.group, h.index, h.position, h.block
            );
        }
        if let Some(m) = e.earliest_new_hit {
            let _ = writeln!(out, "  earliest new hit at {m}");
        }
        if let Some(c) = &e.candidates {
            let short = c.short_table.as_ref().map_or(String::new(), |t| {
                format!(
                    "; group {}'s table has only {} entries, so none above {}",
                    t.group, t.len, c.start
                )
            });
            let _ = if c.start == 0 {
                writeln!(out, "  candidate boundaries: none above 0{short}")
            } else if c.start == c.step {
                writeln!(out, "  candidate boundary: {}{short}", c.start)
            } else {
                writeln!(
                    out,
                    "  candidate boundaries: {} down to {}, by S = {}{short}",
                    c.start, c.step, c.step
                )
            };
        }
        for x in &e.rejected {
            let _ = writeln!(
                out,
                "  candidate {} rejected by group {}: {}",
                x.candidate, x.group, x.reason
            );
        }
        let _ = writeln!(
            out,
            "  boundary {} ({}): {}",
            e.num_computed_tokens, e.rule, e.reason
        );
        for w in &e.old_hits {
            let _ = writeln!(
                out,
                "  {} block {} (position {}), owner {}: {}",
                if w.waits { "wait edge:" } else { "no wait:" },
                w.block,
                w.position,
                shown_id(w.owner),
                w.reason
            );
        }
        if let Some(d) = outcome.requests.get(i) {
            let _ = writeln!(
                out,
                "  outcome: {}, num_computed_tokens {}, affected_tokens {}, claims {}, evicts {}",
                match d.disposition {
                    Disposition::Unaffected => "unaffected",
                    Disposition::FailedRecving => "failed_recving",
                    Disposition::Skip => "skip",
                    Disposition::Failed => "failed",
                },
                d.num_computed_tokens,
                d.affected_tokens,
                id_list(&d.claimed_blocks),
                id_list(&d.evicted_blocks),
            );
        }
    }
    out
}

fn earliest_new(rule: BoundaryRule) -> Option<u64> {
    match rule {
        BoundaryRule::VllmRoundDown { earliest_new }
        | BoundaryRule::SafeResumable { earliest_new } => Some(earliest_new),
        BoundaryRule::NoHit
        | BoundaryRule::OldHitsOnly
        | BoundaryRule::SafeOldHitsResumable { .. } => None,
    }
}

fn class_name(c: kvsched::rules::recovery::RequestClass) -> &'static str {
    match c {
        kvsched::rules::recovery::RequestClass::Async => "async",
        kvsched::rules::recovery::RequestClass::Sync => "sync",
    }
}

fn rule_name(rule: BoundaryRule) -> &'static str {
    match rule {
        BoundaryRule::NoHit => "no_hit",
        BoundaryRule::OldHitsOnly => "old_hits_only",
        BoundaryRule::VllmRoundDown { .. } => "vllm_round_down",
        BoundaryRule::SafeResumable { .. } => "safe_resumable",
        BoundaryRule::SafeOldHitsResumable { .. } => "safe_old_hits_resumable",
    }
}

fn rule_reason(
    scenario: &Scenario,
    rule: BoundaryRule,
    boundary: u64,
    p: u64,
    scheduled: u64,
) -> String {
    let geo = &scenario.geometry;
    let s = geo.scheduler_block_size();
    match rule {
        BoundaryRule::NoHit => "no hit: num_computed_tokens unchanged".to_owned(),
        BoundaryRule::OldHitsOnly if scheduled > 0 => format!(
            "only old hits: back to P = {p} (their owners rewrite the shared blocks); the \
             step's {scheduled} tokens are discarded"
        ),
        BoundaryRule::OldHitsOnly => {
            format!("only old hits: back to P = {p} (their owners rewrite the shared blocks)")
        }
        BoundaryRule::VllmRoundDown { earliest_new } => format!(
            "mode vllm: the earliest new hit rounded down to S, floor({earliest_new} / {s}) · \
             {s} = {boundary}"
        ),
        BoundaryRule::SafeOldHitsResumable { pre_step } => {
            let discarded = if scheduled > 0 {
                format!("; the step's {scheduled} tokens are discarded")
            } else {
                String::new()
            };
            if boundary > 0 {
                format!(
                    "mode safe: only old hits, but not every group can resume at P = {pre_step}: \
                     the largest multiple of S below it from which every group can resume{discarded}"
                )
            } else {
                format!(
                    "mode safe: only old hits, but not every group can resume at P = {pre_step}, \
                     nor at a multiple of S in (0, {pre_step}]; every group can resume at \
                     0{discarded}"
                )
            }
        }
        BoundaryRule::SafeResumable { earliest_new } => {
            let top = geo.round_down_to_s(earliest_new);
            if boundary == top {
                format!("mode safe: every group can resume at floor({earliest_new} / {s}) · {s} = {top}")
            } else if boundary > 0 {
                format!(
                    "mode safe: the largest multiple of S at or below {earliest_new} from which \
                     every group can resume"
                )
            } else {
                format!(
                    "mode safe: no multiple of S in (0, {earliest_new}] from which every group \
                     can resume; every group can resume at 0"
                )
            }
        }
    }
}

fn wait_reason(
    scenario: &Scenario,
    waits: bool,
    position: u64,
    boundary: u64,
    owner: &str,
) -> String {
    let owner = shown_id(owner);
    if waits {
        return format!(
            "starts below the new num_computed_tokens {boundary}: not to be read until \
             {owner} has rewritten it"
        );
    }
    match (scenario.mode, scenario.policy) {
        (Mode::Vllm, _) => "mode vllm has no wait edges".to_owned(),
        (Mode::Safe, Policy::Fail) => "no wait edges under fail: the request fails".to_owned(),
        (Mode::Safe, Policy::Recompute) => format!(
            "starts at {position}, at or past the new num_computed_tokens {boundary}: this \
             request rewrites it itself"
        ),
    }
}

fn group_name(g: &CacheGroup) -> String {
    match g.kind {
        GroupKind::FullAttention => format!("full_attention, block_size {}", g.block_size),
        GroupKind::SlidingWindow { window } => {
            format!("sliding_window {window}, block_size {}", g.block_size)
        }
        GroupKind::Mamba { mode } => {
            format!("mamba {}, block_size {}", mamba_mode(mode), g.block_size)
        }
    }
}

fn mamba_mode(m: MambaMode) -> &'static str {
    match m {
        MambaMode::Align => "align",
        MambaMode::All => "all",
    }
}

/// "mamba align: no state at 48 (entry 2 is null)", "sliding window 17: entry 2 is null".
fn reject_reason(group: Option<&CacheGroup>, candidate: u64, index: u64, why: Unusable) -> String {
    let what = match why {
        Unusable::Missing => "missing (past the end of the table)".to_owned(),
        Unusable::Null => "null".to_owned(),
        Unusable::OwnNewHit(b) => format!("a new hit of this request (block {b})"),
    };
    match group.map(|g| g.kind) {
        Some(GroupKind::FullAttention) => format!("full attention: entry {index} is {what}"),
        Some(GroupKind::SlidingWindow { window }) => {
            format!("sliding window {window}: entry {index} is {what}")
        }
        Some(GroupKind::Mamba { mode }) => format!(
            "mamba {}: no state at {candidate} (entry {index} is {what})",
            mamba_mode(mode)
        ),
        None => format!("entry {index} is {what}"),
    }
}

/// An id as text: as is when it is short and printable without spaces, else quoted and cut.
fn shown_id(id: &str) -> String {
    let plain = !id.is_empty()
        && id.chars().count() <= SHOW_MAX
        && id
            .chars()
            .all(|c| !c.is_control() && !c.is_whitespace() && c != '"');
    if plain {
        id.to_owned()
    } else {
        quote(id)
    }
}

/// `[1, 2, 3]`, cut after 16 ids with the count.
fn id_list(ids: &[u64]) -> String {
    const MAX: usize = 16;
    let shown: Vec<String> = ids.iter().take(MAX).map(u64::to_string).collect();
    if ids.len() > MAX {
        format!("[{}, … ({} in all)]", shown.join(", "), ids.len())
    } else {
        format!("[{}]", shown.join(", "))
    }
}
