//! The trace reader's tests: lines refused naming line and field, speeds, prompts.

use super::super::trace_reference::cache_served;
use super::*;

fn bundled_path() -> PathBuf {
    // The trace sits in `traces/` at the repository root, above the package.
    let mut dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    loop {
        let f = dir.join("traces/mooncake_conversation_trace.jsonl");
        if f.exists() {
            return f;
        }
        assert!(dir.pop(), "no traces/ above {}", env!("CARGO_MANIFEST_DIR"));
    }
}

fn bundled() -> String {
    std::fs::read_to_string(bundled_path()).expect("read the bundled trace")
}

/// Engine `i` of `--engines N` replays requests `i, i + N, …` of the trace's first
/// `--trace-requests`, and its reference is of those.
#[test]
fn an_engine_of_several_replays_its_share_of_the_trace() {
    let mut cfg = StressConfig::default();
    cfg.trace.trace = Some(bundled_path());
    cfg.trace.trace_requests = 10;
    let all = load(&cfg).expect("load");
    cfg.engines.engine_index = Some(1);
    cfg.engines.engine_count = Some(3);
    let one = load(&cfg).expect("load");
    let (all, one) = (
        all.trace.loaded.expect("loaded"),
        one.trace.loaded.expect("loaded"),
    );
    assert_eq!(*one, [all[1].clone(), all[4].clone(), all[7].clone()]);
    let r = cfg_reference(&cfg);
    assert_eq!(r.requests, 3);
    assert!(r.device_and_tier_lru_share >= r.device_pool_lru_share);
}

/// Without `--duration` a replay lasts until 20 s after its last arrival; a shorter
/// `--duration` replays, and references, only the requests that arrive within it.
#[test]
fn duration_follows_the_trace_or_cuts_its_arrivals() {
    let mut cfg = StressConfig::default();
    cfg.trace.trace = Some(bundled_path());
    cfg.trace.trace_requests = 100;
    let reqs = read(&cfg).expect("read").expect("a trace");
    let last_s = reqs[99].arrival_ms as f64 / 1000.0 / cfg.trace.trace_speed;
    let mut given = cfg.clone();
    follow_trace_duration(&mut given, true).expect("given");
    assert_eq!(given.duration_s, DEFAULT_DURATION_S);
    follow_trace_duration(&mut cfg, false).expect("follows");
    assert!((cfg.duration_s - (last_s + DEFAULT_DURATION_S)).abs() < 1e-9);
    let whole = load(&cfg).expect("load");
    assert_eq!(whole.trace.cut_by_duration, None);
    assert_eq!(cfg_reference(&cfg).requests, 100);
    // Cut at the 40th arrival: the requests before it are replayed and referenced.
    cfg.duration_s = reqs[40].arrival_ms as f64 / 1000.0 / cfg.trace.trace_speed;
    let in_time = reqs
        .iter()
        .filter(|r| arrival(r, cfg.trace.trace_speed) < cfg.duration())
        .count() as u64;
    assert!(in_time > 0 && in_time <= 40, "{in_time}");
    let cut = load(&cfg).expect("load");
    assert_eq!(
        cut.trace.cut_by_duration,
        Some(TraceCut {
            asked: 100,
            in_time
        })
    );
    assert_eq!(cut.requests, in_time);
    let r = cfg_reference(&cfg);
    assert_eq!(r.requests, in_time);
    let (total, _) = cache_served(&reqs[..in_time as usize], None);
    assert_eq!(r.prompt_tokens, total);
}

fn cfg_reference(cfg: &StressConfig) -> TraceReference {
    load(cfg)
        .expect("load")
        .trace
        .trace_reference
        .expect("reference")
}

/// The figures `traces/README.md` states, recomputed from the file.
#[test]
fn the_bundled_trace_has_the_figures_its_readme_states() {
    let reqs = parse(&bundled(), None).expect("the bundled trace parses");
    assert_eq!(reqs.len(), 12_031);
    let share = |cap| {
        let (total, served) = cache_served(&reqs, cap);
        (served as f64 / total as f64 * 1000.0).round() / 10.0
    };
    assert_eq!(share(None), 37.4);
    assert_eq!(share(Some(1_000)), 4.5);
    assert_eq!(share(Some(4_000)), 8.7);
    assert_eq!(share(Some(16_000)), 26.8);
    assert_eq!(share(Some(64_000)), 36.6);
}

