//! The runtime's claim path (`parallel::recover_sharded`: shard threads, the real claim table,
//! a barrier between claiming and deciding) must give the sequential engine's outcome on every
//! bundled scenario and on random ones (the CLI's `replay --engine runtime` is checked in
//! `tests/cli_replay/`).

use std::path::Path;

use crate::parallel::recover_sharded;
use crate::replay::parse_scenario;
use kvsched::rules::geometry::{BlockId, CacheGroup, Geometry, MambaMode};
use kvsched::rules::recovery::{self, InvalidSet, Mode, Policy, Request, RequestClass};
use proptest::prelude::*;

fn scenario_files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("scenario dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p.to_string_lossy().ends_with(".expected.json")
        })
        .collect();
    v.sort();
    v
}

#[test]
fn claim_path_equals_sequential_on_every_scenario() {
    let files = scenario_files();
    assert!(files.len() >= 10);
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let sc = parse_scenario(&text).expect("parse");
        let want = sc.run();
        for shards in 1..=4 {
            // Repeat: thread interleavings differ from run to run.
            for _ in 0..5 {
                let got = recover_sharded(
                    &sc.geometry,
                    sc.mode,
                    sc.policy,
                    &sc.requests,
                    &sc.invalid,
                    shards,
                );
                assert_eq!(got, want, "{} with {shards} shards", f.display());
            }
        }
    }
}

/// Random scenarios with heavy sharing: a few prefixes of block ids reused across requests.
fn scenario() -> impl Strategy<Value = (Geometry, Mode, Policy, Vec<Request>, Vec<BlockId>)> {
    let groups = prop_oneof![
        Just(vec![CacheGroup::full_attention(4)]),
        Just(vec![
            CacheGroup::full_attention(4),
            CacheGroup::sliding_window(4, 6)
        ]),
        Just(vec![
            CacheGroup::full_attention(2),
            CacheGroup::mamba(4, MambaMode::Align)
        ]),
        Just(vec![
            CacheGroup::full_attention(2),
            CacheGroup::full_attention(4),
            CacheGroup::mamba(8, MambaMode::All)
        ]),
    ];
    (
        groups,
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(
            (any::<bool>(), 0u64..48, 0u64..8, 0usize..3, any::<u64>()),
            0..14,
        ),
        prop::collection::vec(1u64..60, 0..8),
    )
        .prop_map(|(groups, vllm, fail, reqs, invalid)| {
            let geo = Geometry::new(groups, None, 0).expect("geometry");
            let requests = reqs
                .into_iter()
                .enumerate()
                .map(|(i, (sync, p, sched, prefix, salt))| {
                    let nst = if sync { sched.min(p) } else { 0 };
                    let tables = geo
                        .groups()
                        .iter()
                        .enumerate()
                        .map(|(g, grp)| {
                            let n = grp.blocks_for_tokens(p + 4) as usize;
                            (0..n)
                                .map(|k| {
                                    // Shared prefix ids from a small range, private ids above.
                                    if k < 3 + prefix * 2 {
                                        1 + (prefix as u64 * 7 + k as u64 + g as u64 * 3) % 30
                                    } else {
                                        30 + ((salt >> (k % 16)) % 30)
                                    }
                                })
                                .collect()
                        })
                        .collect();
                    Request {
                        id: format!("q{i}"),
                        class: if sync {
                            RequestClass::Sync
                        } else {
                            RequestClass::Async
                        },
                        num_computed_tokens: p,
                        num_scheduled_tokens: nst,
                        block_tables: tables,
                    }
                })
                .collect();
            (
                geo,
                if vllm { Mode::Vllm } else { Mode::Safe },
                if fail {
                    Policy::Fail
                } else {
                    Policy::Recompute
                },
                requests,
                invalid,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    #[test]
    fn claim_path_equals_sequential_on_random_scenarios((geo, mode, policy, requests, invalid) in scenario(), shards in 1usize..5) {
        let invalid = InvalidSet::flat(invalid, &geo);
        let want = recovery::recover(&geo, mode, policy, &requests, &invalid);
        let got = recover_sharded(&geo, mode, policy, &requests, &invalid, shards);
        prop_assert_eq!(got, want);
    }
}
