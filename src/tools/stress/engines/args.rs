//! The parent's reading of the command line: which store the engines share, what it owns,
//! and each engine's arguments (the parent's own, rewritten).

use std::ffi::{OsStr, OsString};

use super::super::config::StressConfig;

/// Flags the parent consumes, each with a value (`--flag V` or `--flag=V`): not passed on.
const PARENT_FLAGS: &[&str] = &[
    "--engines",
    "--redis-restarts",
    "--engine-index",
    "--store",
    "--redis-cluster",
    "--redis-maxmemory",
    "--plot",
];
/// Switches the parent consumes (`--json` is given to every engine anyway).
const PARENT_SWITCHES: &[&str] = &["--json"];

/// Where the engines' KV chunks live (`--store`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// `sim` (the default): the simulated connector, in one process.
    Sim,
    /// `memory`: an in-process tier.
    Memory,
    /// `disk=DIR`: a directory, one process's at a time.
    Disk(String),
    /// `redis`: a server (or with `--redis-cluster`, a cluster) the parent starts and owns.
    Owned,
    /// `redis://…` or `rediss://…`: a server the user runs.
    Url(String),
}

impl Store {
    /// Parses a `--store` value.
    pub fn parse(s: &str) -> Result<Store, String> {
        match s {
            "sim" => Ok(Store::Sim),
            "memory" => Ok(Store::Memory),
            "redis" => Ok(Store::Owned),
            _ if s.starts_with("redis://") || s.starts_with("rediss://") => {
                Ok(Store::Url(s.to_owned()))
            }
            _ => match s.strip_prefix("disk=") {
                Some(dir) if !dir.is_empty() => Ok(Store::Disk(dir.to_owned())),
                _ => Err(format!(
                    "--store: expected sim, memory, disk=DIR, redis or redis://HOST:PORT, got {s:?}"
                )),
            },
        }
    }
}

/// What the parent runs: `engines` children on `store`, restarting its server `restarts`
/// times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Engine processes to run.
    pub engines: u8,
    /// Restarts of the owned server.
    pub restarts: u32,
    /// The store the engines share.
    pub store: Store,
    /// `--redis-cluster N`: the owned server is a cluster of N nodes.
    pub cluster: Option<usize>,
    /// `--redis-maxmemory`: the owned server's memory cap, bytes.
    pub maxmemory: Option<u64>,
    /// `--store` as the user gave it (`None` without one, or for the owned server, whose
    /// URL is known once it runs).
    pub store_arg: Option<String>,
    /// `--mode`, for the parent's own garbage-read check (`safe` unless set).
    pub safe_mode: bool,
}

impl Plan {
    /// The plan for the parsed command line `cfg` and its arguments after `stress`,
    /// `stress_args`; `Err` is the one-line message of a refused combination.
    pub fn of(cfg: &StressConfig, stress_args: &[OsString]) -> Result<Plan, String> {
        let e = &cfg.engines;
        if e.engine_index.is_some() {
            return Err(
                "--engine-index: set by --engines for each engine it runs; leave it out".into(),
            );
        }
        let engines = e.engines.unwrap_or(1);
        let store = match value_of(stress_args, "--store") {
            Some(v) => Store::parse(&v)?,
            None => Store::Sim,
        };
        let cluster = value_of(stress_args, "--redis-cluster")
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| format!("--redis-cluster: expected a node count, got {v:?}"))
            })
            .transpose()?;
        let maxmemory = value_of(stress_args, "--redis-maxmemory")
            .map(|v| parse_size(&v).map_err(|p| format!("--redis-maxmemory: {p}")))
            .transpose()?;
        let one_process = match &store {
            Store::Sim => Some("--store sim is simulated inside one engine"),
            Store::Memory => Some("--store memory lives inside one engine"),
            Store::Disk(_) => Some("a disk tier belongs to one process at a time"),
            Store::Owned | Store::Url(_) => None,
        };
        if let Some(why) = one_process {
            if engines > 1 {
                return Err(format!(
                    "--engines: {why}: nothing to share (use --store redis or --store redis://HOST:PORT)"
                ));
            }
        }
        if e.redis_restarts > 0 && store != Store::Owned {
            return Err(
                "--redis-restarts: restarts only the Redis server kvsched owns (--store redis)"
                    .into(),
            );
        }
        if store != Store::Owned {
            for (flag, given) in [
                ("--redis-cluster", cluster.is_some()),
                ("--redis-maxmemory", maxmemory.is_some()),
            ] {
                if given {
                    return Err(format!(
                        "{flag}: applies to the Redis server kvsched starts (--store redis)"
                    ));
                }
            }
        }
        let store_arg = match &store {
            Store::Owned => None,
            _ => value_of(stress_args, "--store"),
        };
        Ok(Plan {
            engines,
            restarts: e.redis_restarts,
            store,
            cluster,
            maxmemory,
            store_arg,
            safe_mode: cfg.mode == crate::rules::recovery::Mode::Safe,
        })
    }
}

