//! Unit tests of the write-behind.
use super::*;
use crate::kv::TierError;
use crate::sync::AtomicBool;

/// A tier whose `put` waits until the test opens the gate, then records that it stored.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    started: AtomicBool,
    stored: AtomicBool,
}

impl Tier for Gate {
    fn name(&self) -> &str {
        "gate"
    }
    fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
        Ok(vec![false; keys.len()])
    }
    fn get(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        Ok(vec![None; keys.len()])
    }
    fn put(&self, _: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.started.store(true, Ordering::SeqCst);
        while !*self.open.lock() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.stored.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// A saver of one thread and a queue of 8 over `gate`, `batch` chunks a put.
/// Offers one save and waits until the save thread has taken it (its put held at the gate);
/// the gate opens `open_after_ms` later, on the returned thread.
fn one_batch_taken(
    saver: &Saver,
    gate: &Arc<Gate>,
    open_after_ms: u64,
) -> std::thread::JoinHandle<()> {
    assert!(saver.offer(Work::Save {
        key: ChunkKey(1),
        group: 0,
        tokens: 16,
        chunk: vec![1; 56],
    }));
    while !gate.started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let gate = Arc::clone(gate);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(open_after_ms));
        *gate.open.lock() = true;
    })
}

fn gate_saver(gate: &Arc<Gate>, batch: usize) -> Saver {
    let tier: Arc<dyn Tier> = gate.clone();
    let ix = Arc::new(KeyIndex::new(64));
    Saver::start(
        tier,
        ChunkCodec::new(None),
        ix.clone(),
        ix,
        SaverSettings {
            capacity: 8,
            threads: 1,
            drop_timeout: std::time::Duration::from_secs(10),
            backoff: SaveBackoff::default(),
            chunk_bytes: 56,
            cpu_share: 1.0,
            batch,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn flush_waits_for_a_batch_a_thread_has_taken() {
    let gate = Arc::new(Gate::default());
    let saver = gate_saver(&gate, 32);
    // The thread has taken the batch: the queue is empty, the put is in progress.
    let opener = one_batch_taken(&saver, &gate, 30);
    saver.flush();
    assert!(
        gate.stored.load(Ordering::SeqCst),
        "flush returned before the taken batch was stored"
    );
    let _ = opener.join();
}

/// A flush parks until the thread storing the last batch wakes it: it returns when the put
/// does, not at its deadline.
#[test]
fn a_flush_is_woken_when_the_last_batch_is_stored() {
    let gate = Arc::new(Gate::default());
    let saver = gate_saver(&gate, 1);
    for k in 1..4 {
        assert!(saver.offer(Work::Save {
            key: ChunkKey(k),
            group: 0,
            tokens: 16,
            chunk: vec![1; 56],
        }));
    }
    let opener = {
        let gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            *gate.open.lock() = true;
        })
    };
    let started = Instant::now();
    assert!(saver.flush_until(Some(started + std::time::Duration::from_secs(30))));
    let waited = started.elapsed();
    assert_eq!(saver.counts().saved_chunks.load(Ordering::Relaxed), 3);
    assert!(
        waited < std::time::Duration::from_secs(15),
        "the flush waited out its deadline ({waited:?}): nothing woke it"
    );
    let _ = opener.join();
}

/// Saves still queued behind a put that does not return are dropped and counted at once, so
/// counts read right after account for every save offered; the batch a thread holds is
/// finished, and later offers are queued as before.
#[test]
fn dropping_the_queue_counts_what_it_held() {
    let gate = Arc::new(Gate::default());
    let saver = gate_saver(&gate, 1);
    let save = |k: u128| Work::Save {
        key: ChunkKey(k),
        group: 0,
        tokens: 16,
        chunk: vec![1; 56],
    };
    assert!(saver.offer(save(1)));
    while !gate.started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    for k in 2..6 {
        assert!(saver.offer(save(k)));
    }
    assert!(!saver.flush_until(Some(Instant::now())), "the put hangs");
    assert_eq!(saver.drop_queued(), 4, "the four saves behind the hung put");
    assert_eq!(saver.queued(), 0);
    assert_eq!(saver.counts().dropped.load(Ordering::Relaxed), 4);
    assert!(saver.offer(save(6)), "offers are queued as before");
    *gate.open.lock() = true;
    saver.flush();
    assert_eq!(saver.counts().saved_chunks.load(Ordering::Relaxed), 2);
    assert_eq!(saver.counts().dropped.load(Ordering::Relaxed), 4);
}

/// A tier that holds what its puts stored; a put stores at most `room` more chunks, then
/// fails (as a full disk does mid-batch). Counts its puts.
#[derive(Default)]
struct Filling {
    held: Mutex<Vec<ChunkKey>>,
    room: AtomicU64,
    puts: AtomicU64,
}

impl Tier for Filling {
    fn name(&self) -> &str {
        "filling"
    }
    fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
        let held = self.held.lock();
        Ok(keys.iter().map(|k| held.contains(k)).collect())
    }
    fn get(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        Ok(vec![None; keys.len()])
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        for (k, _) in chunks {
            if self.room.load(Ordering::SeqCst) == 0 {
                return Err(TierError::Unavailable("disk full".to_owned()));
            }
            self.room.fetch_sub(1, Ordering::SeqCst);
            self.held.lock().push(*k);
        }
        Ok(())
    }
}