#[test]
fn equal_ids_give_equal_tokens_and_the_last_block_is_cut() {
    let a = TraceRequest {
        line: 1,
        arrival_ms: 0,
        input_length: 700,
        output_length: 1,
        hash_ids: vec![5, 9],
    };
    let b = TraceRequest {
        line: 1,
        input_length: 1024,
        hash_ids: vec![5, 8],
        ..a.clone()
    };
    let (ta, tb) = (prompt_tokens(&a), prompt_tokens(&b));
    assert_eq!(ta.len(), 700);
    assert_eq!(tb.len(), 1024);
    assert_eq!(ta[..512], tb[..512]);
    assert_ne!(ta[512..700], tb[512..700]);
}

/// A speed-up outside 0.001–1e6 is refused (`1e-300` was taken, and printed as 300
/// digits in the report's header); the bounds themselves are taken.
#[test]
fn speeds_outside_the_range_are_refused() {
    for bad in ["0", "-1", "1e-300", "0.0009", "1000001", "inf", "NaN", "x"] {
        let e = parse_speed(bad).expect_err(bad);
        assert!(e.contains("[0.001, 1000000]"), "{bad}: {e}");
    }
    for ok in ["0.001", "1", "10", "1e6"] {
        assert!(parse_speed(ok).is_ok(), "{ok}");
    }
}

#[test]
fn bad_lines_are_refused_naming_line_and_field() {
    let cases = [
        ("nope", "line 1: line: not JSON"),
        ("\u{feff}{}", "line 1: line: starts with a UTF-8 byte order mark"),
        ("[1]", "line 1: line: not a JSON object"),
        ("7", "line 1: line: not a JSON object"),
        (r#"{"timestamp": 1e400, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#, "line 1: timestamp: out of range: a number no 64-bit float holds"),
        (r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1e999]}"#, "line 1: hash_ids: out of range"),
        (r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1,]}"#, "line 1: hash_ids: not JSON: "),
        (r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]} x"#, "line 1: line: not JSON: trailing"),
        (r#"{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1], "input_length": 6}"#, "line 1: input_length: given twice"),
        (r#"{"timestamp": 0, "timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1]}"#, "line 1: timestamp: given twice"),
        (r#"{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1], "hash_ids": [2]}"#, "line 1: hash_ids: given twice"),
        (r#"{"input_length": 1, "output_length": 1, "hash_ids": [1]}"#, "line 1: timestamp: missing"),
        (r#"{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#, "line 1: timestamp: -1 is not"),
        (r#"{"timestamp": 1e3, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#, "line 1: timestamp: 1000.0 is written as a float"),
        (r#"{"timestamp": 0, "input_length": 1, "output_length": 2.5, "hash_ids": [1]}"#, "line 1: output_length: 2.5 is not a whole number"),
        (r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}"#, "line 1: input_length: 0 is not"),
        (r#"{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}"#, "line 1: hash_ids: 1 ids for 600 tokens"),
        (r#"{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": ["x"]}"#, "line 1: hash_ids: \"x\" is not"),
        ("{\"timestamp\": 5, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [1]}\n\n{\"timestamp\": 4, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [1]}", "line 3: timestamp: 4 is before"),
    ];
    for (text, want) in cases {
        let e = parse(text, None).expect_err(text).to_string();
        assert!(e.starts_with(want), "{text}: {e}");
    }
    // The requests read hold at most so many block ids in all (2^22): at the cap, read; one
    // past it, refused at the line that passes it.
    let two =
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n";
    let text = two.repeat(3);
    assert_eq!(parse_within(&text, None, 6).expect("at the cap").len(), 3);
    let e = parse_within(&format!("{text}\n{two}"), None, 6).expect_err("past the cap");
    assert_eq!((e.line, e.field), (5, "hash_ids"), "{e}");
    assert!(e.problem.contains("8 block ids, more than 6"), "{e}");
    assert_eq!(
        parse_within(&format!("{text}{two}"), Some(3), 6)
            .expect("limit")
            .len(),
        3
    );
    let ok = r#"{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1]}"#;
    assert_eq!(
        parse(&format!("{ok}\n{ok}\n{ok}"), Some(2))
            .expect("ok")
            .len(),
        2
    );
    // Other fields are skipped, repeated or not; an escaped name is the field it spells.
    let extra = r#"{"session": {"turns": [1, 2]}, "time\u0073tamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1], "session": null}"#;
    assert_eq!(
        parse(extra, None).expect("extra"),
        parse(ok, None).expect("ok")
    );
}