/// The arguments after the `stress` subcommand in `argv` (the program name first).
pub fn stress_args(argv: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let argv: Vec<OsString> = argv.into_iter().skip(1).collect();
    match argv.iter().position(|a| a == "stress") {
        Some(i) => argv[i + 1..].to_vec(),
        None => argv,
    }
}

/// The value of `flag` in `args` (`--flag V` or `--flag=V`; the last one if repeated).
fn value_of(args: &[OsString], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(a) = a.to_str() else { continue };
        if a == flag {
            found = it.next().map(|v| v.to_string_lossy().into_owned());
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_owned());
        }
    }
    found
}

/// Whether `arg` is `flag` or `flag=…` for one of `flags`; `Some(true)` if its value is the
/// next argument.
fn consumed(arg: &OsStr, flags: &[&str]) -> Option<bool> {
    let a = arg.to_str()?;
    flags.iter().find_map(|f| {
        if a == *f {
            Some(true)
        } else {
            a.strip_prefix(f)
                .is_some_and(|r| r.starts_with('='))
                .then_some(false)
        }
    })
}

/// Engine `index`'s arguments: `stress`, the parent's `stress_args` without the parent's own
/// flags, then `--store STORE` (if a store is given), `--engine-index INDEX --json`.
pub fn child_args(stress_args: &[OsString], store: Option<&str>, index: u8) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["stress".into()];
    let mut it = stress_args.iter();
    while let Some(a) = it.next() {
        if let Some(value_follows) = consumed(a, PARENT_FLAGS) {
            if value_follows {
                it.next();
            }
            continue;
        }
        if consumed(a, PARENT_SWITCHES) == Some(true) {
            continue;
        }
        out.push(a.clone());
    }
    if let Some(store) = store {
        out.extend(["--store", store].map(OsString::from));
    }
    out.extend(["--engine-index", &index.to_string(), "--json"].map(OsString::from));
    out
}

