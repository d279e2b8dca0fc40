//! `--explain`: on every bundled scenario, the reasons of the worked examples of
//! docs/rules.md, and the typed reasons in the JSON.

use std::path::Path;

use super::common::{run, sc, text};

pub fn scenario_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(format!("{name}.json"))
}

pub fn explain_text(name: &str) -> String {
    let path = scenario_path(name);
    let out = run(
        &[
            "replay",
            "--explain=text",
            path.to_str().expect("utf-8 path"),
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Asserts that `haystack` holds each of `lines` as a whole line (trimmed), in that order.
#[track_caller]
pub fn assert_lines_in_order(haystack: &str, lines: &[&str]) {
    let mut rest = haystack.lines().map(str::trim);
    for want in lines {
        assert!(
            rest.any(|l| l == *want),
            "missing (or out of order) line {want:?} in:\n{haystack}"
        );
    }
}

/// `--explain` and `--explain=text` run on every bundled scenario: the JSON is the plain
/// outcome plus an `explain` key with one element per request (canonical order), whose
/// computed length is the outcome's; the text has one block per request.
#[test]
fn explain_runs_on_every_scenario() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("scenario dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p.to_string_lossy().ends_with(".expected.json")
        })
        .collect();
    files.sort();
    assert!(files.len() >= 40);
    for f in &files {
        let f = f.to_str().expect("utf-8 path");
        let plain = run(&["replay", f], b"");
        let json = run(&["replay", "--explain", f], b"");
        let eq = run(&["replay", "--explain=json", f], b"");
        let txt = run(&["replay", "--explain=text", f], b"");
        for o in [&plain, &json, &eq, &txt] {
            assert_eq!(o.status.code(), Some(0), "{f}: {}", text(&o.stderr));
        }
        assert_eq!(json.stdout, eq.stdout, "{f}");
        let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).expect("JSON");
        let mut json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
        let explain = json
            .as_object_mut()
            .and_then(|o| o.remove("explain"))
            .unwrap_or_else(|| panic!("{f}: no explain key"));
        assert_eq!(json, plain, "{f}: --explain changed the outcome");
        let explain = explain.as_array().expect("explain is an array");
        let requests = plain["requests"].as_array().expect("requests");
        assert_eq!(explain.len(), requests.len(), "{f}");
        for e in explain {
            let r = requests
                .iter()
                .find(|r| r["id"] == e["id"])
                .unwrap_or_else(|| panic!("{f}: explained request {} unknown", e["id"]));
            assert_eq!(e["num_computed_tokens"], r["num_computed_tokens"], "{f}");
            assert_eq!(e["pre_step_tokens"], r["pre_step_tokens"], "{f}");
            assert_eq!(
                e["num_computed_tokens_in"], r["num_computed_tokens_in"],
                "{f}"
            );
            let hit = !e["hits"].as_array().expect("hits").is_empty();
            assert_eq!(hit, r["affected"] == true, "{f}: {}", e["id"]);
        }
        let txt = text(&txt.stdout);
        let blocks = txt.lines().filter(|l| l.starts_with("request ")).count();
        assert_eq!(blocks, requests.len(), "{f}:\n{txt}");
    }
}

/// The reasons of the worked examples (docs/rules.md): Mamba `align`, the sliding window, a
/// shared block and the wait edges, in both modes.
#[test]
fn explain_gives_the_rules_reasons() {
    // Full attention and Mamba align, {104}: no state at 48, 32 or 16.
    assert_lines_in_order(
        &explain_text("s5_safe_i104"),
        &[
            "request a (async): num_computed_tokens 144, num_scheduled_tokens 0, P = 144",
            "scan group 0: entries 0..8 (tokens [0, 144))",
            "scan group 1: entries 0..8 (tokens [0, 144))",
            "hit group 0 entry 3 (position 48): block 104, new, this request claims it",
            "earliest new hit at 48",
            "candidate boundaries: 48 down to 16, by S = 16",
            "candidate 48 rejected by group 1: mamba align: no state at 48 (entry 2 is null)",
            "candidate 32 rejected by group 1: mamba align: no state at 32 (entry 1 is null)",
            "candidate 16 rejected by group 1: mamba align: no state at 16 (entry 0 is null)",
            "boundary 0 (safe_resumable): mode safe: no multiple of S in (0, 48] from which every group can resume; every group can resume at 0",
            "request s (sync): num_computed_tokens 48, num_scheduled_tokens 16, P = 32",
            "no hit: unaffected, num_computed_tokens stays 48",
        ],
    );
    // The same in mode vllm: rounded down, no candidates.
    let v = explain_text("s5_vllm_i104");
    assert_lines_in_order(
        &v,
        &["boundary 48 (vllm_round_down): mode vllm: the earliest new hit rounded down to S, floor(48 / 16) · 16 = 48"],
    );
    assert!(!v.contains("rejected"), "{v}");
    // Full attention and sliding window 17, {15}: the window of every candidate is null.
    assert_lines_in_order(
        &explain_text("sw_safe_i15"),
        &[
            "hit group 1 entry 4 (position 64): block 15, new, this request claims it",
            "candidate 64 rejected by group 1: sliding window 17: entry 3 is null",
            "candidate 48 rejected by group 1: sliding window 17: entry 2 is null",
            "candidate 32 rejected by group 1: sliding window 17: entry 1 is null",
            "candidate 16 rejected by group 1: sliding window 17: entry 0 is null",
            "boundary 0 (safe_resumable): mode safe: no multiple of S in (0, 64] from which every group can resume; every group can resume at 0",
        ],
    );
    // {16}: the window entry of 80 is real, the first candidate stands.
    assert_lines_in_order(
        &explain_text("sw_safe_i16"),
        &["boundary 80 (safe_resumable): mode safe: every group can resume at floor(80 / 16) · 16 = 80"],
    );
    // Shared hybrid block: R2's hit is old, owned by R1, and a wait edge.
    assert_lines_in_order(
        &explain_text("shared_hybrid_safe"),
        &[
            "request R1 (async): num_computed_tokens 48, num_scheduled_tokens 0, P = 48",
            "hit group 1 entry 1 (position 16): block 12, new, this request claims it",
            "boundary 16 (safe_resumable): mode safe: every group can resume at floor(16 / 16) · 16 = 16",
            "request R2 (async): num_computed_tokens 48, num_scheduled_tokens 0, P = 48",
            "hit group 1 entry 1 (position 16): block 12, old, already marked by R1",
            "boundary 48 (old_hits_only): only old hits: back to P = 48 (their owners rewrite the shared blocks)",
            "wait edge: block 12 (position 16), owner R1: starts below the new num_computed_tokens 48: not to be read until R1 has rewritten it",
        ],
    );
    // Mode vllm: the same old hit is no wait edge.
    assert_lines_in_order(
        &explain_text("shared_hybrid_vllm"),
        &["no wait: block 12 (position 16), owner R1: mode vllm has no wait edges"],
    );
    // Async and sync sharing a block: one marked set in mode safe, the sync request waits.
    assert_lines_in_order(
        &explain_text("async_sync_safe"),
        &[
            "hit group 0 entry 0 (position 0): block 1, old, already marked by A1",
            "boundary 32 (old_hits_only): only old hits: back to P = 32 (their owners rewrite the shared blocks); the step's 16 tokens are discarded",
            "wait edge: block 1 (position 0), owner A1: starts below the new num_computed_tokens 32: not to be read until A1 has rewritten it",
        ],
    );
    // Mode vllm: two marked sets, so the sync request's hit is new again.
    let v = explain_text("async_sync_vllm");
    assert_eq!(v.matches("new, this request claims it").count(), 2, "{v}");
    // Under fail, no wait edges.
    assert_lines_in_order(
        &explain_text("async_sync_safe_fail"),
        &["no wait: block 1 (position 0), owner A1: no wait edges under fail: the request fails"],
    );
}

