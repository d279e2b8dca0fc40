//! Mode `vllm`'s step order (docs/runtime.md, "The step"): the running requests first, then
//! the waiting ones admitted only while the step's token budget lasts, each into this step. A
//! sync loader's destinations enter the prefix cache as it is admitted, so a request admitted
//! after it in the same step shares them (vLLM's caching) — and since a loader is never left
//! out of the step that admitted it, no request is ever scheduled onto destinations whose load
//! has not run. Mode `safe` keeps admitting before it schedules.
//!
//! Both properties are checked on every plan of a workload whose token budget is spent by the
//! requests before each loader: the blocks a scheduled request reads (its entries below its
//! computed length) are blocks an earlier step wrote, or destinations of a sync load of the
//! same plan. (Planted bug `vllm-admits-before-schedule` restores the old order in mode
//! `vllm`: a loader the budget leaves out keeps its destinations cached, and a sharer reads
//! them before its load ran.)

use std::collections::HashSet;
use std::sync::Arc;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::rules::geometry::CacheGroup;
use kvsched::rules::recovery::Mode;
use kvsched::runtime::route::shard_of;
use kvsched::{BlockRef, Runtime, Settings, StepOutput, SubmitRequest};

/// Offers a synchronous load of everything past the local hit, up to 96 tokens, for prompts
/// starting with token 7; never fails.
struct SyncStore;

impl KvConnector for SyncStore {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if q.prompt.first() != Some(&7) {
            return LookupResult::default();
        }
        LookupResult {
            external_tokens: 96u64.saturating_sub(q.local_tokens),
            load_async: false,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

/// What a run saw: reads of blocks nothing had written yet, and sharers scheduled in the same
/// step as the sync load of blocks they read.
#[derive(Debug, Default)]
struct Seen {
    unwritten_reads: u64,
    same_step_sharers: u64,
    steps: u64,
}

/// A request id the runtime routes to `shard` of 2.
fn id_on(shard: usize, name: &str) -> String {
    (0u32..)
        .map(|i| format!("{name}-{i}"))
        .find(|id| shard_of(id, 2) == shard)
        .unwrap_or_default()
}

fn run(mode: Mode) -> Seen {
    let mut rt = Runtime::builder()
        .groups(vec![CacheGroup::full_attention(16)])
        .pool_blocks(600)
        .shards(2)
        .settings(Settings::default().with_mode(mode))
        .token_budget(64)
        .max_seqs(8)
        .connector(Arc::new(SyncStore))
        .inline_steps_up_to(usize::MAX)
        .build()
        .expect("runtime");
    let submit = |rt: &mut Runtime, id: String, prompt: Vec<u32>| {
        rt.submit(SubmitRequest {
            id,
            prompt,
            max_new_tokens: 2,
            priority: 0,
            load_deadline: None,
        })
        .expect("submit");
    };
    let mut written: HashSet<BlockRef> = HashSet::new();
    let mut seen = Seen::default();
    for wave in 0..4u32 {
        // Shard 0: a long prompt with no load, which spends the shard's budget for several
        // steps, then a loader of this wave's prefix and a sharer of it. Shard 1: sharers.
        let prefix: Vec<u32> = (0..128)
            .map(|i| if i == 0 { 7 } else { 1000 * (wave + 1) + i })
            .collect();
        let long = (0..200).map(|i| 50_000 * (wave + 1) + i).collect();
        submit(&mut rt, id_on(0, &format!("long{wave}")), long);
        let sharer = |rt: &mut Runtime, shard: usize, k: u32| {
            let mut p = prefix.clone();
            p.truncate(100 + 4 * k as usize);
            p.push(90_000 + 100 * wave + k);
            submit(rt, id_on(shard, &format!("w{wave}s{k}")), p);
        };
        sharer(&mut rt, 0, 0); // the loader
        sharer(&mut rt, 0, 1);
        sharer(&mut rt, 1, 2);
        sharer(&mut rt, 1, 3);
        for _ in 0..16 {
            let plan = rt.schedule().expect("schedule");
            if plan.scheduled.is_empty() {
                continue;
            }
            seen.steps += 1;
            let loaded: HashSet<BlockRef> = plan
                .scheduled
                .iter()
                .filter_map(|s| s.sync_load.as_deref())
                .flat_map(LoadJob::all_loaded_blocks)
                .collect();
            for s in &plan.scheduled {
                let table = &s.block_tables[0];
                let reads = (s.num_computed_tokens / 16) as usize;
                for b in table.iter().take(reads).filter(|b| b.id != 0) {
                    let own_load = s
                        .sync_load
                        .as_ref()
                        .is_some_and(|j| j.all_loaded_blocks().contains(b));
                    if written.contains(b) {
                        continue;
                    }
                    if loaded.contains(b) {
                        if !own_load {
                            seen.same_step_sharers += 1;
                        }
                    } else {
                        seen.unwritten_reads += 1;
                    }
                }
            }
            written.extend(loaded);
            for s in &plan.scheduled {
                let table = &s.block_tables[0];
                let from = (s.num_computed_tokens / 16) as usize;
                let to = (s.num_computed_tokens + s.num_tokens).div_ceil(16) as usize;
                written.extend(table.iter().take(to).skip(from).filter(|b| b.id != 0));
            }
            rt.update(StepOutput::all_sampled(&plan));
        }
    }
    seen
}

#[test]
fn mode_vllm_admits_into_the_step_and_never_reads_an_unrun_load() {
    let seen = run(Mode::Vllm);
    assert!(seen.steps > 20, "{seen:?}");
    assert_eq!(seen.unwritten_reads, 0, "{seen:?}");
    // vLLM's caching is there: a sharer admitted after the loader in its step reads the
    // loader's destinations, loaded in that step.
    assert!(seen.same_step_sharers > 0, "{seen:?}");
}

#[test]
fn mode_safe_shares_no_sync_load_in_its_step() {
    let seen = run(Mode::Safe);
    assert!(seen.steps > 20, "{seen:?}");
    assert_eq!(
        (seen.unwritten_reads, seen.same_step_sharers),
        (0, 0),
        "{seen:?}"
    );
}
