//! A caller misusing the data plane directly: load jobs that disagree with themselves,
//! saves naming groups, entries and blocks that do not exist, KV memory accessed out of
//! range. Library code answers with typed errors, failed blocks or counts, never a panic.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery};
use kvsched::kv::{
    HostKvMemory, KvLayout, KvMemory, MemoryTier, TierConnector, TierConnectorConfig,
};
use kvsched::{BlockRef, CacheGroup, MambaMode};

fn groups() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(12),
        CacheGroup::sliding_window(8, 20),
        CacheGroup::mamba(24, MambaMode::Align),
    ]
}

fn connector(pool: usize) -> (Arc<dyn KvMemory>, Arc<TierConnector>) {
    let g = groups();
    let mem: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout(&g), pool).unwrap());
    let cfg = TierConnectorConfig::default()
        .with_groups(g)
        .with_probe_on_miss(false);
    let tc = Arc::new(
        TierConnector::new(Arc::new(MemoryTier::new(1 << 24, 2)), Arc::clone(&mem), cfg).unwrap(),
    );
    (mem, tc)
}

fn b(id: u32) -> BlockRef {
    BlockRef {
        id: id as _,
        generation: 1,
    }
}

#[test]
fn kv_memory_out_of_range_is_a_typed_error() {
    let g = groups();
    let mem = HostKvMemory::new(layout(&g), 8).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        mem.write(0, 8, 0, &[1; 16]).is_err(),
        "block past the memory"
    );
    assert!(mem.write(0, u32::MAX as _, 0, &[1; 16]).is_err());
    assert!(
        mem.write(3, 1, 0, &[1; 16]).is_err(),
        "group past the layout"
    );
    assert!(
        mem.write(0, 1, 12 * 16 - 8, &[1; 16]).is_err(),
        "range past the block"
    );
    assert!(mem.write(0, 1, usize::MAX, &[1; 16]).is_err());
    assert!(mem.read(0, 1, usize::MAX - 3, &mut buf).is_err());
    assert!(
        mem.read(2, 1, 8, &mut buf).is_err(),
        "a Mamba state is 16 bytes"
    );
    assert!(mem.poison(9, 1).is_err());
    assert!(KvLayout::new(vec![]).is_err());
    assert!(KvLayout::new(vec![0]).is_err());
    assert!(KvLayout::for_groups(&g, usize::MAX, 1).is_err());
    assert!(HostKvMemory::new(KvLayout::new(vec![1 << 40]).unwrap(), 1 << 40).is_err());
    mem.read(0, 0, 0, &mut buf).unwrap();
    assert_eq!(
        buf,
        [kvsched::kv::POISON_BYTE; 16],
        "the null block reads as poison"
    );
}

/// Jobs whose fields disagree: more or fewer groups than configured, tables shorter than
/// the range, start past end, a range past the prompt, ids past the memory, block sizes that
/// are not the configuration's. Each is a failed (or empty) load, not a panic, and never
/// writes outside its job's own destinations.
#[test]
fn inconsistent_load_jobs_fail_without_panicking() {
    let (mem, tc) = connector(64);
    let toks: Vec<u32> = (0..200).collect();
    let t = |n: u32, off: u32| (0..n).map(|i| b(off + i)).collect::<Vec<_>>();
    let jobs = vec![
        LoadJob::new(
            "a",
            &toks,
            0,
            96,
            vec![t(8, 1), t(12, 10), t(4, 30)],
            vec![12, 8, 24],
        ),
        LoadJob::new("b", &toks, 0, 96, vec![t(8, 1)], vec![12]),
        LoadJob::new(
            "c",
            &toks,
            0,
            96,
            vec![t(8, 1), t(12, 10), t(4, 30), t(4, 40), t(4, 50)],
            vec![12, 8, 24, 24, 24],
        ),
        LoadJob::new(
            "d",
            &toks,
            0,
            96,
            vec![t(2, 1), t(1, 10), t(0, 30)],
            vec![12, 8, 24],
        ),
        LoadJob::new(
            "e",
            &toks,
            96,
            24,
            vec![t(8, 1), t(12, 10), t(4, 30)],
            vec![12, 8, 24],
        ),
        LoadJob::new(
            "f",
            &toks,
            0,
            10_000,
            vec![t(8, 1), t(12, 10), t(4, 30)],
            vec![12, 8, 24],
        ),
        LoadJob::new(
            "g",
            &toks,
            0,
            96,
            vec![t(8, 1000), t(12, 2000), t(4, 3000)],
            vec![12, 8, 24],
        ),
        LoadJob::new(
            "h",
            &toks,
            0,
            96,
            vec![t(8, 1), t(12, 10), t(4, 30)],
            vec![0, 0, 0],
        ),
        LoadJob::new(
            "i",
            &toks,
            0,
            96,
            vec![t(8, 1), t(12, 10), t(4, 30)],
            vec![5, 7],
        ),
        LoadJob::new(
            "j",
            &toks[..3],
            0,
            96,
            vec![t(8, 1), t(12, 10), t(4, 30)],
            vec![12, 8, 24],
        ),
        LoadJob::new(
            "k",
            &[],
            u64::MAX - 1,
            u64::MAX,
            vec![vec![], vec![], vec![]],
            vec![12, 8, 24],
        ),
    ];
    for job in &jobs {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tc.load(job)));
        let r = r.unwrap_or_else(|_| panic!("load of job {} panicked", job.request));
        if let LoadResult::Failed(bad) = r {
            let own: Vec<_> = job.block_tables.iter().flatten().copied().collect();
            for x in bad.into_flat() {
                assert!(
                    own.contains(&x),
                    "job {} reported {x:?}, not one of its blocks",
                    job.request
                );
            }
        }
    }
    // Nothing was stored: every block the jobs named still reads as poison.
    let mut buf = [0u8; 16];
    for id in 1..64 {
        for g in 0..3 {
            if mem.read(g, id, 0, &mut buf).is_ok() {
                assert_eq!(
                    buf,
                    [kvsched::kv::POISON_BYTE; 16],
                    "block {id} group {g} written by a load of nothing"
                );
            }
        }
    }
}

