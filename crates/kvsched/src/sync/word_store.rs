//! [`store_words_xor`]: bytes stored into atomic words sixteen bytes per store instruction.
//!
//! `HostKvMemory` keeps KV bytes in `AtomicU64` words so that a racing access (which the
//! runtime's rules exclude) tears bytes instead of being undefined behaviour. Rust has no
//! atomic store wider than a word, and the compiler never merges atomic stores, so a copy
//! made of `AtomicU64::store`s issues one 8-byte store per word: on current x86 cores that is
//! under half the store bandwidth a `memcpy` gets from 16- and 32-byte stores, and on a
//! 16 KiB block it is most of a verified load's time.
//!
//! On x86-64 this module stores 64 bytes a round with SSE2 (`movdqu`: part of every x86-64
//! core, no feature detection) from inline assembly. Elsewhere, and under loom, it stores
//! nothing and the caller's word loop does the whole copy.
//!
//! **Why this is sound.** The assembly writes only memory the caller's `&[AtomicU64]` covers
//! (interior mutability: writing through a shared reference to an atomic is what atomics
//! are for), reads only the caller's `&[u8]`, and is opaque to the compiler (no `nomem` or
//! `readonly`: it may not assume the words unchanged across it). Without a racing access —
//! which the runtime's rules exclude for KV memory — it is a plain copy. With one, what it
//! does is what a sequence of relaxed 8-byte atomic stores does, on the assumption that an
//! x86-64 core writes each aligned quadword of a 16-byte store as one access: the vendors
//! guarantee it for aligned accesses of up to a quadword and describe wider SSE accesses as
//! made of several accesses (Intel SDM vol. 3, "Guaranteed Atomic Operations"; AMD APM
//! vol. 2, "Access Atomicity"); every word written here is 8-byte aligned. A racing reader
//! then sees each word old or new, as with `AtomicU64::store`. No ordering is implied beyond
//! Relaxed: the callers' ordering comes from their hand-offs (and the write epoch's Release
//! bump after the copy).
//!
//! (32-byte AVX2 stores were tried: in interleaved runs they gained at 16 KiB chunks and
//! lost a quarter of the bandwidth at 2 MiB ones, so they are not used.)

use super::AtomicU64;

/// Stores the words of `data` (native byte order), each XOR `mask`, into `words`, 64 bytes
/// (eight words) a round, for as many whole rounds as both hold; the number of words stored
/// (a multiple of 8, possibly 0). The rest is the caller's: it stores the words from the
/// returned index on one at a time.
#[cfg(all(target_arch = "x86_64", not(kvsched_loom), not(miri)))]
pub(crate) fn store_words_xor(words: &[AtomicU64], data: &[u8], mask: u64) -> usize {
    let rounds = words.len().min(data.len() / 8) / 8;
    if rounds == 0 {
        return 0;
    }
    let dst = words.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: `rounds * 64` bytes from `data.as_ptr()` are inside `data` (rounds ≤
    // data.len() / 64), and `rounds * 64` bytes from `dst` are inside `words` (rounds ≤
    // words.len() / 8); `movdqu` needs no alignment. The words are atomics, which may be
    // written through a shared reference; the module's docs say why these stores are as
    // sound as `AtomicU64::store`s racing or not. The assembly touches no stack and no other
    // memory, clobbers only the registers named (and the flags: no `preserves_flags`).
    unsafe {
        std::arch::asm!(
            "movq {m}, {mask}",
            "punpcklqdq {m}, {m}",
            "2:",
            "movdqu {a}, xmmword ptr [{src}]",
            "movdqu {b}, xmmword ptr [{src} + 16]",
            "movdqu {c}, xmmword ptr [{src} + 32]",
            "movdqu {d}, xmmword ptr [{src} + 48]",
            "pxor {a}, {m}",
            "pxor {b}, {m}",
            "pxor {c}, {m}",
            "pxor {d}, {m}",
            "movdqu xmmword ptr [{dst}], {a}",
            "movdqu xmmword ptr [{dst} + 16], {b}",
            "movdqu xmmword ptr [{dst} + 32], {c}",
            "movdqu xmmword ptr [{dst} + 48], {d}",
            "add {src}, 64",
            "add {dst}, 64",
            "dec {n}",
            "jnz 2b",
            mask = in(reg) mask,
            src = inout(reg) data.as_ptr() => _,
            dst = inout(reg) dst => _,
            n = inout(reg) rounds => _,
            m = out(xmm_reg) _,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack),
        );
    }
    rounds * 8
}

/// Stores nothing (no vector path on this target, or under loom): the caller's word loop
/// does the whole copy.
#[cfg(not(all(target_arch = "x86_64", not(kvsched_loom), not(miri))))]
pub(crate) fn store_words_xor(words: &[AtomicU64], data: &[u8], mask: u64) -> usize {
    let _ = (words, data, mask);
    0
}

#[cfg(all(test, not(kvsched_loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;

    #[test]
    fn stores_whole_rounds_xor_the_mask_and_nothing_past_them() {
        let mask = 0xA5A5_A5A5_A5A5_A5A5u64;
        for (nwords, nbytes) in [(0, 0), (7, 64), (8, 63), (8, 64), (17, 200), (40, 136)] {
            let words: Vec<AtomicU64> = (0..nwords).map(|_| AtomicU64::new(7)).collect();
            let data: Vec<u8> = (0..nbytes).map(|i| (i * 37 + 1) as u8).collect();
            let done = store_words_xor(&words, &data, mask);
            let rounds = nwords.min(nbytes / 8) / 8;
            if cfg!(all(target_arch = "x86_64", not(miri))) {
                assert_eq!(done, rounds * 8, "{nwords} words, {nbytes} bytes");
            }
            assert_eq!(done % 8, 0);
            for (i, w) in words.iter().enumerate() {
                let got = w.load(Ordering::Relaxed);
                if i < done {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&data[i * 8..i * 8 + 8]);
                    assert_eq!(got, u64::from_ne_bytes(b) ^ mask, "word {i}");
                } else {
                    assert_eq!(got, 7, "word {i} past the rounds was written");
                }
            }
        }
    }
}
