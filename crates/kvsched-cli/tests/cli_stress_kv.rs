//! `kvsched stress` on real KV bytes: the default run moves and verifies them, `--verify off`
//! moves them unread, the memory and disk stores fill from what the engine saves, and store
//! faults are recovered and reported.

mod stress_common;
use stress_common::*;

#[test]
fn the_default_run_moves_and_verifies_real_bytes() {
    // The sim store, warmed to --hit-ratio before each submit: loads write verified chunks
    // into KV memory, every read is checked, computed prompt blocks are saved; mode safe, so
    // no garbage is read in a step whose output is kept — by kvsched or the baseline, which
    // runs the same engine and checks.
    let v = json_of(&small(&["--json", "--baseline", "mutex"]));
    for run in [&v, get(&v, "baseline")] {
        for k in [
            "kv_bytes_loaded",
            "kv_bytes_verified",
            "kv_bytes_saved",
            "chunks_loaded",
            "chunks_warmed",
            "units_read",
        ] {
            assert!(count(run, &format!("kv.{k}")) > 0, "kv.{k}: {run}");
        }
        assert_eq!(count(run, "kv.garbage_reads"), 0, "{run}");
        // A loaded chunk is a whole block of KV: 16 tokens × 16 bytes in the dense preset.
        assert_eq!(
            count(run, "kv.kv_bytes_loaded"),
            count(run, "kv.chunks_loaded") * 256,
            "{run}"
        );
    }
    let figures = get(&v, "figures");
    // Every figure is keyed by its value's path in a run: the value there is the figure's.
    for (key, f) in figures.as_object().expect("figures") {
        let at = key.split('.').fold(&v, |v, k| &v[k]);
        match (at.as_f64(), f["kvsched"]["median"].as_f64()) {
            (Some(a), Some(m)) => assert!(
                (a - m).abs() <= 1e-6 * a.abs().max(1.0),
                "figures[{key}] is {m}, the run's {key} is {a}"
            ),
            (None, None) => {}
            (a, m) => panic!("figures[{key}] is {m:?}, the run's {key} is {a:?} ({at})"),
        }
    }
    for key in [
        "kv.kv_bytes_loaded",
        "kv.garbage_reads",
        "kv.checksum_failures",
    ] {
        assert_eq!(figures[key]["section"], "KV bytes", "{key}");
        assert!(figures[key]["better"].is_null(), "{key}: a count");
    }
    assert_eq!(get(&v, "config.store"), "sim");
    assert_eq!(get(&v, "config.kv_bytes_per_token"), 16);
    assert_eq!(get(&v, "config.mamba_state_bytes"), 64);
    assert_eq!(get(&v, "config.verify"), "on");
}

#[test]
fn the_default_workload_loads_its_own_prefixes_back_from_the_tier() {
    // The default workload, scaled down for a debug build: more shared prefixes than the
    // device pool holds and nothing warmed, so every chunk loaded is one this run saved
    // before the pool let its prefix go.
    let out = stress(&[
        "--json",
        "--requests",
        "1500",
        "--rate",
        "3000",
        "--model-us",
        "50",
        "--duration",
        "60",
        "--prefixes",
        "64",
        "--pool-blocks",
        "600",
    ]);
    let v = json_of(&out);
    assert_eq!(count(&v, "kv.chunks_warmed"), 0, "{v}");
    assert!(count(&v, "kv.chunks_loaded") > 0, "{v}");
    assert!(count(&v, "prompt_tokens.tier_hit") > 0, "{v}");
    assert_eq!(count(&v, "kv.garbage_reads"), 0, "{v}");
    assert_eq!(get(&v, "config.hit_ratio"), 0.0);
    assert_eq!(get(&v, "config.prefixes"), 64);
}

