//! The checker compares a read unit's bytes only when they may have changed (the block's write
//! epoch moved, the entry names another block, or it was garbage before). These tests hold it
//! to the promise that this changes what verifying costs and nothing it finds: the same
//! operations run against a checker over memory that keeps epochs and one over memory that
//! keeps none (which compares every unit at every read) must count the same garbage at every
//! step — through a sharer's rewrite, a late whole-block load into a reused block, a poison,
//! a table that changed under a request, a null entry.

use std::sync::Arc;

use kvsched::kv::{HostKvMemory, KvLayout, KvMemory, KvMemoryError};
use kvsched::{BlockId, BlockRef, BlockTable, CacheGroup, MambaMode};
use kvsched_testkit::KvChecker;

const BPT: usize = 8;
const STATE: usize = 32;
const BLOCKS: usize = 64;

/// Host memory that keeps no write epochs: its checker compares every unit at every read.
struct NoEpochs(HostKvMemory);

impl KvMemory for NoEpochs {
    fn layout(&self) -> &KvLayout {
        self.0.layout()
    }
    fn write(&self, g: usize, b: BlockId, off: usize, data: &[u8]) -> Result<(), KvMemoryError> {
        self.0.write(g, b, off, data)
    }
    fn read(&self, g: usize, b: BlockId, off: usize, out: &mut [u8]) -> Result<(), KvMemoryError> {
        self.0.read(g, b, off, out)
    }
}

/// The same checker twice: over memory with epochs (`fast`) and without (`full`).
struct Pair {
    mem: [Arc<dyn KvMemory>; 2],
    checker: [KvChecker; 2],
}

impl Pair {
    fn new(groups: Vec<CacheGroup>) -> Pair {
        let layout = KvLayout::for_groups(&groups, BPT, STATE).expect("layout");
        let fast: Arc<dyn KvMemory> =
            Arc::new(HostKvMemory::new(layout.clone(), BLOCKS).expect("memory"));
        let full: Arc<dyn KvMemory> =
            Arc::new(NoEpochs(HostKvMemory::new(layout, BLOCKS).expect("memory")));
        let checker = [
            KvChecker::new(groups.clone(), 3, BPT, STATE, Arc::clone(&fast)),
            KvChecker::new(groups.clone(), 3, BPT, STATE, Arc::clone(&full)),
        ];
        Pair {
            mem: [fast, full],
            checker,
        }
    }

    fn add(&mut self, id: &str, prompt: &[u32]) {
        self.checker
            .iter_mut()
            .for_each(|c| c.add_request(id, prompt));
    }

    /// One step of `id` on both; asserts they found the same garbage and returns it.
    fn compute(&mut self, id: &str, n: u64, k: u64, tables: &[BlockTable]) -> u64 {
        let [a, b] = &mut self.checker;
        let (fast, full) = (a.compute(id, n, k, tables), b.compute(id, n, k, tables));
        assert_eq!(
            fast, full,
            "{id} at {n}+{k}: garbage with epochs vs without"
        );
        fast
    }

    /// A write that is not the engine's (a load, a sharer, a poison) on both memories.
    fn write(&self, g: usize, block: BlockId, off: usize, data: &[u8]) {
        for m in &self.mem {
            m.write(g, block, off, data).expect("write");
        }
    }

    fn poison(&self, g: usize, block: BlockId) {
        for m in &self.mem {
            m.poison(g, block).expect("poison");
        }
    }

    fn block_bytes(&self, g: usize) -> usize {
        self.mem[0].layout().bytes_per_block(g).expect("group")
    }

    /// (units skipped by `fast`, bytes it compared, bytes `full` compared); asserts both made
    /// the same reads and counted the same garbage.
    fn totals(&self) -> (u64, u64, u64) {
        let [a, b] = [self.checker[0].counts(), self.checker[1].counts()];
        assert_eq!(a.units_read, b.units_read);
        assert_eq!(a.garbage_reads, b.garbage_reads);
        assert_eq!(a.null_reads, b.null_reads);
        assert_eq!(
            b.units_skipped, 0,
            "memory without epochs: every unit compared"
        );
        (a.units_skipped, a.kv_bytes_verified, b.kv_bytes_verified)
    }
}