fn saver(tier: &Arc<Filling>, backoff: SaveBackoff) -> Saver {
    let ix = Arc::new(KeyIndex::new(1024));
    let tier: Arc<dyn Tier> = tier.clone();
    Saver::start(
        tier,
        ChunkCodec::new(None),
        ix.clone(),
        ix,
        SaverSettings {
            capacity: 1024,
            threads: 1,
            drop_timeout: std::time::Duration::from_secs(10),
            backoff,
            chunk_bytes: 56,
            cpu_share: 1.0,
            batch: 32,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn offer(s: &Saver, keys: std::ops::Range<u128>) {
    for k in keys {
        assert!(s.offer(Work::Save {
            key: ChunkKey(k),
            group: 0,
            tokens: 16,
            chunk: vec![1; 56],
        }));
    }
    s.flush();
}

/// A put that stores part of its batch and fails: the chunks stored count as saved, each
/// other one as a failed save (not one error for the batch).
#[test]
fn a_failed_put_counts_each_chunk_the_tier_does_not_hold() {
    let tier = Arc::new(Filling::default());
    tier.room.store(2, Ordering::SeqCst);
    let s = saver(&tier, SaveBackoff::default());
    offer(&s, 1..6);
    let c = s.counts();
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!(r(&c.saved_chunks), 2);
    assert_eq!(r(&c.failed_chunks), 3);
    assert_eq!(r(&c.errors), 1);
    assert_eq!(
        c.last_error.lock().as_deref(),
        Some("tier unavailable: disk full")
    );
}

/// Puts that keep failing pause saving: chunks taken off the queue while paused are counted,
/// not tried; a failure right after the pause doubles it (up to the cap); a stored batch
/// resets it. The pauses are long (1 s, then 2 s) so that a loaded machine's delays between
/// the test's calls (hundreds of ms) cannot end one early.
#[test]
fn saves_that_keep_failing_pause_and_count_what_they_skip() {
    let tier = Arc::new(Filling::default());
    let pause = std::time::Duration::from_millis(1000);
    let s = saver(
        &tier,
        SaveBackoff {
            after_failed_batches: 2,
            pause,
            max_pause: pause * 2,
        },
    );
    let c = s.counts();
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    offer(&s, 1..2);
    offer(&s, 2..3);
    assert_eq!((tier.puts.load(Ordering::SeqCst), r(&c.pauses)), (2, 1));
    offer(&s, 3..13);
    assert_eq!(tier.puts.load(Ordering::SeqCst), 2, "no put while paused");
    assert_eq!((r(&c.skipped), r(&c.failed_chunks)), (10, 2));
    std::thread::sleep(pause + std::time::Duration::from_millis(100));
    offer(&s, 13..14);
    assert_eq!((tier.puts.load(Ordering::SeqCst), r(&c.pauses)), (3, 2));
    // The second pause is twice as long: still paused after the first one's length.
    std::thread::sleep(pause + std::time::Duration::from_millis(100));
    offer(&s, 14..15);
    assert_eq!(tier.puts.load(Ordering::SeqCst), 3, "still paused");
    tier.room.store(100, Ordering::SeqCst);
    std::thread::sleep(pause);
    offer(&s, 15..16);
    assert_eq!(
        (tier.puts.load(Ordering::SeqCst), r(&c.saved_chunks)),
        (4, 1)
    );
    offer(&s, 16..17);
    assert_eq!(
        r(&c.saved_chunks),
        2,
        "reset: the next put is tried at once"
    );
}

/// A load the tier answers shows it is back: a long pause then ends within the backoff's
/// first pause, and saving resumes; a pause already shorter is kept. Without the answer the
/// same pause is still on after that time.
#[test]
fn a_load_the_tier_answers_cuts_a_long_save_pause_short() {
    let pause = std::time::Duration::from_millis(500);
    let backoff = SaveBackoff {
        after_failed_batches: 1,
        pause,
        max_pause: pause * 16,
    };
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    for answered in [false, true] {
        let tier = Arc::new(Filling::default());
        tier.room.store(100, Ordering::SeqCst);
        let s = saver(&tier, backoff);
        // Four failures in a row: pauses of 0.5, 1, 2 and 4 s; the last is on.
        for _ in 0..4 {
            s.shared.put_failed("down".to_owned());
        }
        offer(&s, 1..2);
        assert_eq!(r(&s.counts().skipped), 1, "paused");
        if answered {
            s.tier_answered();
        }
        std::thread::sleep(pause + std::time::Duration::from_millis(200));
        offer(&s, 2..3);
        let puts = tier.puts.load(Ordering::SeqCst);
        if answered {
            assert_eq!(
                (puts, r(&s.counts().saved_chunks)),
                (1, 1),
                "saving resumed within the first pause of the answer"
            );
        } else {
            assert_eq!(puts, 0, "without an answer the 4 s pause is still on");
        }
    }
    // A pause shorter than the first pause's length is not made longer by an answer.
    let tier = Arc::new(Filling::default());
    tier.room.store(100, Ordering::SeqCst);
    let s = saver(
        &tier,
        SaveBackoff {
            after_failed_batches: 1,
            pause: std::time::Duration::from_secs(30),
            max_pause: std::time::Duration::from_secs(30),
        },
    );
    s.shared.put_failed("down".to_owned());
    let until = s.shared.pause.lock().until;
    s.tier_answered();
    assert_eq!(s.shared.pause.lock().until, until);
}

/// A tier whose `put` of key 1 takes 50 ms (the rest stores at once), recording what it stored.
#[derive(Default)]
struct SlowFirst {
    stored: Mutex<Vec<ChunkKey>>,
}

impl Tier for SlowFirst {
    fn name(&self) -> &str {
        "slow-first"
    }
    fn exists(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<bool>, TierError> {
        Ok(vec![false; keys.len()])
    }
    fn get(&self, keys: &[ChunkKey], _: &CancelToken) -> Result<Vec<Option<Vec<u8>>>, TierError> {
        Ok(vec![None; keys.len()])
    }
    fn put(&self, chunks: &[(ChunkKey, Vec<u8>)]) -> Result<(), TierError> {
        if chunks.iter().any(|(k, _)| *k == ChunkKey(1)) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.stored.lock().extend(chunks.iter().map(|(k, _)| *k));
        Ok(())
    }
}

/// Two save threads, a CPU share of 1%: the thread that stored key 1 (50 ms) rests 5 s. A
/// save offered while it rests and the other thread waits for work is stored by the other at
/// once: an offer's wake-up goes to a thread waiting for work, never to a resting one (which
/// would rest on, the save left queued for the rest of its 5 s).
#[test]
fn a_save_offered_while_one_thread_rests_is_stored_by_the_other() {
    let (tier, saver) = slow_first_saver(2);
    let save = |k: u128| {
        assert!(saver.offer(Work::Save {
            key: ChunkKey(k),
            group: 0,
            tokens: 16,
            chunk: vec![1; 56],
        }));
    };
    let stored = |k: u128| tier.stored.lock().contains(&ChunkKey(k));
    let wait_stored = |k: u128, secs: u64| {
        let t0 = Instant::now();
        while !stored(k) && t0.elapsed() < std::time::Duration::from_secs(secs) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        stored(k)
    };
    // One thread stores key 1 and starts its rest; the other stores key 2 (no rest to speak
    // of) and waits for work again, after the first began resting.
    save(1);
    assert!(wait_stored(1, 10));
    std::thread::sleep(std::time::Duration::from_millis(20));
    save(2);
    assert!(wait_stored(2, 10));
    std::thread::sleep(std::time::Duration::from_millis(20));
    // A hang guard, not a timing target: the other thread takes it at once, the resting one
    // only after its 5 s.
    save(3);
    assert!(
        wait_stored(3, 2),
        "the save waited for a resting thread's rest"
    );
    drop(saver);
}

/// `threads` save threads over [`SlowFirst`] at a CPU share of 1%, a put a batch: the
/// thread that stores key 1 (50 ms) then rests about 5 s.
fn slow_first_saver(threads: usize) -> (Arc<SlowFirst>, Saver) {
    let tier = Arc::new(SlowFirst::default());
    let t: Arc<dyn Tier> = tier.clone();
    let ix = Arc::new(KeyIndex::new(64));
    let saver = Saver::start(
        t,
        ChunkCodec::new(None),
        ix.clone(),
        ix,
        SaverSettings {
            capacity: 8,
            threads,
            drop_timeout: std::time::Duration::from_secs(10),
            backoff: SaveBackoff::default(),
            chunk_bytes: 56,
            cpu_share: 0.01,
            batch: 1,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (tier, saver)
}

/// One save thread over [`SlowFirst`], key 1 offered: its put takes 50 ms, then the thread
/// rests about 5 s.
fn resting_saver() -> (Arc<SlowFirst>, Saver) {
    let (tier, saver) = slow_first_saver(1);
    assert!(saver.offer(Work::Save {
        key: ChunkKey(1),
        group: 0,
        tokens: 16,
        chunk: vec![1; 56],
    }));
    (tier, saver)
}

/// A flush waits for the saves, not for the rest the thread owes after them.
#[test]
fn a_flush_does_not_wait_out_a_save_threads_rest() {
    let (tier, saver) = resting_saver();
    let started = Instant::now();
    assert!(saver.flush_until(Some(started + std::time::Duration::from_secs(30))));
    let waited = started.elapsed();
    assert!(tier.stored.lock().contains(&ChunkKey(1)));
    // A hang guard, not a timing target: the put takes 50 ms, the rest after it 5 s.
    assert!(
        waited < std::time::Duration::from_millis(2500),
        "the flush waited for the thread's rest ({waited:?})"
    );
}

/// A flush waiting for saves that `drop_queued` then drops is woken: nothing is left to wait
/// for (the thread rests, so no batch's end would wake it).
#[test]
fn a_flush_waiting_for_dropped_saves_is_woken() {
    let (_tier, saver) = resting_saver();
    assert!(saver.flush_until(Some(Instant::now() + std::time::Duration::from_secs(30))));
    // The thread rests now; a second save stays queued.
    assert!(saver.offer(Work::Save {
        key: ChunkKey(2),
        group: 0,
        tokens: 16,
        chunk: vec![1; 56],
    }));
    let saver = Arc::new(saver);
    let flusher = {
        let saver = Arc::clone(&saver);
        std::thread::spawn(move || {
            let started = Instant::now();
            let done = saver.flush_until(Some(started + std::time::Duration::from_secs(30)));
            (done, started.elapsed())
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(saver.drop_queued(), 1);
    let (done, waited) = flusher
        .join()
        .unwrap_or_else(|_| panic!("flusher panicked"));
    assert!(done, "nothing is queued or held: the flush is done");
    assert!(
        waited < std::time::Duration::from_millis(2500),
        "the flush was not woken by the drop ({waited:?})"
    );
}

/// Joining the save threads parks until the last of them ends: it returns when the put it
/// waited for does, without waking in the meantime (no polling) and without waiting out its
/// deadline (no lost wake-up).
#[test]
fn joining_is_woken_when_the_last_thread_ends() {
    use crate::sync::thread_group::test_support::voluntary_switches;
    let gate = Arc::new(Gate::default());
    let mut saver = gate_saver(&gate, 1);
    let opener = one_batch_taken(&saver, &gate, 500);
    saver.stop();
    let before = voluntary_switches();
    let started = Instant::now();
    assert!(saver.join_until(Some(started + std::time::Duration::from_secs(20))));
    let waited = started.elapsed();
    let after = voluntary_switches();
    assert!(
        gate.stored.load(Ordering::SeqCst),
        "the held batch was finished"
    );
    assert!(
        waited < std::time::Duration::from_secs(10),
        "the join waited out its deadline ({waited:?}): nothing woke it"
    );
    // A hang guard on polling, not a count to match: a 1 ms poll over the 500 ms put sleeps
    // hundreds of times; a parked join, a few.
    if let (Some(a), Some(b)) = (before, after) {
        assert!(b - a < 50, "the join slept {} times: it polls", b - a);
    }
    let _ = opener.join();
}
