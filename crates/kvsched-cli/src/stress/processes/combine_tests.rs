//! Tests of `combine`.
use super::*;
use crate::stress::report::{Invariants, KvCounts, LoadCounts, Percentiles, RequestCounts};
use crate::stress::{render_json, run_stress, Rate, StressConfig};
use serde_json::json;
use serde_json::Value;

fn plan(engines: u8, restarts: u32, safe: bool) -> Plan {
    Plan {
        engines,
        restarts,
        store: StoreSpec::Redis,
        cluster: None,
        maxmemory: None,
        store_arg: None,
        safe_mode: safe,
    }
}

/// A canned engine report: a typed run with the store counters in its `kv`, as the JSON an
/// engine prints (its settings and figures included).
fn report(submitted: u64, finished: u64, cancelled: u64, from_others: u64, loaded: u64) -> Value {
    let p = |p99: f64| Percentiles {
        p50: 10.0,
        p99,
        max: 900.0,
        count: 7,
        ..Percentiles::default()
    };
    let run = RunReport {
        scheduler: "kvsched",
        requests: RequestCounts {
            submitted,
            finished,
            failed: 0,
            cancelled,
            cancelled_at_shutdown: 0,
        },
        loads: LoadCounts {
            ok: 10,
            failed: 2,
            ..LoadCounts::default()
        },
        tokens_recomputed: 100,
        completions_per_s: 1000.5,
        finished_per_s: 200.0,
        elapsed_s: 2.0 + submitted as f64 / 1000.0,
        step_overhead_us: p(50.0 + submitted as f64),
        submit_to_schedule_us: p(2.0),
        kv: KvCounts {
            chunks_loaded: loaded,
            chunks_loaded_from_others: from_others,
            kv_bytes_loaded: loaded * 4096,
            checksum_failures: 1,
            tier_errors: 3,
            garbage_reads: Some(0),
            reconnects: Some(1),
            connect_failures: Some(2),
            ..KvCounts::default()
        },
        invariants: Invariants {
            ok: true,
            reconciled: true,
            violations: Vec::new(),
        },
        ..RunReport::default()
    };
    let mut v = serde_json::to_value(&run).unwrap();
    v["config"] = json!({"seed": 1, "mode": "safe"});
    v["figures"] = json!({"steps": {"kvsched": {"median": 5}}});
    v
}

fn outcome(index: u8, code: i32, v: &Value) -> EngineOutcome {
    EngineOutcome {
        index,
        exit: Exit {
            code: Some(code),
            signal: None,
        },
        stdout: serde_json::to_vec(v).unwrap(),
        ..EngineOutcome::default()
    }
}

