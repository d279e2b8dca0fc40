//! The `kvsched replay` binary: output, `--bench`, exit codes and one-line error messages
//! (docs/replay.md).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_kvsched");

/// The annotated example scenario of docs/replay.md, verbatim.
const DOC_EXAMPLE: &str = r#"{
  "mode": "vllm",
  "policy": "recompute",
  "null_block_id": 0,
  "scheduler_block_size": 16,
  "groups": [ {"kind": "full_attention", "block_size": 16},
              {"kind": "mamba", "block_size": 16, "mamba_mode": "align"} ],
  "requests": [
    {"id": "a", "class": "async", "num_computed_tokens": 144,
     "block_tables": [[101,102,103,104,105,106,107,108,109], [0,0,0,0,0,0,0,0,201]]},
    {"id": "s", "class": "sync", "num_computed_tokens": 48, "num_scheduled_tokens": 16,
     "block_tables": [[1,2,3], [0,0,9]]}
  ],
  "invalid_blocks": [104]
}
"#;

/// Its outcome, as the tool prints it (pretty, 2-space indent, trailing newline).
const DOC_OUTCOME: &str = r#"{
  "affected": [
    "a"
  ],
  "skip": [],
  "failed": [],
  "failed_recving": [
    "a"
  ],
  "total_affected_tokens": 96,
  "evicted_blocks": [],
  "requests": [
    {
      "id": "a",
      "affected": true,
      "num_computed_tokens": 48,
      "affected_tokens": 96,
      "claimed_blocks": [
        104
      ],
      "waits_for": [],
      "num_computed_tokens_in": 144,
      "pre_step_tokens": 144
    },
    {
      "id": "s",
      "affected": false,
      "num_computed_tokens": 48,
      "affected_tokens": 0,
      "claimed_blocks": [],
      "waits_for": [],
      "num_computed_tokens_in": 48,
      "pre_step_tokens": 32
    }
  ]
}
"#;

fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvsched");
    {
        let mut input = child.stdin.take().expect("stdin");
        // The binary may exit before reading everything (e.g. on a bad argument).
        let _ = input.write_all(stdin);
    }
    child.wait_with_output().expect("wait for kvsched")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvsched-cli-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

/// Asserts exit code 2, empty stdout and exactly one stderr line `error: {field}: …problem…`.
fn assert_bad(out: &Output, field: &str, problem: &str, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{what}: expected exit code 2, got {:?}; stderr: {stderr}",
        out.status
    );
    assert!(out.stdout.is_empty(), "{what}: stdout not empty");
    assert!(
        stderr.ends_with('\n') && stderr.matches('\n').count() == 1,
        "{what}: stderr is not exactly one line: {stderr:?}"
    );
    let line = stderr.trim_end();
    let prefix = format!("error: {field}: ");
    assert!(
        line.starts_with(&prefix),
        "{what}: expected the message to start with {prefix:?}, got {line:?}"
    );
    assert!(
        line[prefix.len()..].contains(problem),
        "{what}: expected the problem to mention {problem:?}, got {line:?}"
    );
    assert!(!line.contains("panicked"), "{what}: {line}");
}

#[test]
fn spec_example_from_file() {
    let path = temp_file("spec_example.json", DOC_EXAMPLE);
    let out = run(&["replay", path.to_str().expect("utf-8 path")], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), DOC_OUTCOME);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn spec_example_from_stdin() {
    let out = run(&["replay", "-"], DOC_EXAMPLE.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), DOC_OUTCOME);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn bench_prints_median_and_leaves_stdout_unchanged() {
    let plain = run(&["replay", "-"], DOC_EXAMPLE.as_bytes());
    let out = run(&["replay", "--bench", "5", "-"], DOC_EXAMPLE.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout, plain.stdout);
    let stderr = text(&out.stderr);
    let value = stderr
        .lines()
        .find_map(|l| l.strip_prefix("recovery_ns_median="))
        .unwrap_or_else(|| panic!("no recovery_ns_median= line in {stderr:?}"));
    assert!(
        !value.is_empty() && value.parse::<u64>().is_ok(),
        "median is not an integer: {value:?}"
    );
}

#[test]
fn bench_zero_is_a_usage_error() {
    let out = run(&["replay", "--bench", "0", "-"], DOC_EXAMPLE.as_bytes());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stderr).matches('\n').count(), 1);
}

#[test]
fn missing_file() {
    let out = run(&["replay", "/nonexistent/kvsched/scenario.json"], b"");
    assert_bad(&out, "FILE", "cannot read", "missing file");
}

