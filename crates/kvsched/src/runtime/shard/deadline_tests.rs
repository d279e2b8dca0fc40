//! A hung load's deadline comes however many loads completed since it was dispatched: the
//! deadline queue drops the entries of completed loads (so a long deadline does not keep one
//! per load ever dispatched) but never the entry of a load still in flight. The shard runs
//! here with a clock the test sets, so the deadline comes when the test says. Planted bug
//! `deadline-compact-in-flight` (scripts/plants.sh) drops every entry when compacting.

use std::sync::Arc as StdArc;
use std::time::{Duration, Instant};

use super::release_tests::AsyncOffer;
use super::strategy::LockFree;
use super::{Command, Env, NewRequest, Shard, ShardStepResult, StepSettings};
use crate::connector::{LoadJob, LoadResult};
use crate::pool::BlockPool;
use crate::rules::geometry::{CacheGroup, Geometry};
use crate::rules::recovery::InvalidSet;
use crate::runtime::claim::{ClaimTable, RequestKey};
use crate::runtime::handle::SubmitRequest;
use crate::runtime::load_estimate::LoadEstimate;
use crate::runtime::quarantine::Quarantine;
use crate::runtime::settings::Settings;
use crate::runtime::worker::Completion;
use crate::sync::Arc;

const BLOCKS: usize = 512;
/// Requests submitted, loaded and finished together.
const WAVE: u64 = 32;
/// Waves after the hung load: several times the entries at which the queue compacts.
const WAVES: u64 = 100;

fn completion(job: &LoadJob, at: Instant) -> Completion {
    Completion {
        key: RequestKey::from_raw(job.owner.key),
        attempt: job.attempt,
        result: LoadResult::Ok,
        panicked: false,
        started_at: at,
        finished_at: at,
    }
}

#[test]
fn a_hung_loads_deadline_comes_after_thousands_of_completed_loads() {
    let geo = Geometry::new(vec![CacheGroup::full_attention(16)], None, 0).expect("geometry");
    let pool = Arc::new(BlockPool::new(BLOCKS).expect("pool"));
    let claims = ClaimTable::new(BLOCKS);
    let (quarantine, estimate) = (Quarantine::default(), LoadEstimate::default());
    let env = Env {
        geo: &geo,
        pool: &pool,
        claims: &claims,
        connector: &AsyncOffer,
        quarantine: &quarantine,
        estimate: &estimate,
        shard: 0,
        shards: 1,
    };
    let deadline = Duration::from_secs(10);
    let settings = StepSettings::new(
        &Settings::default().with_load_deadline(Some(deadline)),
        1 << 20,
        64,
        false,
    );
    let mut shard = Shard::<LockFree>::for_blocks(BLOCKS);
    let t0 = Instant::now();
    let expired = std::cell::Cell::new(0);
    let step = |shard: &mut Shard<LockFree>, now, commands, completions| {
        let mut loads = Vec::new();
        let ids = shard.publish(&env, &settings, now, commands, completions);
        if !ids.is_empty() {
            // The hung load's blocks, once its deadline came.
            let report = InvalidSet::flat(ids.iter().copied(), env.geo);
            shard.claim(&env, &settings, &report, &ids);
        }
        let mut res = ShardStepResult::default();
        shard.finish_step(&env, &settings, now, false, &mut loads, &mut res);
        expired.set(expired.get() + res.counters.deadlines_expired);
        loads
    };
    let submit = |n: u64| {
        // Distinct prompts of one full block and a token: each one's block is loaded.
        let id = format!("r{n}");
        let req = SubmitRequest {
            id: id.clone(),
            prompt: (0..17).map(|t| (n * 17 + t) as u32).collect(),
            max_new_tokens: 4,
            priority: 0,
            load_deadline: None,
        };
        let key = RequestKey::new(false, 0, n + 1);
        Command::Submit(Box::new(NewRequest::new(
            &geo,
            req,
            StdArc::from(id.as_str()),
            key,
        )))
    };
    // The hung load: dispatched first, never answered.
    let hung = step(&mut shard, t0, vec![submit(0)], vec![]);
    assert_eq!(hung.len(), 1);
    let mut most = 0;
    for wave in 0..WAVES {
        let first = 1 + wave * WAVE;
        let ids: Vec<u64> = (first..first + WAVE).collect();
        let loads = step(
            &mut shard,
            t0,
            ids.iter().map(|&n| submit(n)).collect(),
            vec![],
        );
        assert_eq!(loads.len() as u64, WAVE, "wave {wave}: every request loads");
        let done = loads.iter().map(|job| completion(job, t0)).collect();
        step(&mut shard, t0, vec![], done);
        let finish = ids
            .iter()
            .map(|n| Command::Finish(StdArc::from(format!("r{n}").as_str())))
            .collect();
        step(&mut shard, t0, finish, vec![]);
        most = most.max(shard.deadlines.len());
    }
    assert_eq!(expired.get(), 0, "no deadline has come yet");
    assert!(
        most < (WAVES * WAVE / 2) as usize,
        "the completed loads' entries are dropped: {most} entries"
    );
    step(
        &mut shard,
        t0 + deadline + Duration::from_secs(1),
        vec![],
        vec![],
    );
    assert_eq!(expired.get(), 1, "the hung load's deadline came");
}