/// The typed reasons in the JSON: kinds of problems, owners, rules.
#[test]
fn explain_json_is_typed() {
    let path = scenario_path("s5_safe_i104");
    let out = run(&["replay", "--explain", path.to_str().expect("utf-8")], b"");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let a = &v["explain"][0];
    assert_eq!(a["id"], "a");
    assert_eq!(a["earliest_new_hit"], 48);
    assert_eq!(a["candidates"]["start"], 48);
    assert_eq!(a["candidates"]["step"], 16);
    assert_eq!(a["rejected"][0]["candidate"], 48);
    assert_eq!(a["rejected"][0]["group"], 1);
    assert_eq!(a["rejected"][0]["entry"], 2);
    assert_eq!(a["rejected"][0]["problem"], "null");
    assert_eq!(a["rule"], "safe_resumable");
    assert_eq!(a["num_computed_tokens"], 0);
    assert_eq!(a["hits"][0]["new"], true);
    let path = scenario_path("shared_hybrid_safe");
    let out = run(&["replay", "--explain", path.to_str().expect("utf-8")], b"");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let r2 = &v["explain"][1];
    assert_eq!(r2["id"], "R2");
    assert_eq!(r2["rule"], "old_hits_only");
    assert_eq!(r2["hits"][0]["new"], false);
    assert_eq!(r2["hits"][0]["owner"], "R1");
    assert_eq!(r2["old_hits"][0]["owner"], "R1");
    assert_eq!(r2["old_hits"][0]["waits"], true);
    assert_eq!(r2["old_hits"][0]["block"], 12);
    // Mamba `all` keeps every state: the first candidate stands.
    let sc = sc(
        r#"[{"kind":"full_attention","block_size":16},{"kind":"mamba","block_size":16,"mamba_mode":"all"}]"#,
        r#"[{"id":"a","class":"async","num_computed_tokens":64,"block_tables":[[1,2,3,4],[5,6,7,8]]}]"#,
        r#","invalid_blocks":[4,6]"#,
    );
    let out = run(&["replay", "--explain=text", "-"], sc.as_bytes());
    assert_lines_in_order(
        &text(&out.stdout),
        &[
            "earliest new hit at 16",
            "candidate boundary: 16",
            "boundary 16 (safe_resumable): mode safe: every group can resume at floor(16 / 16) · 16 = 16",
        ],
    );
    // A short table caps the candidates below the earliest new hit.
    let short = sc.replace("[5,6,7,8]", "[5,6]").replace("[4,6]", "[4]");
    let out = run(&["replay", "--explain", "-"], short.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let c = &v["explain"][0]["candidates"];
    assert_eq!(v["explain"][0]["earliest_new_hit"], 48);
    assert_eq!(c["start"], 32);
    assert_eq!(c["short_table"]["group"], 1);
    assert_eq!(c["short_table"]["len"], 2);
    assert_eq!(v["explain"][0]["num_computed_tokens"], 32);
    let out = run(&["replay", "--explain=text", "-"], short.as_bytes());
    assert_lines_in_order(
        &text(&out.stdout),
        &["candidate boundaries: 32 down to 16, by S = 16; group 1's table has only 2 entries, so none above 32"],
    );
}
