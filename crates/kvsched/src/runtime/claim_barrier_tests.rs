//! In a step run in parallel, no shard decides before every shard has claimed its hits (the
//! claim barrier, docs/runtime.md): a shard that decided early would see its own key on a
//! shared block whose earlier claimant sits on a shard that has not claimed yet, and both
//! requests would recompute it. A test-only hook in the shared state makes one shard's claims
//! start late, so the early decision is certain when the barrier is missing.
//!
//! The same step checks what the step reports of the recovery: the claims and recomputed
//! tokens counted in the metrics, and the recorded inputs' keys.

use std::sync::mpsc;
use std::sync::Arc as StdArc;
use std::time::Duration;

use crate::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use crate::rules::geometry::CacheGroup;
use crate::rules::recovery::{Mode, RequestClass};
use crate::runtime::route::shard_of;
use crate::runtime::{Runtime, Settings, StepOutput, SubmitRequest};
use crate::sync::{thread, Ordering};

/// Offers a synchronous load of the first 64 tokens of prompts starting with token 7.
struct SyncStore;

impl KvConnector for SyncStore {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if q.prompt.first() != Some(&7) {
            return LookupResult::default();
        }
        LookupResult {
            external_tokens: 64u64.saturating_sub(q.local_tokens),
            load_async: false,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        LoadResult::Ok
    }
}

/// A request id the runtime routes to `shard` of 2.
fn id_on(shard: usize, name: &str) -> String {
    (0u32..)
        .map(|i| format!("{name}-{i}"))
        .find(|id| shard_of(id, 2) == shard)
        .unwrap_or_default()
}

fn req(id: &str, first_token: u32) -> SubmitRequest {
    SubmitRequest {
        id: id.into(),
        prompt: (0..80)
            .map(|i| if i == 0 { first_token } else { 100 + i })
            .collect(),
        max_new_tokens: 32,
        priority: 0,
        load_deadline: None,
    }
}

/// What the step after a sync load failed to write a block saw: the block's two holders are
/// on different shards, and the earlier one's shard claims late.
struct Seen {
    /// The request earlier in canonical order.
    earlier: String,
    /// The requests that claimed the block (to recompute it).
    owners: Vec<String>,
    /// Claims and recomputed tokens of the step's decisions.
    decided: (u64, u64),
    /// The metrics' claims and recomputed tokens at shutdown.
    counted: (u64, u64),
    /// Whether the step that recovered ran in parallel.
    parallel: bool,
    /// Recorded inputs: the class each was scanned in, and whether its key is a running key.
    scanned: Vec<(RequestClass, bool)>,
}

fn recover_a_shared_failed_block() -> Seen {
    let mut rt = Runtime::builder()
        .groups(vec![CacheGroup::full_attention(16)])
        .pool_blocks(256)
        .shards(2)
        .settings(Settings::default().with_mode(Mode::Vllm))
        .connector(StdArc::new(SyncStore))
        // Two live requests step inline (the same-step sharing is then in shard order);
        // three step in parallel, whatever the step's work.
        .inline_steps_up_to(2)
        .parallel_step_work(0)
        .record_recovery_inputs(true)
        .build()
        .expect("runtime");
    let (earlier, later) = (id_on(1, "earlier"), id_on(0, "later"));
    rt.submit(req(&earlier, 7)).expect("submit");
    rt.submit(req(&later, 7)).expect("submit");
    let plan = rt.schedule().expect("step");
    let job = plan
        .scheduled
        .iter()
        .find_map(|s| s.sync_load.as_deref())
        .expect("a sync load");
    let failed = job.all_loaded_blocks()[0];
    let holders = plan
        .scheduled
        .iter()
        .filter(|s| s.block_tables[0].contains(&failed))
        .count();
    assert_eq!(holders, 2, "both requests hold the loaded block: {plan:?}");
    let mut out = StepOutput::all_sampled(&plan);
    out.invalid_blocks.push(failed);
    rt.update(out);
    // A third live request makes the next step parallel.
    rt.submit(req(&id_on(0, "other"), 8)).expect("submit");
    rt.inner.slow_claims_in_shard.store(1, Ordering::Relaxed);
    let before = rt.metrics().parallel_steps;
    let plan = rt.schedule().expect("step");
    let parallel = rt.metrics().parallel_steps == before + 1;
    let recovered = &plan.recovery.recovered;
    let owners = recovered
        .iter()
        .filter(|r| r.decision.claimed_blocks.contains(&failed.id))
        .map(|r| r.id.to_string())
        .collect();
    let decided = recovered.iter().fold((0, 0), |(c, t), r| {
        (
            c + r.decision.claimed_blocks.len() as u64,
            t + r.decision.affected_tokens,
        )
    });
    let scanned = plan
        .recovery
        .scanned
        .iter()
        .map(|s| (s.class, s.key.is_running()))
        .collect();
    let m = rt.shutdown().metrics;
    Seen {
        earlier,
        owners,
        decided,
        counted: (m.claims, m.tokens_recomputed),
        parallel,
        scanned,
    }
}

#[test]
fn only_the_earliest_holder_owns_a_shared_block_whatever_shard_claims_last() {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(recover_a_shared_failed_block());
    });
    // A hang guard, not a timing assertion.
    let seen = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the steps finish");
    assert!(seen.parallel, "the recovering step ran in parallel");
    assert_eq!(
        seen.owners,
        [seen.earlier],
        "one owner, the earliest in canonical order"
    );
    assert!(
        seen.decided.0 == 1 && seen.decided.1 > 0,
        "{:?}",
        seen.decided
    );
    assert_eq!(
        seen.counted, seen.decided,
        "the metrics count the step's recovery"
    );
    assert!(seen.scanned.len() >= 2, "both holders' inputs are recorded");
    for (class, running) in seen.scanned {
        assert_eq!(running, class == RequestClass::Sync, "{class:?}");
    }
}