#[test]
fn saves_naming_nothing_real_are_refused_quietly() {
    let (_mem, tc) = connector(64);
    let toks: Vec<u32> = (0..100).collect();
    let bad = [
        (0usize, 0usize, 1 << 30),
        (7, 0, 1),
        (0, 1000, 1),
        (0, usize::MAX - 1, 1),
        (2, 3, 0),
        (1, 0, 63),
        (1, 0, 64),
    ];
    for t in bad {
        let _ = tc.save_blocks(&toks, &[t]);
    }
    let _ = tc.save_blocks(&[], &bad);
    assert!(tc.store_now(&toks, 9, 0, &[1; 16]).is_err());
    let _ = tc.store_now(&toks, 0, 1000, &[1; 16]);
    let _ = tc.store_now(&toks, 0, 0, &[]);
    let _ = tc.store_now(&toks, 0, 0, &vec![1; 1 << 20]);
    assert!(tc.flush_for(Duration::from_secs(5)));
    // A lookup asked about a prompt with nothing stored, or claiming more local tokens
    // than the prompt has, offers nothing past the prompt.
    for local in [0, 99, 100, 5000, u64::MAX] {
        let r = tc.lookup(LookupQuery {
            request: "q",
            prompt: &toks,
            local_tokens: local,
            prepared: None,
        });
        assert!(
            local.saturating_add(r.external_tokens) <= toks.len() as u64 || r.external_tokens == 0,
            "{r:?}"
        );
    }
    let _ = tc.prefetch(&[]);
    let _ = tc.prepare("x", &[]);
    let _ = tc.lookup(LookupQuery {
        request: "",
        prompt: &[],
        local_tokens: 0,
        prepared: None,
    });
}

/// An entry index of `usize::MAX` in `save_blocks` names no full block and is skipped; the
/// call's real block is queued. (Counting the keys to derive as `max + 1` overflowed: a
/// panic in a debug build, and in a release build 0 keys, every block of the group skipped.)
#[test]
fn save_blocks_with_the_largest_index_keeps_the_real_blocks() {
    let g = groups();
    let mem: Arc<dyn KvMemory> = Arc::new(HostKvMemory::new(layout(&g), 64).unwrap());
    let toks: Vec<u32> = (0..100).collect();
    for pos in 0..12 {
        mem.write(0, 5, pos * 16, &[pos as u8; 16]).unwrap();
    }
    let cfg = TierConnectorConfig::default()
        .with_groups(g)
        .with_probe_on_miss(false);
    let tc = TierConnector::new(Arc::new(MemoryTier::new(1 << 24, 2)), mem, cfg).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tc.save_blocks(&toks, &[(0, 0, 5), (0, usize::MAX, 6)])
    }));
    let queued = r.expect("save_blocks panicked on an entry index of usize::MAX");
    assert_eq!(
        queued, 1,
        "the real block (group 0, entry 0) was not queued"
    );
}

/// `save_step` and `completed_prompt_blocks` given a real plan's request with the wrong
/// prompt, or groups that are not the runtime's: no panic, and nothing saved that the step
/// did not complete.
#[test]
fn save_step_with_the_wrong_prompt_or_groups() {
    let g = groups();
    let pool = 256;
    let mut eng = Engine::new(g.clone(), pool).memory_tier(0.0);
    let mut rt = builder(&g, pool).build().unwrap();
    eng.submit(&rt, "p", prompt(0, 0, 1, 100), 3);
    let tc = eng.tier_conn.clone().unwrap();
    let mut steps = 0;
    while rt.live() > 0 && steps < 100 {
        steps += 1;
        let plan = eng.step(&mut rt);
        for s in &plan.scheduled {
            let long: Vec<u32> = (0..100_000).collect();
            for p in [&[][..], &[1, 2, 3][..], &long[..]] {
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tc.save_step(p, s)));
                let queued = r.unwrap_or_else(|_| {
                    panic!("save_step panicked on a prompt of {} tokens", p.len())
                });
                if p.len() < 8 {
                    assert_eq!(queued, 0, "a prompt with no full block queued a save");
                }
            }
            for (groups, len) in [
                (vec![CacheGroup::full_attention(16)], 100usize),
                (vec![], 100),
                (g.clone(), usize::MAX),
                (vec![CacheGroup::full_attention(1); 5], 100),
            ] {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    kvsched::kv::completed_prompt_blocks(&groups, len, s)
                }));
                assert!(
                    r.is_ok(),
                    "completed_prompt_blocks panicked for {groups:?}, {len}"
                );
            }
        }
    }
    assert!(tc.flush_for(Duration::from_secs(5)));
    rt.shutdown();
}
