//! Bad inputs (exit 2, one line naming the field and the problem) and inputs accepted at
//! their edges (docs/replay.md#scenario-format).

use super::common::{assert_bad, group, request, run, sc, text, utf16, G1, G2, R1, REPORT};

/// (what, input, field, problem)
pub fn bad_inputs() -> Vec<(&'static str, Vec<u8>, &'static str, &'static str)> {
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