#[test]
fn rows_are_read_and_summed() {
    let (a, b) = (report(100, 90, 10, 40, 50), report(200, 200, 0, 70, 150));
    let c = Combined::of(
        &plan(2, 0, true),
        "redis://127.0.0.1:1",
        None,
        vec![outcome(0, 0, &a), outcome(1, 0, &b)],
        Vec::new(),
    );
    assert_eq!(c.exit_code, 0, "{:?}", c.invariants);
    assert!(c.invariants.ok && c.every_request_accounted);
    let r0 = &c.per_engine[0];
    assert_eq!(
        (
            r0.submitted,
            r0.finished,
            r0.cancelled,
            r0.cross_engine_hits,
            r0.chunks_loaded
        ),
        (100, 90, 10, Some(40), Some(50))
    );
    assert_eq!(
        (r0.tier_errors, r0.reconnects, r0.garbage_reads),
        (Some(3), Some(1), Some(0))
    );
    let s = &c.sum;
    assert_eq!((s.submitted, s.finished, s.cancelled), (300, 290, 10));
    assert_eq!(
        (s.cross_engine_hits, s.chunks_loaded),
        (Some(110), Some(200))
    );
    assert_eq!(s.kv_bytes_loaded, Some(200 * 4096));
    assert_eq!((s.tier_errors, s.checksum_failures), (Some(6), Some(2)));
    assert_eq!(s.completions_per_s, 2001.0);
    assert_eq!(s.step_p99_us, 250.0); // the largest, not a sum
    assert_eq!(c.cross_engine_hit_ratio, Some(110.0 / 200.0));
    // The merged reports: counts and rates summed, percentiles and elapsed the largest,
    // settings and figures left out.
    let t = c.total.as_ref().expect("merged reports");
    assert_eq!(t.requests.submitted, 300);
    assert_eq!(t.loads.failed, 4);
    assert_eq!(t.finished_per_s, 400.0);
    assert_eq!(t.elapsed_s, 2.2);
    assert_eq!(t.step_overhead_us.p99, 250.0);
    assert_eq!(t.step_overhead_us.count, 14);
    assert_eq!(t.kv.reconnects, Some(2));
    assert!(t.invariants.ok);
    let text = c.render_human();
    assert!(text.contains("every request accounted for in every engine (submitted = finished + failed + cancelled): yes"), "{text}");
    assert!(
        text.contains(
            "cross-engine hit ratio: 0.550 (of 200 chunks loaded, the share another engine saved)"
        ),
        "{text}"
    );
    // On the user's server, chunks an earlier run saved count too: the line says so.
    let mut users = plan(2, 0, true);
    users.store = StoreSpec::RedisUrl {
        url: "redis://127.0.0.1:1".into(),
        shown: "redis://127.0.0.1:1".into(),
    };
    let theirs = Combined::of(
        &users,
        "redis://127.0.0.1:1",
        None,
        vec![outcome(0, 0, &a), outcome(1, 0, &b)],
        Vec::new(),
    )
    .render_human();
    assert!(
        theirs.contains("the share another engine or an earlier run on this store saved"),
        "{theirs}"
    );
    let j: Value = serde_json::from_str(&c.render_json()).unwrap();
    assert_eq!(j["total"]["requests"]["submitted"], json!(300));
    assert!(j["total"].get("config").is_none() && j["total"].get("figures").is_none());
    assert_eq!(j["per_engine"][1]["cross_engine_hits"], json!(70));
    assert_eq!(j["sum"]["cross_engine_hits"], json!(110));
    assert_eq!(j["every_request_accounted"], json!(true));
}

#[test]
fn an_engine_whose_requests_do_not_add_up_fails_the_run() {
    let bad = report(100, 80, 10, 0, 0); // 10 requests lost
    let c = Combined::of(
        &plan(2, 0, true),
        "redis://h:1",
        None,
        vec![outcome(0, 0, &report(5, 5, 0, 0, 0)), outcome(1, 0, &bad)],
        Vec::new(),
    );
    assert_eq!(c.exit_code, 1);
    assert!(!c.every_request_accounted && !c.invariants.ok);
    assert!(c.per_engine[0].accounted && !c.per_engine[1].accounted);
    assert_eq!(
        c.violations,
        ["engine 1: submitted 100 ≠ finished 80 + failed 0 + cancelled 10"]
    );
    assert!(c
        .render_human()
        .contains("engine (submitted = finished + failed + cancelled): NO"));
}

#[test]
fn the_worst_engine_sets_the_exit_code() {
    let mut violated = report(10, 10, 0, 0, 0);
    violated["invariants"] = json!({"ok": false, "reconciled": true, "violations": ["pool leak"]});
    let missing = EngineOutcome {
        index: 2,
        exit: Exit {
            code: Some(2),
            signal: None,
        },
        stderr_tail: vec!["error: --store: bad".into()],
        ..EngineOutcome::default()
    };
    let c = Combined::of(
        &plan(3, 0, true),
        "redis://h:1",
        None,
        vec![
            outcome(0, 0, &report(1, 1, 0, 0, 0)),
            outcome(1, 1, &violated),
            missing,
        ],
        Vec::new(),
    );
    assert_eq!(c.exit_code, 2);
    assert!(c
        .invariants
        .violations
        .contains(&"e1: pool leak".to_owned()));
    assert!(c
        .violations
        .contains(&"engine 2: no report (exit code 2): error: --store: bad".to_owned()));
    assert!(!c.sum.report);
    // A signal counts as 1; one violation of the parent's own is 1 too.
    let killed = EngineOutcome {
        index: 0,
        exit: Exit {
            code: None,
            signal: Some(9),
        },
        ..EngineOutcome::default()
    };
    let c = Combined::of(
        &plan(1, 0, true),
        "redis://h:1",
        None,
        vec![killed],
        Vec::new(),
    );
    assert_eq!(c.exit_code, 1);
    assert_eq!(c.violations, ["engine 0: no report (killed by signal 9)"]);
}

