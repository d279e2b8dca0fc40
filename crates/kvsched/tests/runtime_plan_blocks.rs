//! No block is handed out twice in one plan: every block a plan names is named at one
//! generation, whatever preempts what inside the step.
//!
//! Mode `vllm` schedules the requests it admits after the running ones (vLLM's order). A
//! resumed request's first chunk runs past its prompt, and admission allocates only the
//! prompt's blocks: short of blocks, it used to preempt the latest running request even when
//! the step had already planned it. The victim's blocks went to the resumed request, and the
//! plan named them in both tables, at two generations: the engine writes both requests' KV
//! into one block. (Planted bug `preempt-planned` restores that.)
//!
//! The case, built step by step: `a` and `b` decode; `c`, last in canonical order, waits for
//! an asynchronous load a gate holds. The pool runs out and `a`'s growth preempts `b` (`c`,
//! loading, is not running); the gate opens and `c`'s load lands. The next step plans the
//! running `a` and `c` first, then admits `b` again, whose first chunk needs blocks for the
//! tokens it generated: there are none, and the latest running request is `c`, in the plan.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsched::connector::{KvConnector, LoadJob, LoadResult, LookupQuery, LookupResult};
use kvsched::rules::geometry::CacheGroup;
use kvsched::rules::recovery::Mode;
use kvsched::{Runtime, Settings, StepOutput, StepPlan, SubmitRequest};

/// Offers an asynchronous load of 8 tokens for prompts starting with token 9, which completes
/// once the gate opens; nothing for other prompts.
struct Gated {
    open: AtomicBool,
}

impl KvConnector for Gated {
    fn lookup(&self, q: LookupQuery<'_>) -> LookupResult {
        if q.prompt.first() != Some(&9) {
            return LookupResult::default();
        }
        LookupResult {
            external_tokens: 8u64.saturating_sub(q.local_tokens),
            load_async: true,
        }
    }
    fn load(&self, _: &LoadJob) -> LoadResult {
        let start = Instant::now();
        while !self.open.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        LoadResult::Ok
    }
}

/// The blocks `plan` names at more than one generation, with the requests naming them.
fn named_twice(plan: &StepPlan) -> Vec<String> {
    let mut seen: HashMap<u64, (u32, String)> = HashMap::new();
    let mut out = Vec::new();
    for s in &plan.scheduled {
        for b in s.block_tables.iter().flat_map(|t| t.iter()) {
            if b.id == 0 {
                continue;
            }
            let (id, generation) = (b.id, b.generation);
            match seen.get(&id) {
                Some((g, who)) if *g != generation => out.push(format!(
                    "step {}: block {id} at generation {g} ({who}) and {generation} ({})",
                    plan.step, s.id
                )),
                Some(_) => {}
                None => {
                    seen.insert(id, (generation, s.id.to_string()));
                }
            }
        }
    }
    out
}

fn submit(rt: &mut Runtime, id: &str, prompt: Vec<u32>, priority: i16, max_new_tokens: u32) {
    rt.submit(SubmitRequest {
        id: id.into(),
        prompt,
        max_new_tokens,
        priority,
        load_deadline: None,
    })
    .expect("submit");
}

#[test]
fn a_request_the_step_planned_is_never_preempted_by_it() {
    let conn = Arc::new(Gated {
        open: AtomicBool::new(false),
    });
    // 8 blocks of 4 tokens and the null block: `c` holds 2 while it loads, `a` and `b` one
    // each for their prompts and one more per 4 tokens they generate.
    let mut rt = Runtime::builder()
        .groups(vec![CacheGroup::full_attention(4)])
        .pool_blocks(9)
        .settings(Settings::default().with_mode(Mode::Vllm))
        .token_budget(256)
        .max_seqs(8)
        .workers(1)
        .connector(Arc::clone(&conn) as Arc<dyn KvConnector>)
        .inline_steps_up_to(usize::MAX)
        .build()
        .expect("runtime");
    submit(&mut rt, "c", vec![9, 1, 2, 3, 4, 5, 6, 7], 2, 4);
    submit(&mut rt, "a", vec![20, 21, 22, 23], 0, 24);
    submit(&mut rt, "b", vec![30, 31, 32, 33], 1, 24);
    let mut bad = Vec::new();
    let mut preempted_at = None;
    let start = Instant::now();
    let mut steps = 0u32;
    while rt.live() > 0 && steps < 400 && start.elapsed() < Duration::from_secs(30) {
        steps += 1;
        let plan = rt.schedule().expect("schedule");
        bad.extend(named_twice(&plan));
        if preempted_at.is_none() && rt.metrics().preemptions > 0 {
            // `b` is out: let `c`'s load finish, so that `c` runs before `b` comes back.
            preempted_at = Some(steps);
            conn.open.store(true, Ordering::Release);
            // Its completion is queued before the next step looks.
            let open_at = Instant::now();
            while rt.loads_in_flight() > 0 {
                assert!(
                    open_at.elapsed() < Duration::from_secs(10),
                    "the load never completed"
                );
                rt.wait_for_work(Duration::from_millis(10));
            }
        }
        if plan.scheduled.is_empty() {
            rt.wait_for_work(Duration::from_millis(5));
        }
        rt.update(StepOutput::all_sampled(&plan));
    }
    conn.open.store(true, Ordering::Release);
    let m = rt.metrics();
    assert!(
        preempted_at.is_some(),
        "no preemption in {steps} steps: {m:?}"
    );
    assert!(bad.is_empty(), "a plan named a block twice: {bad:#?}");
    assert_eq!(rt.live(), 0, "requests never ended in {steps} steps: {m:?}");
    let v = rt.check_invariants();
    assert!(v.is_empty(), "{v:?}");
}