/// A byte size as Redis writes one: digits, then optionally `k`/`m`/`g` (powers of 1000) or
/// `kb`/`mb`/`gb` (powers of 1024; `kib`, `mib`, `gib` too), any case.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("expected a size such as 256mb, got {s:?}"))?;
    let mult: u64 = match unit {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" | "kib" => 1 << 10,
        "m" => 1_000_000,
        "mb" | "mib" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?} (k, kb, m, mb, g, gb)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    fn cfg(engines: Option<u8>, restarts: u32) -> StressConfig {
        let mut c = StressConfig::default();
        c.engines.engines = engines;
        c.engines.redis_restarts = restarts;
        c
    }

    #[test]
    fn the_arguments_after_stress_are_the_engines_arguments() {
        let argv = os(&["/bin/kvsched", "stress", "--requests", "5", "--json"]);
        assert_eq!(strs(&stress_args(argv)), ["--requests", "5", "--json"]);
        // Without the subcommand (never from the command line), everything after the program.
        assert_eq!(strs(&stress_args(os(&["k", "--x"]))), ["--x"]);
    }

    #[test]
    fn an_engine_gets_the_parents_arguments_without_the_parents_flags() {
        let args = os(&[
            "--engines",
            "3",
            "--requests=500",
            "--store",
            "redis",
            "--faults",
            "evict=0.05",
            "--redis-restarts=1",
            "--redis-cluster",
            "3",
            "--json",
            "--redis-maxmemory",
            "64mb",
            "--seed",
            "7",
            "--lockstep",
        ]);
        let child = child_args(&args, Some("redis://127.0.0.1:7000,127.0.0.1:7001"), 2);
        assert_eq!(
            strs(&child),
            [
                "stress",
                "--requests=500",
                "--faults",
                "evict=0.05",
                "--seed",
                "7",
                "--lockstep",
                "--store",
                "redis://127.0.0.1:7000,127.0.0.1:7001",
                "--engine-index",
                "2",
                "--json",
            ]
        );
    }

    #[test]
    fn a_flag_that_only_starts_like_a_parent_flag_is_passed_on() {
        // `--storex` is not `--store`; `--engines-foo=1` is not `--engines`.
        let args = os(&["--storex", "1", "--engines-foo=1", "--store=redis://h:1"]);
        assert_eq!(
            strs(&child_args(&args, Some("redis://h:1"), 0)),
            [
                "stress",
                "--storex",
                "1",
                "--engines-foo=1",
                "--store",
                "redis://h:1",
                "--engine-index",
                "0",
                "--json"
            ]
        );
    }

    #[test]
    fn a_non_utf8_argument_is_passed_on_as_it_is() {
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![0x66, 0xff, 0x6f]);
        let args = vec![OsString::from("--seed"), odd.clone()];
        let child = child_args(&args, Some("redis://h:1"), 1);
        assert_eq!(child[2], odd);
    }

    #[test]
    fn the_store_is_read_from_the_arguments() {
        let plan = |args: &[&str], c: StressConfig| Plan::of(&c, &os(args));
        let p = plan(
            &["--store", "redis", "--redis-cluster", "3"],
            cfg(Some(2), 1),
        )
        .unwrap();
        assert_eq!(
            (p.engines, p.restarts, &p.store, p.cluster),
            (2, 1, &Store::Owned, Some(3))
        );
        let p = plan(&["--store=redis://127.0.0.1:6399"], cfg(Some(2), 0)).unwrap();
        assert_eq!(p.store, Store::Url("redis://127.0.0.1:6399".into()));
        assert_eq!(p.store_arg.as_deref(), Some("redis://127.0.0.1:6399"));
        // --redis-restarts alone runs one engine.
        let p = plan(
            &["--store", "redis", "--redis-maxmemory", "64mb"],
            cfg(None, 2),
        )
        .unwrap();
        assert_eq!((p.engines, p.maxmemory), (1, Some(64 << 20)));
        // One engine on an unshared store is allowed; the store is passed on as it is.
        let p = plan(&["--store", "disk=/tmp/x"], cfg(Some(1), 0)).unwrap();
        assert_eq!(p.store_arg.as_deref(), Some("disk=/tmp/x"));
        // Without --store the engines get none (their default).
        let p = plan(&["--requests", "9"], cfg(Some(1), 0)).unwrap();
        assert_eq!((&p.store, p.store_arg.as_deref()), (&Store::Sim, None));
        assert_eq!(
            strs(&child_args(&os(&["--engines", "1"]), None, 0)),
            ["stress", "--engine-index", "0", "--json"]
        );
    }

    #[test]
    fn nothing_to_share_is_refused() {
        let err = |args: &[&str], c: StressConfig| Plan::of(&c, &os(args)).unwrap_err();
        for args in [
            &[][..],
            &["--store", "sim"][..],
            &["--store", "memory"][..],
            &["--store", "disk=/tmp/d"][..],
        ] {
            let e = err(args, cfg(Some(2), 0));
            assert!(
                e.starts_with("--engines: ") && e.contains("nothing to share"),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
        let e = err(&["--store", "redis://127.0.0.1:6399"], cfg(Some(2), 1));
        assert!(e.starts_with("--redis-restarts: "), "{e}");
        let e = err(&["--store", "memory"], cfg(None, 1));
        assert!(e.starts_with("--redis-restarts: "), "{e}");
        let e = err(
            &["--store", "redis://127.0.0.1:6399", "--redis-cluster", "3"],
            cfg(Some(2), 0),
        );
        assert!(e.starts_with("--redis-cluster: "), "{e}");
        let e = err(&["--store", "bogus"], cfg(Some(2), 0));
        assert!(e.starts_with("--store: "), "{e}");
        let mut c = cfg(Some(2), 0);
        c.engines.engine_index = Some(1);
        let e = err(&["--store", "redis"], c);
        assert!(e.starts_with("--engine-index: "), "{e}");
    }

    #[test]
    fn sizes_read_as_redis_reads_them() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2_000_000_000));
        assert_eq!(parse_size("1gib"), Ok(1 << 30));
        assert_eq!(parse_size("5k"), Ok(5000));
        assert!(parse_size("").is_err());
        assert!(parse_size("mb").is_err());
        assert!(parse_size("5tb").is_err());
        assert!(parse_size("99999999999999999999gb").is_err());
        assert!(parse_size("18446744073709551615gb").is_err());
    }
}