#[test]
fn garbage_reads_fail_mode_safe_only() {
    let mut g = report(10, 10, 0, 0, 0);
    g["kv"]["garbage_reads"] = json!(3);
    let safe = Combined::of(
        &plan(1, 0, true),
        "x",
        None,
        vec![outcome(0, 0, &g)],
        Vec::new(),
    );
    assert_eq!(safe.exit_code, 1);
    assert_eq!(safe.violations, ["engine 0: 3 garbage reads in mode safe"]);
    let vllm = Combined::of(
        &plan(1, 0, false),
        "x",
        None,
        vec![outcome(0, 0, &g)],
        Vec::new(),
    );
    assert_eq!(vllm.exit_code, 0);
    assert_eq!(vllm.sum.garbage_reads, Some(3));
}

#[test]
fn restarts_that_did_not_happen_are_a_violation() {
    let one = RestartEvent {
        at_s: 1.5,
        node: "127.0.0.1:7".into(),
        down_ms: 12.0,
    };
    let r = report(10, 10, 0, 0, 0);
    let c = Combined::of(
        &plan(1, 2, true),
        "x",
        None,
        vec![outcome(0, 0, &r)],
        vec![one.clone()],
    );
    assert_eq!(c.exit_code, 1);
    assert_eq!((c.redis_restarts.requested, c.redis_restarts.done), (2, 1));
    let c = Combined::of(
        &plan(1, 1, true),
        "x",
        None,
        vec![outcome(0, 0, &r)],
        vec![one],
    );
    assert_eq!(c.exit_code, 0);
    assert!(c
        .render_human()
        .contains("restart 1 at 1.50 s: 127.0.0.1:7 back after 12.0 ms"));
}

/// Real engine reports (two in-process runs as engines 0 and 1 would make): the row
/// reads their keys, and each engine's ids carry its prefix.
#[test]
fn real_reports_combine() {
    let run = |i: u8| {
        let mut cfg = StressConfig {
            requests: 60,
            rate: Rate::Max,
            live: 16,
            model_us: 0,
            ..StressConfig::default()
        };
        cfg.engines.engine_index = Some(i);
        let r = run_stress(&cfg).expect("stress");
        serde_json::from_str::<Value>(&render_json(&r)).expect("json")
    };
    let (a, b) = (run(0), run(1));
    assert_eq!(a["config"]["engine_index"], json!(0));
    let c = Combined::of(
        &plan(2, 0, true),
        "x",
        None,
        vec![outcome(0, 0, &a), outcome(1, 0, &b)],
        Vec::new(),
    );
    assert_eq!(c.exit_code, 0, "{:?}", c.invariants);
    assert_eq!(c.sum.submitted, 120);
    assert_eq!(c.sum.finished + c.sum.failed + c.sum.cancelled, 120);
    assert_eq!(
        c.per_engine[1].tokens_recomputed,
        b["tokens_recomputed"].as_u64().unwrap()
    );
    assert!(c
        .per_engine
        .iter()
        .all(|r| r.accounted && r.invariants_ok && r.step_p99_us > 0.0));
    // The store counters come from each report's `kv` object: the sim store verifies
    // (no garbage in mode safe) and has no connections.
    for (row, v) in c.per_engine.iter().zip([&a, &b]) {
        assert_eq!(row.garbage_reads, Some(0));
        assert_eq!(row.chunks_loaded, v["kv"]["chunks_loaded"].as_u64());
        assert_eq!(row.kv_bytes_loaded, v["kv"]["kv_bytes_loaded"].as_u64());
        assert_eq!((row.reconnects, row.connect_failures), (None, None));
    }
}

