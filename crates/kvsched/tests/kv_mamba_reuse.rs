//! A hybrid prompt with a Mamba `align` group, reused from a tier by another engine: the first
//! engine computes it (its last prefill chunk stops at the prompt's last block end, so that
//! state is saved), the second, sharing the tier, is offered the prefix up to that state and
//! loads the attention blocks and that one state — not the states before it, which no step
//! wrote (`runtime::policy::{alignment, state_ends, admission}`). On real bytes, checked by
//! the `KvChecker`. When the load fails, the request recomputes from its local prefix into the
//! entries the load left null, and still reads no garbage.

use std::sync::Arc;
use std::time::Duration;

use kvsched::connector::{KvConnector, LookupQuery};
use kvsched::kv::{HostKvMemory, KvLayout, KvMemory, MemoryTier, Tier, TierConnector};
use kvsched::kv::{TierConnectorConfig, TierCounts};
use kvsched::{CacheGroup, MambaMode, Runtime, StepOutput, SubmitRequest};
use kvsched_testkit::{FaultConfig, FaultyTier, KvCheckCounts, KvChecker};

const BLOCKS: usize = 1024;
const BPT: usize = 8;
const STATE: usize = 32;

fn groups() -> Vec<CacheGroup> {
    vec![
        CacheGroup::full_attention(16),
        CacheGroup::mamba(64, MambaMode::Align),
    ]
}

/// One engine: a runtime over its own KV memory and a connector on the shared `tier`.
struct Engine {
    rt: Runtime,
    conn: Arc<TierConnector>,
    checker: KvChecker,
}

impl Engine {
    fn new(tier: Arc<dyn Tier>, budget: u64) -> Engine {
        let layout = KvLayout::for_groups(&groups(), BPT, STATE).expect("layout");
        let memory: Arc<dyn KvMemory> =
            Arc::new(HostKvMemory::new(layout, BLOCKS).expect("memory"));
        let conn = Arc::new(
            TierConnector::new(
                tier,
                Arc::clone(&memory),
                TierConnectorConfig::default()
                    .with_groups(groups())
                    .with_tag(7)
                    .with_async_ratio(0.0),
            )
            .expect("connector"),
        );
        let dyn_conn: Arc<dyn KvConnector> = conn.clone();
        let rt = Runtime::builder()
            .groups(groups())
            .pool_blocks(BLOCKS)
            .shards(1)
            .workers(1)
            .token_budget(budget)
            .connector(dyn_conn)
            .build()
            .expect("runtime");
        let checker = KvChecker::new(groups(), 7, BPT, STATE, memory);
        Engine { rt, conn, checker }
    }

    /// Runs `prompt` as request `id` to its end, saving what each kept step computed;
    /// returns the `(computed, tokens)` chunks it was scheduled.
    fn run(&mut self, id: &str, prompt: &[u32]) -> Vec<(u64, u64)> {
        self.checker.add_request(id, prompt);
        self.rt
            .submit(SubmitRequest {
                id: id.into(),
                prompt: prompt.to_vec(),
                max_new_tokens: 2,
                priority: 0,
                load_deadline: None,
            })
            .expect("submit");
        let mut chunks = Vec::new();
        for _ in 0..200 {
            let plan = self.rt.schedule().expect("step");
            chunks.extend(
                plan.scheduled
                    .iter()
                    .map(|s| (s.num_computed_tokens, s.num_tokens)),
            );
            let check = self.checker.run_step(&plan, Some(self.conn.as_ref()));
            let mut out = StepOutput::all_sampled(&plan);
            out.invalid_blocks = check.invalid_blocks.clone();
            let discard = self.rt.update(out);
            self.checker.settle(&plan, check, &discard);
            for s in plan.scheduled.iter().filter(|s| !discard.contains(&s.id)) {
                let blocks = self.checker.completed_prompt_blocks(s);
                self.conn.save_blocks(prompt, &blocks);
            }
            if plan.ended.iter().any(|(e, _)| &**e == id) {
                self.checker.end_request(id);
                self.conn.flush();
                return chunks;
            }
            self.rt.wait_for_work(Duration::from_millis(1));
        }
        panic!("{id} did not end in 200 steps: {chunks:?}");
    }

