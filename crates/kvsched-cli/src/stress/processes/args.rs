//! The parent's reading of the command line: which store the engines share, what it owns,
//! and each engine's arguments (the parent's own, rewritten).

use std::ffi::{OsStr, OsString};

use super::super::config::StressConfig;
use super::super::store::StoreSpec;

/// Flags the parent consumes, each with a value (`--flag V` or `--flag=V`): not passed on.
const PARENT_FLAGS: &[&str] = &[
    "--engines",
    "--redis-restarts",
    "--engine-index",
    "--engine-count",
    "--store",
    "--redis-cluster",
    "--redis-maxmemory",
    "--plot",
];
/// Switches the parent consumes (`--json` is given to every engine anyway).
const PARENT_SWITCHES: &[&str] = &["--json", "--store-owned"];

/// What the parent runs: `engines` children on `store`, restarting its server `restarts`
/// times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Engine processes to run.
    pub engines: u8,
    /// Restarts of the owned server.
    pub restarts: u32,
    /// The store the engines share (`--store`).
    pub store: StoreSpec,
    /// `--redis-cluster N`: the owned server is a cluster of N nodes.
    pub cluster: Option<usize>,
    /// `--redis-maxmemory`: the owned server's memory cap, bytes.
    pub maxmemory: Option<u64>,
    /// `--store` as the user wrote it, passed on to the engines (`None` without one, and for
    /// the owned server, whose URL is known once it runs).
    pub store_arg: Option<String>,
    /// Whether the mode is `safe`, for the parent's own garbage-read check.
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
        let one_process = match &cfg.store {
            StoreSpec::Sim => Some("--store sim is simulated inside one engine"),
            StoreSpec::Memory => Some("--store memory lives inside one engine"),
            StoreSpec::Disk(_) => Some("a disk tier belongs to one process at a time"),
            StoreSpec::Redis | StoreSpec::RedisUrl { .. } => None,
        };
        if let Some(why) = one_process {
            if engines > 1 {
                return Err(format!(
                    "--engines: {why}: nothing to share (use --store redis or --store redis://HOST:PORT)"
                ));
            }
        }
        if e.redis_restarts > 0 && cfg.store != StoreSpec::Redis {
            return Err(
                "--redis-restarts: needs --store redis (the Redis server kvsched starts, and so may restart; it never restarts a server given by URL)"
                    .into(),
            );
        }
        Ok(Plan {
            engines,
            restarts: e.redis_restarts,
            store: cfg.store.clone(),
            cluster: cfg.redis_cluster,
            maxmemory: cfg.redis_maxmemory,
            store_arg: match cfg.store {
                StoreSpec::Redis => None,
                _ => value_of(stress_args, "--store"),
            },
            safe_mode: cfg.mode == kvsched::rules::recovery::Mode::Safe,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|a| a.to_string_lossy().into_owned()).collect()
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

    /// The command line as clap reads it, then the parent's plan of it.
    fn plan(args: &[&str]) -> Result<Plan, String> {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            config: StressConfig,
        }
        let argv = std::iter::once("stress").chain(args.iter().copied());
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        Plan::of(&cli.config, &os(args))
    }

    #[test]
    fn one_engine_on_an_unshared_store_gets_it_as_it_is() {
        let p = plan(&["--store", "disk=/tmp/x", "--engines", "1"]).unwrap();
        assert_eq!(p.store_arg.as_deref(), Some("disk=/tmp/x"));
        // Without --store the engines get none (their default).
        let p = plan(&["--requests", "9", "--engines", "1"]).unwrap();
        assert_eq!((&p.store, p.store_arg.as_deref()), (&StoreSpec::Sim, None));
        assert_eq!(
            strs(&child_args(&os(&["--engines", "1"]), None, 0)),
            ["stress", "--engine-index", "0", "--json"]
        );
    }

    #[cfg(feature = "redis")]
    #[test]
    fn the_redis_store_is_read_from_the_command_line() {
        let p = plan(&[
            "--store",
            "redis",
            "--redis-cluster",
            "3",
            "--engines",
            "2",
            "--redis-restarts",
            "1",
        ])
        .unwrap();
        assert_eq!(
            (p.engines, p.restarts, &p.store, p.cluster, p.store_arg),
            (2, 1, &StoreSpec::Redis, Some(3), None)
        );
        let p = plan(&["--store=redis://127.0.0.1:6399", "--engines", "2"]).unwrap();
        assert!(matches!(p.store, StoreSpec::RedisUrl { .. }));
        assert_eq!(p.store_arg.as_deref(), Some("redis://127.0.0.1:6399"));
        // --redis-restarts alone runs one engine.
        let p = plan(&[
            "--store",
            "redis",
            "--redis-maxmemory",
            "64M",
            "--redis-restarts",
            "2",
        ])
        .unwrap();
        assert_eq!((p.engines, p.maxmemory), (1, Some(64 << 20)));
    }

    #[test]
    fn nothing_to_share_is_refused() {
        for args in [
            &["--engines", "2"][..],
            &["--engines", "2", "--store", "sim"][..],
            &["--engines", "2", "--store", "memory"][..],
            &["--engines", "2", "--store", "disk=/tmp/d"][..],
        ] {
            let e = plan(args).unwrap_err();
            assert!(
                e.starts_with("--engines: ") && e.contains("nothing to share"),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
        let e = plan(&["--store", "memory", "--redis-restarts", "1"]).unwrap_err();
        assert!(e.starts_with("--redis-restarts: "), "{e}");
        let e = plan(&["--engines", "1", "--engine-index", "1"]).unwrap_err();
        assert!(e.starts_with("--engine-index: "), "{e}");
        #[cfg(feature = "redis")]
        {
            let e = plan(&["--store", "redis://127.0.0.1:6399", "--redis-restarts", "1"]);
            assert!(e.unwrap_err().starts_with("--redis-restarts: "));
        }
    }
}