/// The merged report keeps each engine's violations under its prefix, sums an optional
/// counter over the engines that have one, and a report of the wrong shape is the parent's
/// violation, not a silent zero row.
#[test]
fn merged_reports_keep_each_engine_and_refuse_a_wrong_shape() {
    let mut a = report(10, 10, 0, 0, 0);
    a["invariants"] = json!({"ok": false, "reconciled": true, "violations": ["pool leak"]});
    a["kv"]["reconnects"] = Value::Null;
    let b = report(20, 20, 0, 0, 0);
    let c = Combined::of(
        &plan(3, 0, true),
        "x",
        None,
        vec![
            outcome(0, 1, &a),
            outcome(1, 0, &b),
            outcome(2, 0, &json!({"requests": {"submitted": 5}})),
        ],
        Vec::new(),
    );
    let t = c.total.as_ref().expect("merged reports");
    assert_eq!(t.invariants.violations, ["e0: pool leak"]);
    assert!(!t.invariants.ok && t.invariants.reconciled);
    assert_eq!(t.kv.reconnects, Some(1)); // engine 1's only
    assert_eq!(t.requests.submitted, 30); // engine 2's is not a report
    assert!(!c.per_engine[2].report && c.per_engine[2].submitted == 0);
    assert!(
        c.violations
            .iter()
            .any(|v| v.starts_with("engine 2: its report is not a stress report (missing field")),
        "{:?}",
        c.violations
    );
    assert_eq!(c.exit_code, 1);
}

/// The human report says where every engine's prompt tokens came from (the merged
/// `prompt_tokens`) and, on a trace, what a prefix cache could serve of all their requests.
#[test]
fn the_human_report_splits_the_prompt_tokens_and_gives_the_trace_reference() {
    let tokens = |device: u64, tier: u64, computed: u64| {
        json!({"requests": 5, "total": device + tier + computed, "device_hit": device,
               "tier_hit": tier, "computed": computed, "computed_after_failed_load": 10})
    };
    let (mut a, mut b) = (report(5, 5, 0, 0, 0), report(5, 5, 0, 0, 0));
    a["prompt_tokens"] = tokens(100, 200, 700);
    b["prompt_tokens"] = tokens(300, 400, 2300);
    let mut c = Combined::of(
        &plan(2, 0, true),
        "x",
        None,
        vec![outcome(0, 0, &a), outcome(1, 0, &b)],
        Vec::new(),
    );
    // 4,000 tokens: device 400 (10.0%), tier 600 (15.0%), computed 3,000 (75.0%), 20 of
    // them after a failed load (0.5%).
    let text = c.render_human();
    for line in [
        "prompt tokens of the 10 finished requests of every engine, by source\n",
        "  prompt tokens                 4,000\n",
        "  device prefix cache             400   10.0%\n",
        "  tier (loaded)                   600   15.0%\n",
        "  computed                      3,000   75.0%\n",
        "  of which after a failed load     20    0.5%\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("reference"), "{text}");
    // Served 1,000 of 4,000 (25.0%) against an unbounded 50.0%: 50% of it.
    let mut cfg = StressConfig::default();
    cfg.trace.trace = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../traces/mooncake_conversation_trace.jsonl"),
    );
    cfg.trace.trace_requests = 10;
    let mut reference = crate::stress::trace::load(&cfg)
        .expect("the bundled trace")
        .trace
        .trace_reference
        .expect("a reference");
    reference.infinite_cache_share = 0.5;
    c.trace_reference = Some(reference);
    let text = c.render_human();
    assert!(text.contains("reference, the trace's 10 requests of every engine on its 512-token blocks: a prefix cache would serve 50.0% if unbounded; the engines served 25.0% from cache, 50% of the unbounded share"), "{text}");
    let j: Value = serde_json::from_str(&c.render_json()).expect("json");
    assert_eq!(j["trace_reference"]["requests"], json!(10));
}
