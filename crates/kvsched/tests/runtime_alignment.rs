//! Block-aligned prefill chunks (`runtime::policy::alignment`): with a Mamba `align` group the
//! runtime ends every prefill chunk that stops inside the prompt on a block end, so the prefix
//! a request computed is reusable by the next request with the same prompt.

use kvsched::rules::geometry::{CacheGroup, MambaMode};
use kvsched::{Runtime, StepOutput, SubmitRequest};
use kvsched_testkit::SimEngine;

const PROMPT: u64 = 1000;

fn req(id: &str) -> SubmitRequest {
    with_prompt(id, (0..PROMPT as u32).collect())
}

fn with_prompt(id: &str, prompt: Vec<u32>) -> SubmitRequest {
    SubmitRequest {
        id: id.into(),
        prompt,
        max_new_tokens: 2,
        priority: 0,
        load_deadline: None,
    }
}

/// Runs `id` to its end alone on `rt`; returns the `(computed, tokens)` chunks it was
/// scheduled, in order.
fn run_alone(rt: &mut Runtime, engine: &mut SimEngine, id: &str) -> Vec<(u64, u64)> {
    run_prompt(rt, engine, req(id))
}

/// Runs `r` to its end alone on `rt`; returns its chunks, as `run_alone` does.
fn run_prompt(rt: &mut Runtime, engine: &mut SimEngine, r: SubmitRequest) -> Vec<(u64, u64)> {
    let id = r.id.clone();
    rt.submit(r).unwrap();
    let mut out = StepOutput::default();
    let mut chunks = Vec::new();
    for _ in 0..100 {
        rt.update(std::mem::take(&mut out));
        let plan = rt.schedule().expect("step");
        for s in &plan.scheduled {
            chunks.push((s.num_computed_tokens, s.num_tokens));
        }
        out = engine.step(&plan);
        if plan.ended.iter().any(|(e, _)| **e == *id) {
            return chunks;
        }
    }
    panic!("{id} did not end in 100 steps: {chunks:?}");
}

fn runtime(groups: Vec<CacheGroup>) -> Runtime {
    runtime_with_budget(groups, 100)
}

fn runtime_with_budget(groups: Vec<CacheGroup>, budget: u64) -> Runtime {
    Runtime::builder()
        .shards(1)
        .groups(groups)
        .token_budget(budget)
        .build()
        .unwrap()
}

#[test]
fn a_mamba_align_prompt_is_chunked_on_block_ends_and_reused() {
    let mut rt = runtime(vec![
        CacheGroup::full_attention(16),
        CacheGroup::mamba(64, MambaMode::Align),
    ]);
    let mut engine = SimEngine::default();
    let first = run_alone(&mut rt, &mut engine, "a");
    for &(c, n) in &first {
        let end = c + n;
        assert!(
            end >= PROMPT || end % 64 == 0,
            "a chunk inside the prompt ends off a block end: {first:?}"
        );
    }
    assert_eq!(first[0], (0, 64), "{first:?}");
    let given_back = rt.metrics().aligned_chunk_tokens;
    assert!(given_back > 0, "no chunk was cut back");

    // The second request with the same prompt starts from the last block end below the
    // prompt's last token: 960 of its 1,000 tokens come from the prefix cache.
    let second = run_alone(&mut rt, &mut engine, "b");
    assert_eq!(second[0].0, 960, "{second:?}");
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[test]
fn without_a_mamba_align_group_chunks_end_where_the_budget_says() {
    let mut rt = runtime(vec![
        CacheGroup::full_attention(16),
        CacheGroup::mamba(64, MambaMode::All),
    ]);
    let mut engine = SimEngine::default();
    let first = run_alone(&mut rt, &mut engine, "a");
    assert_eq!(first[0], (0, 100), "{first:?}");
    assert_eq!(rt.metrics().aligned_chunk_tokens, 0);
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

/// A prompt of a 512-token shared head (tokens `0..512`) and a 488-token tail of its own.
fn branch(id: &str, tail: u32) -> SubmitRequest {
    let mut prompt: Vec<u32> = (0..512).collect();
    prompt.extend((0..488).map(|t| tail * 1000 + t));
    with_prompt(id, prompt)
}

#[test]
fn a_prompt_stops_where_its_cached_prefix_ends_so_the_next_one_resumes_there() {
    let mut rt = runtime_with_budget(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::mamba(64, MambaMode::Align),
        ],
        4096,
    );
    let mut engine = SimEngine::default();
    // The first computes its whole prompt up to its last block end in one chunk: the head's
    // attention blocks are cached, its state at 512 is not.
    let a = run_prompt(&mut rt, &mut engine, branch("a", 10));
    assert_eq!(a[..2], [(0, 960), (960, 40)], "{a:?}");
    // The second finds the head's attention blocks but no state there: it recomputes the
    // head and stops at its end, where the prefixes part.
    let b = run_prompt(&mut rt, &mut engine, branch("b", 20));
    assert_eq!(b[..3], [(0, 512), (512, 448), (960, 40)], "{b:?}");
    // The third resumes from the head's state.
    let c = run_prompt(&mut rt, &mut engine, branch("c", 30));
    assert_eq!(c[0].0, 512, "{c:?}");
    let report = rt.shutdown();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}
