//! Random engines: each seed draws a geometry (full attention, sliding window, Mamba `align`
//! and `all`), 1–4 shards, a pool of 9–38 usable blocks, sync or async loads, a policy, budgets,
//! and a connector whose loads fail whole or in part, panic, run slow, or hang past their
//! deadline and scribble late; the engine cancels, finishes early, answers sloppily, loses
//! step outputs, switches live between modes `vllm` and `safe`, and waits for work on every
//! empty plan. Every seed must end every request, keep no garbage in mode `safe`, hand no
//! block out twice, and never sleep with work (a wait over 5 s is a plan error; a seed that
//! does not end within 60 s fails the test by name).
//!
//! The seeds run are `KVSCHED_SWEEP_SEEDS` (a range `A..B`; default `0..100`), so a failing
//! seed can be run alone and a long sweep run at will.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use kvsched::{CacheGroup, MambaMode, Mode, Policy, RuntimeError};

use super::connector::Act;
use super::harness::{engine_with, finish_checks, shared_prompt, with_deadline};

/// A xorshift draw in `0..n`.
fn draw(x: &mut u64, n: u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x % n
}

fn seeds() -> std::ops::Range<u32> {
    let Ok(v) = std::env::var("KVSCHED_SWEEP_SEEDS") else {
        return 0..100;
    };
    let (a, b) = v
        .split_once("..")
        .expect("KVSCHED_SWEEP_SEEDS: a range A..B");
    a.parse().expect("KVSCHED_SWEEP_SEEDS: A")..b.parse().expect("KVSCHED_SWEEP_SEEDS: B")
}

/// One seed: a description of its draw, and the run (panics on any failed check).
fn run(seed: u32) -> (String, impl FnOnce() + Send) {
    let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xdead;
    let geo = match draw(&mut x, 5) {
        0 => vec![CacheGroup::full_attention(4)],
        1 => vec![
            CacheGroup::full_attention(4),
            CacheGroup::sliding_window(4, 5),
        ],
        2 => vec![
            CacheGroup::full_attention(4),
            CacheGroup::mamba(4, MambaMode::Align),
        ],
        3 => vec![
            CacheGroup::full_attention(4),
            CacheGroup::mamba(4, MambaMode::All),
        ],
        _ => vec![
            CacheGroup::sliding_window(4, 6),
            CacheGroup::mamba(4, MambaMode::Align),
        ],
    };
    let shards = 1 + draw(&mut x, 4) as usize;
    let pool = 10 + draw(&mut x, 30) as usize;
    let offer_async = draw(&mut x, 2) == 0;
    let mut settings = with_deadline(5 + draw(&mut x, 40));
    if draw(&mut x, 4) == 0 {
        settings.policy = Policy::Fail;
    }
    let k = draw(&mut x, 1000) as u32;
    let mix = draw(&mut x, 3);
    let budget = (4 + draw(&mut x, 12)) * shards as u64;
    let max_seqs = (1 + draw(&mut x, 4) as usize) * shards;
    let sloppy = draw(&mut x, 5) == 0;
    let cancels = draw(&mut x, 3) as u32;
    let n_req = 10 + draw(&mut x, 30) as u32;
    let switches = k % 3 == 0;
    let lose_every = if k % 4 == 1 { 5 + u64::from(k % 7) } else { 0 };
    let desc = format!(
        "seed {seed}: {geo:?}, {shards} shards, pool {pool}, async {offer_async}, {:?}, \
         loads mix {mix} (k {k}), budget {budget}, max_seqs {max_seqs}, sloppy {sloppy}, \
         cancels {cancels}, {n_req} requests, mode switches {switches}, lose every {lose_every}",
        settings.policy
    );
    let run = move || {
        let mut e = engine_with(
            geo,
            pool,
            shards,
            offer_async,
            settings,
            move |j| {
                let v = (j.attempt + k + j.request.len() as u32 + j.start_tokens as u32) % 7;
                match (mix, v) {
                    (0, 0) => Act::FailAll,
                    (0, 1) | (_, 4) => Act::FailHalf,
                    (_, 2) => Act::HangUntilCancel,
                    (1, 3) => Act::Panic,
                    (2, 3) => Act::Slow(3),
                    // Only a worker may hang past its deadline: a sync load runs on the engine.
                    (_, 5) if offer_async => Act::HangPastCancel(150),
                    _ => Act::Ok,
                }
            },
            budget,
            max_seqs,
        );
        e.wait = Duration::from_secs(10);
        // Across a switch, what mode `vllm` computed from its garbage is not judged.
        e.exact_kernels = switches;
        e.sloppy = sloppy;
        e.lose_every = lose_every;
        let h = e.rt.handle();
        let mut n = 0;
        for i in 0..n_req {
            match e.submit(
                &format!("s{seed}-{i}"),
                shared_prompt(i % 3, i, 5 + (i % 5) as usize * 3),
                1 + i % 5,
            ) {
                Ok(()) => n += 1,
                Err(RuntimeError::TooLong { .. }) => {}
                Err(err) => panic!("submit: {err}"),
            }
            if i % 4 != 3 {
                continue;
            }
            if switches && i % 8 == 7 {
                let mode = match e.rt.settings().mode {
                    Mode::Safe => Mode::Vllm,
                    _ => Mode::Safe,
                };
                e.rt.update_settings(e.rt.settings().with_mode(mode))
                    .expect("switch");
                e.judge = false;
            }
            if i % 5 == 0 {
                if let Some(id) = e.reqs.keys().next().cloned() {
                    e.finish_next.push(id);
                }
            }
            e.step().expect("step");
            if cancels > 0 && i % (2 * cancels + 2) == 3 {
                h.cancel(&format!("s{seed}-{}", i - 2));
            }
        }
        e.rt.update_settings(e.rt.settings().with_mode(Mode::Safe))
            .expect("switch");
        // The first safe steps after a switch may still run what `vllm` planned.
        for _ in 0..4 {
            if e.rt.live() > 0 {
                e.step().expect("step");
            }
        }
        e.judge = true;
        e.run_to_end(100_000);
        e.conn.gate.store(true, Ordering::SeqCst);
        finish_checks(e, n);
    };
    (desc, run)
}

#[test]
fn random_engines_and_connectors_end_every_request_without_garbage_or_sleeping_with_work() {
    for seed in seeds() {
        let (desc, f) = run(seed);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung: {desc}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("failed: {desc}"),
        }
    }
}