#[test]
fn directory_instead_of_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let out = run(&["replay", dir.to_str().expect("utf-8 path")], b"");
    assert_bad(&out, "FILE", "cannot read", "directory");
}

#[test]
fn usage_errors_are_one_line() {
    for args in [&["replay"][..], &[][..], &["replay", "--nope", "-"][..]] {
        let out = run(args, b"");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.starts_with("error: ") && stderr.matches('\n').count() == 1,
            "{args:?}: {stderr:?}"
        );
    }
}

const G1: &str = r#"[{"kind":"full_attention","block_size":16}]"#;
const G2: &str =
    r#"[{"kind":"full_attention","block_size":16},{"kind":"full_attention","block_size":16}]"#;
const R1: &str = r#"[{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[[1,2]]}]"#;
const REPORT: &str = r#","invalid_blocks":[1]"#;

/// A scenario with the given groups, requests and trailing top-level fields.
fn sc(groups: &str, requests: &str, tail: &str) -> String {
    format!(r#"{{"groups":{groups},"requests":{requests}{tail}}}"#)
}

fn group(g: &str) -> String {
    sc(&format!("[{g}]"), "[]", REPORT)
}

fn request(r: &str) -> String {
    sc(G1, &format!("[{r}]"), REPORT)
}

/// `text` as UTF-16 little-endian, with or without a byte order mark.
fn utf16(text: &str, bom: bool) -> Vec<u8> {
    let mut out = if bom { vec![0xff, 0xfe] } else { vec![] };
    for unit in text.encode_utf16() {
        out.extend_from_slice(&unit.to_le_bytes());
    }
    out
}

/// (what, input, field, problem)
fn bad_inputs() -> Vec<(&'static str, Vec<u8>, &'static str, &'static str)> {
    let s = |x: String| x.into_bytes();
    vec![
        // Malformed JSON, top level.
        ("truncated JSON", s(r#"{"groups": ["#.into()), "groups", "EOF while parsing a list at line 1 column 13"),
        ("truncated deep", s(r#"{"groups": [{"kind": "full_attention", "block_size": 1"#.into()), "groups[0]", "EOF while parsing an object"),
        ("syntax error in a table", s(request(r#"{"id":"a","class":"async","num_computed_tokens":0,"block_tables":[[1,2;3]]}"#)), "requests[0].block_tables[0]", "expected ',' or ']'"),
        ("trailing characters", s(format!("{} x", sc(G1, R1, REPORT))), "scenario", "trailing characters"),
        // Whole-input problems.
        ("empty input", vec![], "input", "empty input"),
        ("whitespace only", s(" \n\t".into()), "input", "only whitespace"),
        ("invalid UTF-8", vec![b'{', 0xff, b'}'], "input", "invalid UTF-8 at byte 1"),
        ("invalid UTF-8 in a string", [&br#"{"groups":[],"requests":[{"id":""#[..], &[0xc3, 0x28], br#""}]}"#].concat(), "input", "invalid UTF-8 at byte 32"),
        ("UTF-8 byte order mark", [&[0xef, 0xbb, 0xbf][..], sc(G1, R1, REPORT).as_bytes()].concat(), "input", "byte order mark"),
        ("UTF-16 LE with BOM", utf16(&sc(G1, R1, REPORT), true), "input", "UTF-16 little-endian"),
        ("UTF-16 LE without BOM", utf16(&sc(G1, R1, REPORT), false), "input", "UTF-16"),
        // Numbers JSON has not, and numbers JSON has but a scenario does not.
        ("NaN", s(sc(G1, R1, r#","invalid_blocks":[NaN]"#)), "invalid_blocks[0]", "NaN is not a JSON number"),
        ("Infinity", s(sc(G1, R1, r#","invalid_blocks":[1,Infinity]"#)), "invalid_blocks[1]", "Infinity is not a JSON number"),
        ("-Infinity", s(group(r#"{"kind":"full_attention","block_size":-Infinity}"#)), "groups[0].block_size", "-Infinity is not a JSON number"),
        ("1e400", s(sc(G1, R1, r#","invalid_blocks":[1e400]"#)), "invalid_blocks[0]", "number out of range (got 1e400)"),
        ("exponent", s(group(r#"{"kind":"full_attention","block_size":1e1}"#)), "groups[0].block_size", "float 1e1"),
        ("negative float zero", s(group(r#"{"kind":"full_attention","block_size":-0.0}"#)), "groups[0].block_size", "non-negative integer, got -0.0"),
        ("leading zero", s(group(r#"{"kind":"full_attention","block_size":016}"#)), "groups[0].block_size", "leading zero"),
        ("top level array", s("[]".into()), "scenario", "must be a JSON object"),
        ("top level number", s("3".into()), "scenario", "must be a JSON object"),
        // Unknown fields and enum values.
        ("unknown top field", s(sc(G1, R1, r#","invalid_blocks":[],"foo":1"#)), "foo", "unknown field"),
        ("unknown group field", s(group(r#"{"kind":"full_attention","block_size":16,"size":3}"#)), "groups[0].size", "unknown field"),
        ("unknown request field", s(request(r#"{"id":"a","class":"async","num_computed_tokens":0,"block_tables":[[]],"prio":1}"#)), "requests[0].prio", "unknown field"),
        ("unknown mode", s(sc(G1, R1, r#","invalid_blocks":[],"mode":"fast""#)), "mode", "unknown value \"fast\""),
        ("unknown policy", s(sc(G1, R1, r#","invalid_blocks":[],"policy":"retry""#)), "policy", "unknown value \"retry\""),
        ("unknown kind", s(group(r#"{"kind":"linear","block_size":16}"#)), "groups[0].kind", "unknown value \"linear\""),
        ("unknown mamba_mode", s(group(r#"{"kind":"mamba","block_size":16,"mamba_mode":"some"}"#)), "groups[0].mamba_mode", "unknown value \"some\""),
        ("unknown class", s(request(r#"{"id":"a","class":"batch","num_computed_tokens":0,"block_tables":[[]]}"#)), "requests[0].class", "unknown value \"batch\""),
        ("mode not a string", s(sc(G1, R1, r#","invalid_blocks":[],"mode":1"#)), "mode", "got number 1"),
        // Duplicate keys.
        ("top key twice", s(r#"{"mode":"vllm","mode":"safe","groups":[{"kind":"full_attention","block_size":16}],"requests":[],"invalid_blocks":[]}"#.into()), "mode", "key given twice"),
        ("group key twice", s(group(r#"{"kind":"full_attention","block_size":16,"block_size":32}"#)), "groups[0].block_size", "key given twice"),
        ("request key twice", s(request(r#"{"id":"a","id":"b","class":"async","num_computed_tokens":0,"block_tables":[[]]}"#)), "requests[0].id", "key given twice"),
        // Numbers that are not non-negative 64-bit integers.
        ("float size", s(group(r#"{"kind":"full_attention","block_size":16.0}"#)), "groups[0].block_size", "float 16.0"),
        ("string size", s(group(r#"{"kind":"full_attention","block_size":"16"}"#)), "groups[0].block_size", "got string \"16\""),
        ("boolean tokens", s(request(r#"{"id":"a","class":"async","num_computed_tokens":true,"block_tables":[[]]}"#)), "requests[0].num_computed_tokens", "boolean"),
        ("negative size", s(group(r#"{"kind":"full_attention","block_size":-16}"#)), "groups[0].block_size", "non-negative"),
        ("negative null id", s(sc(G1, R1, r#","invalid_blocks":[],"null_block_id":-1"#)), "null_block_id", "non-negative"),
        ("overflowing report id", s(sc(G1, R1, r#","invalid_blocks":[18446744073709551616]"#)), "invalid_blocks[0]", "integer does not fit in 64 bits (got 18446744073709551616; at most 18446744073709551615)"),
        ("overflowing table entry", s(request(r#"{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[[1,99999999999999999999]]}"#)), "requests[0].block_tables[0][1]", "64 bits"),
        ("null report id", s(sc(G1, R1, r#","invalid_blocks":[null]"#)), "invalid_blocks[0]", "null"),
        ("string table entry", s(request(r#"{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[["1",2]]}"#)), "requests[0].block_tables[0][0]", "string"),
        ("null scheduler_block_size", s(sc(G1, R1, r#","invalid_blocks":[],"scheduler_block_size":null"#)), "scheduler_block_size", "null"),
        ("float in by-group list", s(sc(G1, R1, r#","invalid_blocks_by_group":[[1.5]]"#)), "invalid_blocks_by_group[0][0]", "float 1.5"),
        // Geometry.
        ("zero block size", s(sc(r#"[{"kind":"full_attention","block_size":16},{"kind":"full_attention","block_size":0}]"#, "[]", REPORT)), "groups[1].block_size", "must be > 0"),
        ("zero window", s(group(r#"{"kind":"sliding_window","block_size":16,"window":0}"#)), "groups[0].window", "must be > 0"),
        ("zero S", s(sc(G1, R1, r#","invalid_blocks":[],"scheduler_block_size":0"#)), "scheduler_block_size", "must be > 0"),
        ("S not a multiple", s(sc(G2, "[]", r#","invalid_blocks":[],"scheduler_block_size":24"#)), "scheduler_block_size", "24 is not a multiple of groups[0].block_size 16"),
        ("lcm overflow", s(sc(r#"[{"kind":"full_attention","block_size":9223372036854775783},{"kind":"full_attention","block_size":4611686018427387904}]"#, "[]", REPORT)), "groups", "overflows 64 bits"),
        ("empty groups", s(sc("[]", "[]", REPORT)), "groups", "at least one cache group"),
        ("groups not an array", s(sc("{}", "[]", REPORT)), "groups", "expected an array"),
        ("group not an object", s(sc("[16]", "[]", REPORT)), "groups[0]", "must be a JSON object"),
        // Fields that do not belong to the group's kind; missing kind fields.
        ("window on full attention", s(group(r#"{"kind":"full_attention","block_size":16,"window":32}"#)), "groups[0].window", "not a field of a full_attention group"),
        ("mamba_mode on sliding window", s(group(r#"{"kind":"sliding_window","block_size":16,"window":32,"mamba_mode":"all"}"#)), "groups[0].mamba_mode", "not a field of a sliding_window group"),
        ("window on mamba", s(group(r#"{"kind":"mamba","block_size":16,"mamba_mode":"all","window":3}"#)), "groups[0].window", "not a field of a mamba group"),
        ("missing window", s(group(r#"{"kind":"sliding_window","block_size":16}"#)), "groups[0].window", "missing"),
        ("missing mamba_mode", s(group(r#"{"kind":"mamba","block_size":16}"#)), "groups[0].mamba_mode", "missing"),
        ("missing kind", s(group(r#"{"block_size":16}"#)), "groups[0].kind", "missing"),
        ("missing block_size", s(group(r#"{"kind":"full_attention"}"#)), "groups[0].block_size", "missing"),
        ("missing groups", s(r#"{"requests":[],"invalid_blocks":[]}"#.into()), "groups", "missing"),
        ("missing requests", s(format!(r#"{{"groups":{G1},"invalid_blocks":[]}}"#)), "requests", "missing"),
        // Requests.
        ("missing id", s(request(r#"{"class":"async","num_computed_tokens":0,"block_tables":[[]]}"#)), "requests[0].id", "missing"),
        ("missing class", s(request(r#"{"id":"a","num_computed_tokens":0,"block_tables":[[]]}"#)), "requests[0].class", "missing"),
        ("missing num_computed_tokens", s(request(r#"{"id":"a","class":"sync","block_tables":[[]]}"#)), "requests[0].num_computed_tokens", "missing"),
        ("missing block_tables", s(request(r#"{"id":"a","class":"sync","num_computed_tokens":0}"#)), "requests[0].block_tables", "missing"),
        ("numeric id", s(request(r#"{"id":7,"class":"async","num_computed_tokens":0,"block_tables":[[]]}"#)), "requests[0].id", "non-empty string"),
        ("empty id", s(request(r#"{"id":"","class":"async","num_computed_tokens":0,"block_tables":[[]]}"#)), "requests[0].id", "non-empty string"),
        ("requests not an array", s(sc(G1, r#"{"a":1}"#, REPORT)), "requests", "expected an array"),
        ("table not an array", s(request(r#"{"id":"a","class":"async","num_computed_tokens":0,"block_tables":[3]}"#)), "requests[0].block_tables[0]", "expected an array"),
        ("duplicate request ids", s(sc(G1, r#"[{"id":"a","class":"async","num_computed_tokens":0,"block_tables":[[]]},{"id":"a","class":"sync","num_computed_tokens":0,"block_tables":[[]]}]"#, REPORT)), "requests[1].id", "duplicate request id \"a\""),
        ("scheduled > computed", s(request(r#"{"id":"a","class":"sync","num_computed_tokens":16,"num_scheduled_tokens":32,"block_tables":[[1]]}"#)), "requests[0].num_scheduled_tokens", "num_scheduled_tokens 32 exceeds num_computed_tokens 16"),
        ("async with scheduled tokens", s(request(r#"{"id":"a","class":"async","num_computed_tokens":32,"num_scheduled_tokens":16,"block_tables":[[1,2]]}"#)), "requests[0].num_scheduled_tokens", "must be 0"),
        ("null in full attention below P", s(sc(G2, r#"[{"id":"a","class":"async","num_computed_tokens":64,"block_tables":[[1,2,3,4],[5,6,7,0]]}]"#, REPORT)), "requests[0].block_tables[1][3]", "null block 0 in a full_attention table below P = 64"),
        ("custom null in full attention", s(sc(G1, r#"[{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[[9,7]]}]"#, r#","invalid_blocks":[],"null_block_id":7"#)), "requests[0].block_tables[0][1]", "null block 7"),
        // Reports.
        ("by-group list count", s(sc(G2, "[]", r#","invalid_blocks_by_group":[[1]]"#)), "invalid_blocks_by_group", "1 list given, 2 groups configured"),
        ("by-group list count, one group", s(sc(G1, "[]", r#","invalid_blocks_by_group":[[],[]]"#)), "invalid_blocks_by_group", "2 lists given, 1 group configured"),
        ("table count, one group", s(request(r#"{"id":"a","class":"async","num_computed_tokens":0,"block_tables":[[],[]]}"#)), "requests[0].block_tables", "2 tables given, 1 group configured"),
        ("no report", s(sc(G1, R1, "")), "invalid_blocks", "missing"),
        ("report not an array", s(sc(G1, R1, r#","invalid_blocks":1"#)), "invalid_blocks", "expected an array"),
    ]
}

#[test]
fn bad_inputs_exit_2_with_one_line_naming_field_and_problem() {
    let cases = bad_inputs();
    assert!(cases.len() >= 25);
    for (what, input, field, problem) in cases {
        let out = run(&["replay", "-"], &input);
        assert_bad(&out, field, problem, what);
    }
}

#[test]
fn table_count_message_is_the_spec_example() {
    let groups = r#"[{"kind":"full_attention","block_size":16},{"kind":"full_attention","block_size":16},{"kind":"full_attention","block_size":16}]"#;
    let requests = r#"[{"id":"a","class":"async","num_computed_tokens":0,"block_tables":[[],[],[]]},{"id":"b","class":"async","num_computed_tokens":0,"block_tables":[[],[]]}]"#;
    let out = run(&["replay", "-"], sc(groups, requests, REPORT).as_bytes());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: requests[1].block_tables: 2 tables given, 3 groups configured\n"
    );
}

#[test]
fn accepted_edge_cases() {
    for (what, input) in [
        ("empty requests", sc(G1, "[]", REPORT)),
        ("empty report", sc(G1, R1, r#","invalid_blocks":[]"#)),
        (
            "repeated ids in a report",
            sc(G1, R1, r#","invalid_blocks":[2,2,2]"#),
        ),
        (
            "one id in two groups' tables",
            sc(
                G2,
                r#"[{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[[1,2],[2,1]]}]"#,
                REPORT,
            ),
        ),
        (
            "both report forms",
            sc(
                G2,
                "[]",
                r#","invalid_blocks":[1],"invalid_blocks_by_group":[[],[2]]"#,
            ),
        ),
        (
            "null above P in full attention",
            sc(
                G1,
                r#"[{"id":"a","class":"async","num_computed_tokens":16,"block_tables":[[1,0,0]]}]"#,
                REPORT,
            ),
        ),
        (
            "nulls inside a window; mamba align with several real entries",
            sc(
                r#"[{"kind":"sliding_window","block_size":16,"window":64},{"kind":"mamba","block_size":16,"mamba_mode":"align"}]"#,
                r#"[{"id":"a","class":"async","num_computed_tokens":48,"block_tables":[[0,5,0],[6,7,8]]}]"#,
                REPORT,
            ),
        ),
        (
            "unicode id and u64::MAX",
            sc(
                G1,
                r#"[{"id":"é\n","class":"async","num_computed_tokens":18446744073709551615,"block_tables":[[1]]}]"#,
                REPORT,
            ),
        ),
    ] {
        let out = run(&["replay", "-"], input.as_bytes());
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
        assert!(v.get("requests").is_some(), "{what}");
    }
}

/// The runtime's claim path (`--engine runtime`, K shard threads) prints byte-identical output.
#[test]
fn cli_engine_runtime_prints_the_same_outcome() {
    let bin = BIN;
    let mut files: Vec<_> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios"))
            .expect("scenario dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "json")
                    && !p.to_string_lossy().ends_with(".expected.json")
            })
            .collect();
    files.sort();
    for f in files.into_iter().take(12) {
        let seq = Command::new(bin)
            .arg("replay")
            .arg(&f)
            .output()
            .expect("run");
        assert!(seq.status.success());
        for k in ["1", "3"] {
            let rt = Command::new(bin)
                .args(["replay", "--engine", "runtime", "--shards", k])
                .arg(&f)
                .output()
                .expect("run");
            assert!(
                rt.status.success(),
                "{}",
                String::from_utf8_lossy(&rt.stderr)
            );
            assert_eq!(rt.stdout, seq.stdout, "{} --shards {k}", f.display());
        }
    }
    let bad = Command::new(bin)
        .args(["replay", "--engine", "runtime", "--shards", "0", "x.json"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
}

/// `-0` is an integer literal with the value zero (docs/replay.md#scenario-format): accepted
/// wherever a number is, and the same as `0`.
#[test]
fn negative_zero_is_zero() {
    let table = |zero: &str| {
        sc(
            r#"[{"kind":"sliding_window","block_size":16,"window":16}]"#,
            &format!(
                r#"[{{"id":"a","class":"async","num_computed_tokens":48,"num_scheduled_tokens":{zero},"block_tables":[[{zero},2,3]]}}]"#
            ),
            &format!(r#","invalid_blocks":[{zero},3],"null_block_id":{zero}"#),
        )
    };
    let plain = run(&["replay", "-"], table("0").as_bytes());
    let neg = run(&["replay", "-"], table("-0").as_bytes());
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stderr));
    assert_eq!(neg.status.code(), Some(0), "{}", text(&neg.stderr));
    assert_eq!(neg.stdout, plain.stdout);
    // `-0.0` has a fraction: a float, rejected.
    let out = run(&["replay", "-"], table("-0.0").as_bytes());
    assert_bad(
        &out,
        "null_block_id",
        "must be a non-negative integer, got -0.0",
        "-0.0",
    );
}

/// Values echoed in messages are cut: an unknown key or a duplicate id of a megabyte gives a
/// short line, with the start of the value.
#[test]
fn echoed_values_are_cut() {
    let long = "k".repeat(1 << 20);
    let unknown_key = sc(G1, R1, &format!(r#","invalid_blocks":[],"{long}":1"#));
    let id = "i".repeat(1 << 20);
    let req =
        format!(r#"{{"id":"{id}","class":"async","num_computed_tokens":0,"block_tables":[[]]}}"#);
    let duplicate_id = sc(G1, &format!("[{req},{req}]"), REPORT);
    let unknown_value = sc(G1, R1, &format!(r#","invalid_blocks":[],"mode":"{long}""#));
    let long_number = sc(
        G1,
        R1,
        &format!(r#","invalid_blocks":[1{}]"#, "0".repeat(1 << 20)),
    );
    for (what, input, field, problem) in [
        ("unknown key", unknown_key, "[\"kkkk", "unknown field"),
        (
            "duplicate id",
            duplicate_id,
            "requests[1].id",
            "duplicate request id \"iiii",
        ),
        (
            "unknown value",
            unknown_value,
            "mode",
            "unknown value \"kkkk",
        ),
        (
            "long number",
            long_number,
            "invalid_blocks[0]",
            "64 bits (got 1000",
        ),
    ] {
        let out = run(&["replay", "-"], input.as_bytes());
        let stderr = text(&out.stderr);
        assert!(
            stderr.len() < 400,
            "{what}: {} bytes of stderr",
            stderr.len()
        );
        assert!(stderr.contains('…'), "{what}: {stderr}");
        if field.starts_with('[') {
            assert!(
                stderr.starts_with(&format!("error: {field}")),
                "{what}: {stderr}"
            );
            assert!(stderr.contains(problem), "{what}: {stderr}");
            assert_eq!(out.status.code(), Some(2));
        } else {
            assert_bad(&out, field, problem, what);
        }
    }
}

fn scenario_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(format!("{name}.json"))
}

fn explain_text(name: &str) -> String {
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
fn assert_lines_in_order(haystack: &str, lines: &[&str]) {
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

// ---------------------------------------------------------------------------------------------
// Hostile inputs: memory and time in proportion to the input. Each runs the binary in a child
// under a virtual-memory limit (`ulimit -v` through `sh -c`) with a hang guard: a child still
// running after the guard is killed and the test fails. No timing is asserted.

/// The outcome of a guarded run.
struct Guarded {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs `kvsched ARGS` under `ulimit -v LIMIT_KIB`, with `stdin` as its standard input (a
/// file, or nothing), killed after `guard`.
fn run_guarded(
    limit_kib: u64,
    guard: std::time::Duration,
    args: &[&str],
    stdin: Option<&Path>,
) -> Guarded {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"ulimit -v "$1" || exit 99; shift; exec "$@""#)
        .arg("sh")
        .arg(limit_kib.to_string())
        .arg(BIN)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).expect("stdin file")),
        None => cmd.stdin(Stdio::null()),
    };
    let mut child = cmd.spawn().expect("spawn sh");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut v).ok();
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut v).ok();
        v
    });
    let deadline = std::time::Instant::now() + guard;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvsched {args:?} still running after {guard:?}: killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stdout = reader.join().expect("stdout reader");
    let stderr = text(&err_reader.join().expect("stderr reader"));
    assert_ne!(status.code(), Some(99), "ulimit -v failed: {stderr}");
    Guarded {
        code: status.code(),
        stdout,
        stderr,
    }
}

const GUARD: std::time::Duration = std::time::Duration::from_secs(120);

/// `n` full-attention groups, no requests, each group reporting `[1, 16777215]`.
fn many_groups_scenario(n: usize) -> String {
    let groups = vec![r#"{"kind":"full_attention","block_size":16}"#; n].join(",");
    let lists = vec!["[1,16777215]"; n].join(",");
    format!(r#"{{"groups":[{groups}],"requests":[],"invalid_blocks_by_group":[{lists}]}}"#)
}

/// 1,000 groups each reporting two far-apart ids (55 KB of JSON) once peaked at 2.3 GB (a
/// bitmap over the id range per group, each with a copy of the flat list): now under 50 MB,
/// and 10,000 groups under 100 MB.
#[test]
fn many_reporting_groups_stay_small() {
    for (n, limit_mib) in [(1_000usize, 50u64), (10_000, 100)] {
        let path = temp_file(&format!("groups_{n}.json"), &many_groups_scenario(n));
        let out = run_guarded(
            limit_mib << 10,
            GUARD,
            &["replay", path.to_str().expect("utf-8 path")],
            None,
        );
        assert_eq!(out.code, Some(0), "{n} groups: {}", out.stderr);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
        assert_eq!(v["requests"], serde_json::json!([]));
    }
    // With requests, and the flat list shared by every group.
    let n = 2_000;
    let groups = vec![r#"{"kind":"full_attention","block_size":16}"#; n].join(",");
    let tables = (0..n)
        .map(|g| format!("[{},{}]", 2 * g + 1, 16_777_215 - g))
        .collect::<Vec<_>>()
        .join(",");
    let lists = vec!["[3]"; n].join(",");
    let flat = (0..n)
        .map(|g| (2 * g + 1).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let sc = format!(
        r#"{{"mode":"vllm","groups":[{groups}],"requests":[{{"id":"a","class":"async","num_computed_tokens":32,"block_tables":[{tables}]}}],"invalid_blocks":[{flat}],"invalid_blocks_by_group":[{lists}]}}"#
    );
    let path = temp_file("groups_union.json", &sc);
    let out = run_guarded(
        50 << 10,
        GUARD,
        &["replay", path.to_str().expect("utf-8 path")],
        None,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
    assert_eq!(v["requests"][0]["num_computed_tokens"], 0);
    assert_eq!(
        v["requests"][0]["claimed_blocks"].as_array().map(Vec::len),
        Some(n)
    );
}

/// Mode `safe` with 60,000 groups of five new hits each (7 MB): the resumable boundary once
/// walked every hit for every group (11 s); now linear.
#[test]
fn safe_mode_with_many_groups_is_linear() {
    let n = 60_000usize;
    let groups = vec![r#"{"kind":"full_attention","block_size":16}"#; n].join(",");
    let mut tables = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(5 * n);
    for g in 0..n {
        let base = 6 * g as u64 + 1;
        tables.push(format!(
            "[{}]",
            (base..base + 6)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ));
        ids.extend((base + 1..base + 6).map(|i| i.to_string()));
    }
    let sc = format!(
        r#"{{"mode":"safe","groups":[{groups}],"requests":[{{"id":"a","class":"async","num_computed_tokens":96,"block_tables":[{}]}}],"invalid_blocks":[{}]}}"#,
        tables.join(","),
        ids.join(",")
    );
    let path = temp_file("safe_many_groups.json", &sc);
    let out = run_guarded(
        400 << 10,
        GUARD,
        &["replay", path.to_str().expect("utf-8 path")],
        None,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
    // Earliest new hit at 16 in every group; entry 0 is real everywhere: back to 16.
    assert_eq!(v["requests"][0]["num_computed_tokens"], 16);
    assert_eq!(v["requests"][0]["affected_tokens"], 80);
}

/// An endless input (`/dev/zero`) is cut at the input limit, 256 MiB by default, and is a
/// one-line error with exit 2; so is a huge sparse file, refused before it is read.
#[test]
fn inputs_beyond_the_limit_are_refused() {
    let zero = Path::new("/dev/zero");
    if zero.exists() {
        let out = run_guarded(400 << 10, GUARD, &["replay", "/dev/zero"], None);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert_eq!(
            out.stderr,
            "error: input: larger than the input limit of 268435456 bytes; raise it with --max-input-bytes\n"
        );
        let out = run_guarded(
            30 << 10,
            GUARD,
            &["replay", "--max-input-bytes", "1000000", "-"],
            Some(zero),
        );
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr
                .starts_with("error: input: larger than the input limit of 1000000 bytes"),
            "{}",
            out.stderr
        );
    }
    let sparse = std::env::temp_dir().join(format!("kvsched-sparse-{}.json", std::process::id()));
    let f = std::fs::File::create(&sparse).expect("create sparse file");
    f.set_len(100 << 30).expect("a 100 GiB sparse file");
    drop(f);
    let out = run_guarded(
        30 << 10,
        GUARD,
        &["replay", sparse.to_str().expect("utf-8 path")],
        None,
    );
    let _ = std::fs::remove_file(&sparse);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with("error: input: larger than the input limit"),
        "{}",
        out.stderr
    );
    // The limit is exact and can be raised.
    let doc = temp_file("limit.json", DOC_EXAMPLE);
    let doc = doc.to_str().expect("utf-8 path");
    let n = DOC_EXAMPLE.len().to_string();
    let below = (DOC_EXAMPLE.len() - 1).to_string();
    let ok = run(&["replay", "--max-input-bytes", &n, doc], b"");
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    let out = run(&["replay", "--max-input-bytes", &below, doc], b"");
    assert_bad(
        &out,
        "input",
        "larger than the input limit",
        "one byte over",
    );
    let out = run(
        &["replay", "--max-input-bytes", &below, "-"],
        DOC_EXAMPLE.as_bytes(),
    );
    assert_bad(
        &out,
        "input",
        "larger than the input limit",
        "one byte over, stdin",
    );
    let out = run(&["replay", "--max-input-bytes", "0", doc], b"");
    assert_eq!(out.status.code(), Some(2));
}

/// A closed standard input reads as empty input.
#[test]
fn closed_stdin_is_empty_input() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" replay - <&-"#)
        .arg(BIN)
        .output()
        .expect("run sh");
    assert_bad(&out, "input", "empty input", "closed stdin");
}

/// `--bench N` takes 1 to 1,000,000 runs.
#[test]
fn bench_runs_are_capped() {
    let out = run(
        &["replay", "--bench", "1000001", "-"],
        DOC_EXAMPLE.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("1..=1000000"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// Output that cannot be written is not bad input.

/// Runs `kvsched replay FILE` through `sh -c` with the given redirection of stdout.
fn run_redirected(redirect: &str) -> Output {
    let doc = temp_file("redirect.json", DOC_EXAMPLE);
    Command::new("sh")
        .arg("-c")
        .arg(format!(r#"exec "$0" replay "$1" {redirect}"#))
        .arg(BIN)
        .arg(doc)
        .output()
        .expect("run sh")
}

#[test]
fn closed_stdout_is_an_output_error() {
    let out = run_redirected(">&-");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "error: stdout: closed (the output would be lost)\n"
    );
    // `> /dev/null` is a choice, not an error.
    let out = run_redirected("> /dev/null");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn full_disk_is_an_output_error() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let out = run_redirected("> /dev/full");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: stdout: ") && stderr.matches('\n').count() == 1,
        "{stderr}"
    );
    assert!(stderr.contains("No space left"), "{stderr}");
}

/// A reader that goes away (`| head -c 10`): exit 141, quietly.
#[test]
fn broken_pipe_exits_quietly() {
    // An outcome larger than a pipe's buffer, so the write meets the closed pipe.
    let n = 3_000;
    let requests = (0..n)
        .map(|i| {
            format!(
                r#"{{"id":"request-{i}","class":"async","num_computed_tokens":32,"block_tables":[[{},{}]]}}"#,
                2 * i + 1,
                2 * i + 2
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let sc = sc(G1, &format!("[{requests}]"), r#","invalid_blocks":[]"#);
    let path = temp_file("broken_pipe.json", &sc);
    // kvsched's own status, from inside the pipeline.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"{ "$0" replay "$1"; echo "kvsched=$?" >&2; } | head -c 10 > /dev/null"#)
        .arg(BIN)
        .arg(&path)
        .output()
        .expect("run sh");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.trim_end(), "kvsched=141", "{stderr}");
}