    /// Looks `prompt` up once and waits for the probe its miss starts: a connector knows
    /// only the chunks it saved, loaded or found by probing.
    fn probe(&self, prompt: &[u32]) {
        let query = LookupQuery {
            request: "probe",
            prompt,
            local_tokens: 0,
            prepared: None,
        };
        assert_eq!(
            self.conn.lookup(query).external_tokens,
            0,
            "nothing known yet"
        );
        self.conn.flush();
    }

    fn finish(self) -> (KvCheckCounts, TierCounts) {
        let report = self.rt.shutdown();
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        (self.checker.counts().clone(), self.conn.counts())
    }
}

/// A 1,000-token prompt (its last block end is 960 = 15 · 64) and its next turn.
fn turns() -> (Vec<u32>, Vec<u32>) {
    let first: Vec<u32> = (1..=1000).collect();
    let mut next = first.clone();
    next.extend(5000..5500);
    (first, next)
}

#[test]
fn the_next_turn_loads_the_prefix_up_to_the_last_saved_state() {
    let tier: Arc<dyn Tier> = Arc::new(MemoryTier::new(64 << 20, 4));
    let (first, next) = turns();
    let mut a = Engine::new(Arc::clone(&tier), 4096);
    let chunks = a.run("a", &first);
    // The chunk reaching the prompt's end stops at its last block end first.
    assert_eq!(chunks[..2], [(0, 960), (960, 40)], "{chunks:?}");
    let (check, saved) = a.finish();
    assert_eq!(check.garbage_reads, 0);
    // 62 full attention blocks and the one state the step wrote at a block end (960).
    assert_eq!(saved.chunks_saved, 62 + 1, "{saved:?}");

    let mut b = Engine::new(tier, 4096);
    b.probe(&next);
    let chunks = b.run("b", &next);
    assert_eq!(chunks[0].0, 960, "the tier serves 960 tokens: {chunks:?}");
    let (check, loaded) = b.finish();
    assert_eq!(check.garbage_reads, 0);
    assert_eq!(check.sync_loads_failed, 0, "{check:?}");
    // 60 attention blocks below 960, and the state at 960 alone.
    assert_eq!(loaded.chunks_loaded, 60 + 1, "{loaded:?}");
    assert_eq!(loaded.missing_chunks, 0, "{loaded:?}");
    assert!(check.kv_bytes_verified > 0);
}

#[test]
fn a_failed_load_recomputes_into_the_entries_it_left_null() {
    let (first, next) = turns();
    // Every chunk read back damaged: the load fails, and the request goes back to its
    // local prefix (the state at 512, cached by a request that stopped there).
    let faults = FaultConfig {
        seed: 3,
        corrupt: 1.0,
        ..FaultConfig::default()
    };
    let tier = Arc::new(FaultyTier::new(MemoryTier::new(64 << 20, 4), faults).expect("faults"));
    let mut a = Engine::new(tier.clone(), 4096);
    a.run("a", &first);
    a.finish();

    // Budget 256: from 512, steps end at 768 and 1,024; the state at 768 goes into an entry
    // the load left null.
    let mut b = Engine::new(tier, 256);
    b.probe(&next);
    let mut head = first[..512].to_vec();
    head.extend(9000..9100);
    b.run("head", &head);
    let chunks = b.run("b", &next);
    assert_eq!(
        chunks[0],
        (960, 256),
        "local 512, loaded to 960: {chunks:?}"
    );
    assert!(
        chunks[1..].starts_with(&[(512, 256), (768, 256)]),
        "recomputed from the local prefix: {chunks:?}"
    );
    let (check, _) = b.finish();
    assert_eq!(check.sync_loads_failed, 1, "{check:?}");
    assert_eq!(check.garbage_reads, 0, "{check:?}");
}