#[test]
fn the_human_report_has_a_kv_bytes_section() {
    let out = small(&["--failure-rate", "0.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for needle in [
        "KV bytes: store sim (1G), warmed to --hit-ratio 0.75",
        "\nKV bytes\n",
        "bytes loaded into KV memory",
        "bytes saved to the store",
        "bytes verified",
        "garbage reads, output kept",
        "garbage reads, output discarded",
        "checksum failures",
        "· verified: every read unit",
        "· warming (--hit-ratio 0.75)",
        "outside schedule() + update()",
        "· 0 in every run:",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let kept = text
        .lines()
        .find(|l| l.trim_start().starts_with("garbage reads, output kept"))
        .expect("garbage row");
    assert!(kept.trim_end().ends_with(" 0"), "{kept}");
}

#[test]
fn verify_off_moves_the_bytes_without_reading_them() {
    let v = json_of(&small(&["--json", "--verify", "off"]));
    assert!(count(&v, "kv.kv_bytes_loaded") > 0, "{v}");
    assert!(count(&v, "kv.kv_bytes_written") > 0, "{v}");
    assert_eq!(count(&v, "kv.kv_bytes_verified"), 0, "{v}");
    assert_eq!(count(&v, "kv.units_read"), 0, "{v}");
    for k in KV_GARBAGE {
        assert!(get(&v, &format!("kv.{k}")).is_null(), "kv.{k}: {v}");
    }
    assert_eq!(get(&v, "config.verify"), "off");
    assert_eq!(get(&v, "invariants.ok"), &Value::Bool(true), "{v}");
    // The sim store is no Redis: no Redis traffic to report.
    assert!(get(&v, "kv.redis").is_null(), "{v}");
}

#[test]
fn the_memory_store_starts_empty_and_fills_from_what_the_engine_saves() {
    // A pool this small keeps few prefixes cached, so later requests of a shared prefix load
    // what earlier ones saved.
    let v = json_of(&small(&[
        "--json",
        "--store",
        "memory",
        "--store-capacity",
        "64M",
        "--pool-blocks",
        "300",
        "--prefix-share",
        "0.9",
        "--seed",
        "7",
    ]));
    assert_eq!(get(&v, "config.store"), "memory");
    assert_eq!(get(&v, "config.store_capacity"), 64 << 20);
    assert_eq!(
        count(&v, "kv.chunks_warmed"),
        0,
        "a real store is not warmed: {v}"
    );
    assert!(count(&v, "kv.chunks_saved") > 0, "{v}");
    assert!(count(&v, "kv.kv_bytes_loaded") > 0, "{v}");
    assert_eq!(count(&v, "kv.garbage_reads"), 0, "{v}");
    assert_eq!(count(&v, "kv.chunks_loaded_from_others"), 0, "one run: {v}");
}

/// A disk run with the store faults: `kvsched stress --store disk=DIR` and the fault mix.
fn disk_run(dir: &std::path::Path) -> Value {
    let store = format!("disk={}", dir.display());
    let out = stress_guarded(
        &[
            "--json",
            "--store",
            &store,
            "--faults",
            "corrupt=0.02,truncate=0.01,evict=0.02,slow=0.01",
            // Prefixes shared by many requests, a pool holding few of them: later requests
            // load what earlier ones saved. Seed 7's shared blocks meet every fault.
            "--requests",
            "600",
            "--rate",
            "1000",
            "--pool-blocks",
            "300",
            "--prompt-tokens",
            "512",
            "--prefix-share",
            "0.9",
            "--prefixes",
            "16",
            "--output-tokens",
            "4",
            "--model-us",
            "50",
            "--duration",
            "60",
            "--seed",
            "7",
        ],
        Duration::from_secs(300),
    );
    json_of(&out)
}

#[test]
fn a_faulty_disk_store_is_recovered_and_a_second_run_loads_what_the_first_saved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = disk_run(dir.path());
    assert_eq!(get(&first, "invariants.ok"), &Value::Bool(true), "{first}");
    assert_eq!(count(&first, "kv.garbage_reads"), 0, "{first}");
    for k in [
        "kv_bytes_loaded",
        "checksum_failures",
        "missing_chunks",
        "chunks_saved",
    ] {
        assert!(count(&first, &format!("kv.{k}")) > 0, "kv.{k}: {first}");
    }
    for k in ["corrupt", "truncate", "evict"] {
        assert!(
            count(&first, &format!("faults_injected.{k}")) > 0,
            "faults_injected.{k}: {first}"
        );
    }
    assert_eq!(count(&first, "kv.chunks_loaded_from_others"), 0, "{first}");
    assert_eq!(
        get(&first, "config.load_deadline_ms"),
        20,
        "slow faults set a deadline"
    );
    assert!(
        dir.path().join("kvsched").is_dir(),
        "each scheduler has its own directory"
    );
    // A new process on the same directory: its lookups miss, probe the disk in the background,
    // and later requests load, verified, what the first run saved.
    let second = disk_run(dir.path());
    assert_eq!(
        get(&second, "invariants.ok"),
        &Value::Bool(true),
        "{second}"
    );
    assert_eq!(count(&second, "kv.garbage_reads"), 0, "{second}");
    assert!(
        count(&second, "kv.chunks_loaded_from_others") > 0,
        "{second}"
    );
}

#[test]
fn the_human_report_says_what_each_store_fault_caused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("disk={}", dir.path().display());
    let out = small(&[
        "--store",
        &store,
        "--faults",
        "corrupt=0.05,evict=0.05",
        "--pool-blocks",
        "300",
        "--prefix-share",
        "0.9",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for needle in [
        &format!("KV bytes: store {store} (1G) ·"),
        "faults: corrupt=0.05,evict=0.05",
        "corrupt=0.05: a stored chunk gets one bit flipped at rest",
        "evict=0.05: a chunk is deleted between lookup and load",
        "stored chunks damaged;",
        "chunks deleted after their lookup;",
        "· store disk=",
        "kvsched/ and mutex/",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// A store directory whose name holds a line break: the report writes it escaped, so the
/// name can neither split a line of the report nor start one of its own.
#[test]
fn a_line_break_in_the_store_path_stays_in_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let odd = dir.path().join("kv\nFORGED: invariant violated");
    let store = format!("disk={}", odd.display());
    let out = small(&["--store", &store]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("FORGED")),
        "a line of the report starts with the path's tail:\n{text}"
    );
    assert!(
        text.contains("kv\\nFORGED: invariant violated"),
        "the path is shown escaped:\n{text}"
    );
}

#[test]
fn bad_store_values_exit_2_with_one_line() {
    for (args, flag, needle) in [
        (vec!["--store", "ssd"], "--store", "unknown store `ssd`"),
        (vec!["--store", "disk="], "--store", "empty"),
        (vec!["--store", "disk"], "--store", "disk=DIR"),
        (
            vec!["--store-capacity", "0"],
            "--store-capacity",
            "1M to 16T",
        ),
        (
            vec!["--store-capacity", "2P"],
            "--store-capacity",
            "1M to 16T",
        ),
        (
            vec!["--store-capacity", "-1G"],
            "--store-capacity",
            "1M to 16T",
        ),
        (
            vec!["--kv-bytes-per-token", "0"],
            "--kv-bytes-per-token",
            "from 1 to 65536",
        ),
        (
            vec!["--mamba-state-bytes", "0"],
            "--mamba-state-bytes",
            "from 1 to 1048576",
        ),
        (
            vec!["--mamba-state-bytes", "-4"],
            "--mamba-state-bytes",
            "from 1 to 1048576",
        ),
        (vec!["--verify", "maybe"], "--verify", "on or off"),
        (
            vec!["--redis-cluster", "3"],
            "--redis-cluster",
            "only with --store redis",
        ),
        (
            vec!["--redis-maxmemory", "64M"],
            "--redis-maxmemory",
            "only with --store redis",
        ),
        (vec!["--redis-cluster", "2"], "--redis-cluster", "3 to 16"),
        (
            vec!["--pool-blocks", "16777216", "--kv-bytes-per-token", "4096"],
            "--pool-blocks",
            "cap",
        ),
    ] {
        assert_refused(&args, flag, needle);
    }
    // A store directory that cannot be created.
    assert_refused(
        &[
            "--store",
            "disk=/proc/kvsched-no-such-dir",
            "--requests",
            "10",
        ],
        "--store",
        "cannot create",
    );
    #[cfg(not(feature = "redis"))]
    for store in ["redis", "redis://127.0.0.1:6379"] {
        assert_refused(&["--store", store], "--store", "--features redis");
    }
}

#[test]
fn store_faults_need_a_store_they_can_damage() {
    for (faults, needle) in [
        (
            "corrupt=0.1",
            "use them with --store memory, disk=DIR or redis",
        ),
        (
            "slow=0.1,panic=0.1",
            "the sim store has simulated damage instead",
        ),
        ("evict=2", "from 0 to 1"),
        ("truncate=-0.1", "from 0 to 1"),
        ("rot=0.1", "unknown fault `rot`"),
    ] {
        assert_refused(&["--faults", faults], "--faults", needle);
    }
    // On a real store they run.
    let v = json_of(&small(&[
        "--json",
        "--store",
        "memory",
        "--faults",
        "evict=0.5",
        "--pool-blocks",
        "300",
        "--prefix-share",
        "0.9",
        "--seed",
        "7",
    ]));
    assert_eq!(count(&v, "kv.garbage_reads"), 0, "{v}");
    assert_eq!(get(&v, "config.faults.evict"), 0.5);
}
