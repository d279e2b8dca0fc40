//! `kvsched stress --trace`: the bundled Mooncake trace replays (arrivals, prompts sharing
//! prefixes as its block ids say, output lengths), with the reference shares a prefix cache
//! could serve; a bad trace is refused with one line naming the flag and the line.

use std::process::Command;

use serde_json::Value;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../traces/mooncake_conversation_trace.jsonl"
);

fn stress(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvsched"))
        .arg("stress")
        .args(args)
        .output()
        .expect("run kvsched")
}

#[test]
fn the_bundled_trace_replays_and_says_what_a_cache_could_serve() {
    let out = stress(&[
        "--trace",
        TRACE,
        "--trace-requests",
        "40",
        "--trace-speed",
        "1000",
        "--verify",
        "off",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(v["requests"]["submitted"], 40, "{}", v["requests"]);
    let r = &v["requests"];
    let ended = r["finished"].as_u64().unwrap_or(0)
        + r["cancelled"].as_u64().unwrap_or(0)
        + r["failed"].as_u64().unwrap_or(0);
    assert_eq!(ended, 40, "{r}");
    let t = &v["config"]["trace_reference"];
    assert_eq!(t["requests"], 40, "{t}");
    // Without --duration the run may last until 20 s after the last arrival, so none is cut.
    assert!(v["config"]["cut_by_duration"].is_null(), "{}", v["config"]);
    let d = v["config"]["duration_s"].as_f64().expect("duration_s");
    assert!(d > 20.0 && d < 21.0, "{d}");
    // The first 40 requests of the trace share their first block (id 0) and a few more.
    let inf = t["infinite_cache_share"].as_f64().expect("share");
    assert!(inf > 0.0 && inf < 1.0, "{t}");
    assert!(
        t["device_pool_lru_share"].as_f64().expect("share") <= inf,
        "{t}"
    );
    assert_eq!(v["invariants"]["ok"], true, "{}", v["invariants"]);
}

#[test]
fn a_bad_trace_is_one_line_naming_the_flag_and_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 1, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .expect("write");
    let p = path.to_str().expect("utf-8 path");
    let out = stress(&["--trace", p]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--trace") && err.contains("line 2: hash_ids"),
        "{err}"
    );
    let out = stress(&["--trace", "/nonexistent/trace.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    let out = stress(&["--trace-speed", "-1"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A flag of the synthetic workload typed with `--trace` is refused naming it, not dropped
/// without a word; one a trace run uses (`--cancel-ratio`) is taken.
#[test]
fn the_synthetic_workloads_flags_are_refused_with_a_trace() {
    for (flag, value) in [
        ("--requests", "50"),
        ("--rate", "max"),
        ("--live", "8"),
        ("--prompt-tokens", "64"),
        ("--output-tokens", "4"),
        ("--prefix-share", "0.5"),
        ("--prefix-burst", "2"),
        ("--prefixes", "5"),
        ("--hit-ratio", "0.5"),
    ] {
        let out = stress(&["--trace", TRACE, flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("error: {flag}: unused with --trace")),
            "{err}"
        );
    }
    let out = stress(&[
        "--trace",
        TRACE,
        "--trace-requests",
        "5",
        "--cancel-ratio",
        "0",
        "--verify",
        "off",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A timestamp past 64 bits is out of range (not "not whole"); bytes that are not UTF-8 are
/// refused naming their line; a first arrival past the longest replay names `--trace` when no
/// `--duration` was given; and a replay cut at the longest one says so, not `--duration`.
#[test]
fn a_trace_out_of_range_or_not_utf8_is_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ok =
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n";
    let refused = |name: &str, body: &[u8], want: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, body).expect("write");
        let out = stress(&["--trace", path.to_str().expect("utf-8 path")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "want {want:?}: {err}");
    };
    refused(
        "big.jsonl",
        b"{\"timestamp\": 99999999999999999999999, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
        "line 1: timestamp: out of range: past 18446744073709551615, the largest count",
    );
    let mut utf8 = ok.as_bytes().to_vec();
    utf8.extend_from_slice(b"\xff\xfe\n");
    refused("utf8.jsonl", &utf8, "line 2: line: not UTF-8");
    refused(
        "late.jsonl",
        b"{\"timestamp\": 18446744073709551615, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
        "error: --trace: no request of the trace arrives within the longest replay (86400 s)",
    );
    let path = dir.path().join("second_late.jsonl");
    std::fs::write(
        &path,
        format!("{ok}{{\"timestamp\": 18446744073709551615, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 3]}}\n"),
    )
    .expect("write");
    let out = stress(&[
        "--trace",
        path.to_str().expect("utf-8 path"),
        "--store",
        "memory",
        "--verify",
        "off",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let text = String::from_utf8_lossy(&out.stdout).replace("\n  ", " ");
    assert!(
        text.contains(
            "trace: 1 request (of the first 2, those arriving within the longest replay, 86400 s)"
        ),
        "{text}"
    );
}

/// A trace request the device pool cannot hold (its prompt, or an output length past what a
/// submit carries) is refused up front in one line naming `--trace`, the request's line (not
/// its number: a blank line comes before it) and the field, not found out by the run's
/// submits.
#[test]
fn a_trace_request_too_long_for_the_pool_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (second, what) in [
        (
            "\"input_length\": 300000, \"output_length\": 1",
            "line 3: input_length: 300000 prompt",
        ),
        (
            "\"input_length\": 6, \"output_length\": 18446744073709551615",
            "line 3: output_length: 6 prompt and 18446744073709551615 output",
        ),
    ] {
        let path = dir.path().join("long.jsonl");
        let ids: Vec<String> = (0..586).map(|i| i.to_string()).collect();
        std::fs::write(
            &path,
            format!(
                "{{\"timestamp\": 0, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [1]}}\n\n\
                 {{\"timestamp\": 1, {second}, \"hash_ids\": [{}]}}\n",
                if what.contains("input_length") { ids.join(", ") } else { "2".to_owned() }
            ),
        )
        .expect("write");
        let out = stress(&["--trace", path.to_str().expect("utf-8 path")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("--trace: ") && err.contains(what), "{err}");
    }
    // The bundled trace on a pool too small for its longer prompts.
    let out = stress(&[
        "--trace",
        TRACE,
        "--trace-requests",
        "30",
        "--pool-blocks",
        "1024",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--trace") && err.contains("--pool-blocks 1024"),
        "{err}"
    );
    // A pool too small for any request: named against the trace's first request, not the
    // synthetic workload's size (which a trace does not use).
    let out = stress(&["--trace", TRACE, "--pool-blocks", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("mooncake_conversation_trace.jsonl: line 1: input_length: ")
            && err.contains("--pool-blocks 2 holds 1"),
        "{err}"
    );
}

/// `prompt_tokens` of a run's JSON: (requests, total, device, tier, computed, after failure).
fn split(v: &Value) -> [u64; 6] {
    let p = &v["prompt_tokens"];
    [
        "requests",
        "total",
        "device_hit",
        "tier_hit",
        "computed",
        "computed_after_failed_load",
    ]
    .map(|k| {
        p[k].as_u64()
            .unwrap_or_else(|| panic!("prompt_tokens.{k}: {p}"))
    })
}

/// On a pool far smaller than the trace's reuse, the tier serves prompt tokens the device
/// prefix cache let go of; every finished request's prompt is split exactly into device
/// hits, tier hits and computed tokens.
#[test]
fn prompt_tokens_split_by_source_and_the_tier_serves_what_the_pool_let_go() {
    let out = stress(&[
        "--trace",
        TRACE,
        "--trace-requests",
        "150",
        "--trace-speed",
        "200",
        "--store",
        "memory",
        "--pool-blocks",
        "16384",
        "--cancel-ratio",
        "0",
        "--verify",
        "off",
        // Every request must finish for the split to cover the whole trace: a debug build on
        // a loaded machine takes longer than the default 20 s.
        "--duration",
        "600",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json report");
    let [requests, total, device, tier, computed, after_failed] = split(&v);
    assert_eq!(requests, 150, "{}", v["prompt_tokens"]);
    assert_eq!(
        Some(requests),
        v["requests"]["finished"].as_u64(),
        "{}",
        v["prompt_tokens"]
    );
    // Every request finished: the engine saw exactly the trace's prompt tokens.
    let t = &v["config"]["trace_reference"];
    assert_eq!(Some(total), t["prompt_tokens"].as_u64(), "{t}");
    assert_eq!(device + tier + computed, total, "{}", v["prompt_tokens"]);
    assert!(total > 0 && computed > 0, "{}", v["prompt_tokens"]);
    assert!(
        tier > 0,
        "no tier hit on a pool of 16,384 blocks: {}",
        v["prompt_tokens"]
    );
    assert!(after_failed <= computed, "{}", v["prompt_tokens"]);
    // Loaded tokens were verified chunks: at least as many bytes loaded as tier tokens need.
    let loaded = v["kv"]["kv_bytes_loaded"]
        .as_u64()
        .expect("kv_bytes_loaded");
    assert!(
        loaded >= tier * 16,
        "{loaded} bytes loaded for {tier} tier tokens"
    );
    let with_tier = t["device_and_tier_lru_share"].as_f64().expect("share");
    assert!(
        with_tier >= t["device_pool_lru_share"].as_f64().expect("share"),
        "{t}"
    );
}

/// Chunks evicted between lookup and load fail their loads: the tokens they would have
/// served are computed, and counted as computed after a failed load.
#[test]
fn tokens_a_failed_load_would_have_served_are_counted_apart() {
    let out = stress(&[
        "--trace",
        TRACE,
        "--trace-requests",
        "150",
        "--trace-speed",
        "200",
        "--store",
        "memory",
        "--pool-blocks",
        "16384",
        "--faults",
        "evict=0.3",
        "--verify",
        "off",
        // To its last request, not to the default 20 s a loaded debug build can reach first.
        "--duration",
        "600",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json report");
    let [_, total, device, tier, computed, after_failed] = split(&v);
    assert_eq!(device + tier + computed, total, "{}", v["prompt_tokens"]);
    assert!(v["kv"]["missing_chunks"].as_u64() > Some(0), "{}", v["kv"]);
    assert!(after_failed > 0, "{}", v["prompt_tokens"]);
}