fn tables(groups: usize, ids: &[BlockId]) -> Vec<BlockTable> {
    (0..groups)
        .map(|g| {
            ids.iter()
                .map(|&id| BlockRef {
                    id: if id == 0 { 0 } else { id + (g * 6) as u64 },
                    generation: 0,
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_checked_block_is_read_again_only_after_a_write_reaches_it() {
    let mut p = Pair::new(vec![CacheGroup::full_attention(16)]);
    let prompt: Vec<u32> = (1..=80).collect();
    p.add("a", &prompt);
    let t = tables(1, &[1, 2, 3, 4, 5]);
    assert_eq!(p.compute("a", 0, 64, &t), 0);
    assert_eq!(p.compute("a", 64, 1, &t), 0, "first read: all 64 compared");
    assert_eq!(p.totals().0, 0);
    assert_eq!(p.compute("a", 65, 1, &t), 0);
    let (skipped, fast, _) = p.totals();
    assert_eq!(skipped, 64, "blocks 1-4 unchanged since checked");
    assert_eq!(
        fast,
        (64 + 1) * BPT as u64,
        "only the token written since is compared"
    );

    // A sharer's recompute of other tokens into block 2 (token-sized writes at offsets).
    let mut other = prompt.clone();
    other[20] = 9_999;
    p.add("s", &other);
    assert_eq!(p.compute("s", 16, 16, &t), 0, "tokens 0..16 are s's too");
    assert_eq!(p.compute("a", 66, 1, &t), 12, "a reads s's bytes of 20..32");

    // A late load landing in block 3: one whole-block write. (Each step that reads garbage
    // writes its token as garbage: 66, 67, … count from the next step on.)
    p.write(0, 3, 0, &vec![7; p.block_bytes(0)]);
    assert_eq!(p.compute("a", 67, 1, &t), 12 + 16 + 1);
    // A poison of block 4, then a read that finds the same garbage again, unchanged.
    p.poison(0, 4);
    assert_eq!(p.compute("a", 68, 1, &t), 12 + 16 + 16 + 2);
    assert_eq!(
        p.compute("a", 69, 1, &t),
        12 + 16 + 16 + 3,
        "garbage counted at every read"
    );
    // Back to the right bytes: a recomputes 16..70 (66..70 were written as garbage by the
    // steps that read garbage), then reads nothing wrong.
    assert_eq!(p.compute("a", 16, 54, &t), 0, "block 1 intact");
    assert_eq!(p.compute("a", 70, 1, &t), 0);
    // A table that changed under the request (block 9 never written: poison), a null entry.
    let moved = tables(1, &[9, 2, 0, 4, 5]);
    assert_eq!(p.compute("a", 71, 1, &moved), 32);
    assert_eq!(p.compute("a", 72, 1, &moved), 32 + 1);
    assert!(p.checker[0].counts().null_reads >= 32);
    let (skipped, fast, full) = p.totals();
    assert!(skipped > 0 && fast < full, "{skipped} {fast} {full}");
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random steps, table changes and foreign writes on a hybrid geometry: both checkers agree
/// at every step, find garbage, and the one with epochs compares fewer bytes.
#[test]
fn random_rewrites_find_the_same_garbage_with_and_without_epochs() {
    let groups = vec![
        CacheGroup::full_attention(16),
        CacheGroup::sliding_window(16, 40),
        CacheGroup::mamba(16, MambaMode::All),
    ];
    let (mut garbage, mut skipped, mut fast, mut full) = (0, 0, 0, 0);
    for seed in 0..24u64 {
        let mut rng = Rng(seed);
        let mut p = Pair::new(groups.clone());
        let shared: Vec<u32> = (1..=32).collect();
        let mut reqs: Vec<(String, u64, Vec<BlockTable>)> = Vec::new();
        for r in 0..3u32 {
            let mut prompt = shared.clone();
            prompt.extend((0..64).map(|t| 1_000 * (r + 1) + t));
            let id = format!("r{r}");
            p.add(&id, &prompt);
            // Per group 20 blocks: attention entries 0-1 (the shared prefix) on the group's
            // first two, the rest (and every Mamba entry) the request's own.
            let own = 2 + 6 * u64::from(r);
            let t = (0..groups.len())
                .map(|g| {
                    (0..6u64)
                        .map(|i| {
                            let shared = i < 2 && g < 2;
                            let base = if shared { i } else { own + i };
                            BlockRef {
                                id: 1 + 20 * g as u64 + base,
                                generation: 0,
                            }
                        })
                        .collect()
                })
                .collect();
            reqs.push((id, 0, t));
        }
        for _ in 0..200 {
            let r = rng.below(3) as usize;
            match rng.below(20) {
                0 => {
                    // A table changes: a block reused, a preempted request on new blocks,
                    // or a freed entry (null).
                    let g = rng.below(groups.len() as u64) as usize;
                    let i = rng.below(6) as usize;
                    let id = if rng.below(4) == 0 {
                        0
                    } else {
                        1 + rng.below(BLOCKS as u64 - 1)
                    };
                    let mut t = reqs[r].2[g].to_vec();
                    t[i] = BlockRef { id, generation: 0 };
                    reqs[r].2[g] = t.into();
                }
                1 => {
                    // A foreign write: a whole-block load, a poison or one token's bytes.
                    let g = rng.below(groups.len() as u64) as usize;
                    let block = 1 + rng.below(BLOCKS as u64 - 1);
                    let bytes = p.block_bytes(g);
                    match rng.below(3) {
                        0 => p.write(g, block, 0, &vec![rng.next() as u8; bytes]),
                        1 => p.poison(g, block),
                        _ => {
                            let off = (rng.below((bytes / BPT) as u64) as usize) * BPT;
                            p.write(g, block, off, &[rng.next() as u8; BPT]);
                        }
                    }
                }
                // Rolled back to a block end at or below (where mode `all` keeps a state).
                2 => reqs[r].1 = rng.below(reqs[r].1 / 16 + 1) * 16,
                _ => {
                    let (id, n, t) = &reqs[r];
                    let n = *n;
                    if n >= 96 {
                        reqs[r].1 = rng.below(6) * 16;
                        continue;
                    }
                    let k = (1 + rng.below(20)).min(96 - n);
                    garbage += p.compute(id, n, k, t);
                    reqs[r].1 = n + k;
                }
            }
        }
        let (s, a, b) = p.totals();
        (skipped, fast, full) = (skipped + s, fast + a, full + b);
    }
    assert!(garbage > 0, "the scenarios read garbage");
    assert!(
        skipped > 0 && fast < full,
        "epochs skip rereads: {skipped} units, {fast} vs {full} bytes compared"
    );
}
