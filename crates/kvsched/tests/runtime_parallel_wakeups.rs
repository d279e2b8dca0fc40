//! A parallel step whose shard thread takes longer than the engine's spin window (200 µs)
//! still completes: the engine parks untimed while it waits for the shards, and only the
//! shard thread's unpark after its part wakes it; the shard threads, parked between steps,
//! wake only on the engine's unpark when it hands them a step. Nothing else can wake either
//! here (no loads, so no completions). Plants `handoff-engine-unpark-dropped` and
//! `handoff-shard-unpark-dropped` make a step hang.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::runtime::route::shard_of;
use kvsched::{Runtime, StepOutput};

mod support;
use support::{guarded, req};

/// Lookups on the shard threads take 20 ms: far past the engine's spin window.
struct SlowOnShardThreads;

impl KvConnector for SlowOnShardThreads {
    fn lookup(&self, _: LookupQuery<'_>) -> LookupResult {
        let on_shard_thread = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("kvsched-shard-"));
        if on_shard_thread {
            std::thread::sleep(Duration::from_millis(20));
        }
        LookupResult::default()
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

#[test]
fn a_slow_shard_thread_wakes_the_parked_engine_and_parked_shards_wake_for_a_step() {
    let parallel = guarded("parallel steps with a slow shard thread", || {
        let mut rt = Runtime::builder()
            .shards(2)
            .connector(Arc::new(SlowOnShardThreads))
            .inline_steps_up_to(0)
            .parallel_step_work(0)
            .build()
            .expect("runtime");
        for round in 0..5 {
            // Idle between steps, so the shard threads pass their spin window and park.
            std::thread::sleep(Duration::from_millis(5));
            let id = (0..100)
                .map(|i| format!("r{round}-{i}"))
                .find(|id| shard_of(id, 2) == 1)
                .expect("an id on shard 1");
            rt.submit(req(&id, (0..40).collect(), 1)).expect("submit");
            let plan = rt.schedule().expect("step");
            rt.update(StepOutput::all_sampled(&plan));
        }
        let parallel = rt.metrics().parallel_steps;
        drop(rt.shutdown());
        parallel
    });
    assert!(parallel >= 5, "steps ran in parallel: {parallel}");
}
