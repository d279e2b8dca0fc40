//! One report recovered by `K` shard threads through the real [`ClaimTable`] — the runtime's
//! claim path, applied to a replay scenario (`kvsched replay --engine runtime --shards K`).
//!
//! Requests are spread over the shards by id hash. Each shard thread scans its own requests
//! against the report and claims every hit with one `fetch_min`; after a barrier, it decides
//! its requests with ownership read back from the table. No thread sees another shard's
//! requests, so the result equals [`recovery::recover`] only if the claim protocol does: this
//! is the differential check of the protocol on arbitrary scenarios.
//!
//! Scenario ids are arbitrary and, with per-group pools, repeat across groups, so every
//! reported `(group, id)` pair gets a dense claim slot (in the runtime, the pool's block id is
//! the slot).

use rustc_hash::FxHashMap;

use kvsched::rules::geometry::{BlockId, Geometry};
use kvsched::rules::recovery::{
    self, Decision, Hit, HitOwner, InvalidSet, Mode, Outcome, Policy, Request, RequestClass,
};
use kvsched::runtime::claim::{ClaimTable, RequestKey, Scan};
use kvsched::runtime::route::shard_of;
use kvsched::sync::{thread, PhaseBarrier};

/// Recovers `requests` against `invalid` with `shards` threads (at least 1) and the claim
/// table; the result has the shape of [`recovery::recover`]'s.
///
/// Requests should have passed [`recovery::validate_requests`].
pub fn recover_sharded(
    geo: &Geometry,
    mode: Mode,
    policy: Policy,
    requests: &[Request],
    invalid: &InvalidSet,
    shards: usize,
) -> Outcome {
    let shards = shards.max(1);
    // Canonical keys: class, then input position within the class (priority 0).
    let keys: Vec<RequestKey> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| RequestKey::new(r.class == RequestClass::Sync, 0, i as u64 + 1))
        .collect();
    let slots = claim_slots(geo, requests, invalid);
    let table = ClaimTable::new(slots.len());
    for i in 0..slots.len() {
        table.reset(i as BlockId);
    }
    let barrier = PhaseBarrier::new(shards);
    let owner_of: Vec<Vec<usize>> = (0..shards)
        .map(|s| {
            (0..requests.len())
                .filter(|&i| shard_of(&requests[i].id, shards) == s)
                .collect()
        })
        .collect();
    let scan_of = |class| match (mode, class) {
        (Mode::Vllm, RequestClass::Sync) => Scan::Sync,
        _ => Scan::Async,
    };
    let shard_work = |mine: &[usize]| -> Vec<(usize, Decision<RequestKey>)> {
        // Claim phase.
        let mut scanned: Vec<(usize, Vec<Hit>)> = Vec::new();
        for &i in mine {
            let mut hits = Vec::new();
            recovery::scan_request(geo, requests[i].view(), invalid, &mut hits);
            let scan = scan_of(requests[i].class);
            for h in &hits {
                if let Some(&slot) = slots.get(&(h.group, h.block)) {
                    table.claim(slot as BlockId, scan, keys[i]);
                }
            }
            scanned.push((i, hits));
        }
        // Every shard has claimed before anyone decides.
        if !cfg!(kvsched_plant = "decide-early") {
            barrier.wait();
        }
        let mut out = Vec::new();
        let mut owners = Vec::new();
        for (i, hits) in &scanned {
            let scan = scan_of(requests[*i].class);
            owners.clear();
            owners.extend(hits.iter().map(|h| {
                match slots
                    .get(&(h.group, h.block))
                    .and_then(|&s| table.winner(s as BlockId, scan))
                {
                    Some(w) if w != keys[*i] => HitOwner::Other(w),
                    _ => HitOwner::Mine,
                }
            }));
            out.push((
                *i,
                recovery::decide(geo, mode, policy, requests[*i].view(), hits, &owners),
            ));
        }
        if cfg!(kvsched_plant = "decide-early") {
            // Planted bug (scripts/plants.sh): deciding before every shard has claimed.
            barrier.wait();
        }
        out
    };
    let mut decided: Vec<(usize, Decision<RequestKey>)> = Vec::new();
    thread::scope(|s| {
        let handles: Vec<_> = owner_of[1..]
            .iter()
            .map(|mine| s.spawn(|| shard_work(mine)))
            .collect();
        decided.extend(shard_work(&owner_of[0]));
        for h in handles {
            // A shard thread only panics on a bug; its requests then stay undecided and are
            // reported unaffected rather than taking the caller down.
            if let Ok(v) = h.join() {
                decided.extend(v);
            }
        }
    });
    assemble(requests, keys, decided)
}

/// Dense claim slots for every (group, id) the report names in some table.
fn claim_slots(
    geo: &Geometry,
    requests: &[Request],
    invalid: &InvalidSet,
) -> FxHashMap<(u32, BlockId), usize> {
    let mut slots: FxHashMap<(u32, BlockId), usize> = FxHashMap::default();
    let mut hits = Vec::new();
    for r in requests {
        hits.clear();
        recovery::scan_request(geo, r.view(), invalid, &mut hits);
        for h in &hits {
            let n = slots.len();
            slots.entry((h.group, h.block)).or_insert(n);
        }
    }
    slots
}

/// Turns per-request decisions (owners as keys) into an [`Outcome`] (owners as indices).
fn assemble(
    requests: &[Request],
    keys: Vec<RequestKey>,
    decided: Vec<(usize, Decision<RequestKey>)>,
) -> Outcome {
    let index_of: FxHashMap<RequestKey, usize> =
        keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let mut per: Vec<Option<Decision<usize>>> = vec![None; requests.len()];
    for (i, d) in decided {
        let waits_for = d
            .waits_for
            .iter()
            .filter_map(|(b, k)| index_of.get(k).map(|&o| (*b, o)))
            .collect();
        per[i] = Some(Decision {
            disposition: d.disposition,
            num_computed_tokens: d.num_computed_tokens,
            affected_tokens: d.affected_tokens,
            claimed_blocks: d.claimed_blocks,
            waits_for,
            evicted_blocks: d.evicted_blocks,
        });
    }
    let requests_out: Vec<Decision<usize>> = per
        .into_iter()
        .zip(requests)
        .map(|(d, r)| d.unwrap_or_else(|| Decision::unaffected(r.num_computed_tokens)))
        .collect();
    recovery::outcome_from_decisions(requests, requests_out)
}
