//! Redis Cluster routing: the hash slot of a key (CRC16/XMODEM mod 16384, with Redis's hash
//! tag rule), the slot map learnt from `CLUSTER SLOTS`, and the registry of node pools.
//!
//! The tier groups a call's keys by the node owning their slot and sends one pipeline per
//! node; a `MOVED` reply refreshes the map (once per map generation, however many callers
//! see it) and an `ASK` reply sends the key once to the importing node after `ASKING`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ::redis::Value;

use super::conn::Budget;
use super::reply::Limits;

use super::config::NodeAddr;
use super::node::Node;
use super::pool::backoff_delay;
use super::resp;
use crate::kv::TierError;
use crate::sync::{Arc, Mutex, Ordering, RwLock};

/// Number of hash slots.
pub(crate) const SLOTS: usize = 16384;
/// The most nodes a tier keeps pools for (a cluster this large is out of scope).
const MAX_NODES: usize = 1024;

/// The least time between two slot-map refreshes that calls failing on a node ask for
/// ([`Cluster::refresh_after_failure`]): a dead node fails every call at once, and each would
/// otherwise ask for the map.
const FAILURE_REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The least share of a refresh's time one node gets to answer `CLUSTER SLOTS`.
const MIN_ASK: Duration = Duration::from_millis(100);
/// `owner` entry of an unassigned slot.
const NONE: u16 = u16::MAX;

/// CRC16/XMODEM's table (polynomial 0x1021), built at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        t[i] = crc;
        i += 1;
    }
    t
};

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with.
pub(crate) fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The hash slot of `key`: of the part between the first `{` and the next `}` if that part
/// is non-empty (a hash tag), else of the whole key.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// Slot ranges and their primary's address, from a `CLUSTER SLOTS` reply. An empty or `?`
/// host means "the node you asked" (`queried`). Ranges covering more than [`SLOTS`] slots in
/// all overlap, which no cluster answers: refused, as the map built from them would cost a
/// write per slot per range (40,000 ranges of every slot, in a 2 MB reply, held a call 16 s
/// past a 300 ms deadline in a debug build).
pub(crate) fn parse_slots(
    v: &Value,
    queried: &NodeAddr,
) -> Result<Vec<(u16, u16, NodeAddr)>, String> {
    let Value::Array(ranges) = v else {
        return Err(format!("CLUSTER SLOTS: not an array: {}", resp::kind(v)));
    };
    let mut out = Vec::with_capacity(ranges.len().min(SLOTS));
    let mut covered = 0usize;
    for r in ranges {
        let Value::Array(fields) = r else {
            return Err("CLUSTER SLOTS: a range is not an array".into());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err("CLUSTER SLOTS: a range lacks start, end or primary".into());
        };
        let (start, end) = match (u16::try_from(*start), u16::try_from(*end)) {
            (Ok(s), Ok(e)) if s <= e && usize::from(e) < SLOTS => (s, e),
            _ => return Err("CLUSTER SLOTS: slot range out of 0..16384".into()),
        };
        covered += usize::from(end - start) + 1;
        // Planted bug `cluster-slots-overlap-accepted` (scripts/plants.sh): any number of
        // ranges over the same slots is taken.
        if covered > SLOTS && !planted!("cluster-slots-overlap-accepted") {
            return Err("CLUSTER SLOTS: ranges overlap (more than 16384 slots in all)".into());
        }
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err("CLUSTER SLOTS: primary has no host".into()),
        };
        let port = match primary.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).ok().filter(|&p| p != 0),
            _ => None,
        }
        .ok_or("CLUSTER SLOTS: primary has no valid port")?;
        let host = if host.is_empty() || host == "?" {
            queried.host.clone()
        } else if resp::host_ok(&host) {
            host
        } else {
            return Err("CLUSTER SLOTS: a primary's host is not a host name".into());
        };
        out.push((start, end, NodeAddr { host, port }));
    }
    Ok(out)
}

/// Which node owns each slot, at one generation of the map.
pub(crate) struct SlotMap {
    /// Index into `nodes` per slot, or [`NONE`].
    owner: Vec<u16>,
    nodes: Vec<Arc<Node>>,
    generation: u64,
}

impl SlotMap {
    fn empty() -> SlotMap {
        SlotMap {
            owner: vec![NONE; SLOTS],
            nodes: Vec::new(),
            generation: 0,
        }
    }

    /// The node owning `slot`, if the map knows one.
    pub fn node_for(&self, slot: u16) -> Option<&Arc<Node>> {
        let i = *self.owner.get(usize::from(slot))?;
        self.nodes.get(usize::from(i))
    }

    /// The map's generation (bumped by every refresh).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The nodes owning at least one slot.
    pub fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }
}

/// Makes the node (client and pool) for an address.
pub(crate) type MakeNode = Box<dyn Fn(&NodeAddr) -> Result<Node, String> + Send + Sync>;

/// A cluster's seeds, slot map and node registry.
pub(crate) struct Cluster {
    seeds: Vec<NodeAddr>,
    make: MakeNode,
    registry: Mutex<BTreeMap<NodeAddr, Arc<Node>>>,
    map: RwLock<Arc<SlotMap>>,
    /// Serialises refreshes; holds the failed ones' backoff.
    refreshing: Mutex<RefreshBackoff>,
    /// When a call failing on a node last asked for a refresh.
    failure_refresh: Mutex<Option<Instant>>,
    /// The backoff's first delay and its cap ([`RedisConfig::backoff`]).
    ///
    /// [`RedisConfig::backoff`]: super::RedisConfig::backoff
    backoff: (Duration, Duration),
    shared: Arc<super::node::Shared>,
}

/// Refreshes that found no usable map, one after the other: until `until`, a refresh
/// fails at once with `last` instead of asking every node again (a seed answering a slot
/// map it takes 100 ms to refuse would cost every call that long).
#[derive(Default)]
struct RefreshBackoff {
    failures: u32,
    until: Option<Instant>,
    last: String,
}

impl Cluster {
    /// A cluster reached through `seeds`; learns its map on first use.
    pub fn new(
        seeds: Vec<NodeAddr>,
        make: MakeNode,
        backoff: (Duration, Duration),
        shared: Arc<super::node::Shared>,
    ) -> Cluster {
        Cluster {
            seeds,
            make,
            registry: Mutex::new(BTreeMap::new()),
            map: RwLock::new(Arc::new(SlotMap::empty())),
            refreshing: Mutex::new(RefreshBackoff::default()),
            failure_refresh: Mutex::new(None),
            backoff,
            shared,
        }
    }

    /// The current map.
    pub fn map(&self) -> Arc<SlotMap> {
        Arc::clone(&self.map.read())
    }

    /// Every node the tier keeps a pool for.
    pub fn registered(&self) -> Vec<Arc<Node>> {
        self.registry.lock().values().cloned().collect()
    }

    /// The node at `addr` (created on first use).
    pub fn node(&self, addr: &NodeAddr) -> Result<Arc<Node>, TierError> {
        let mut reg = self.registry.lock();
        if let Some(n) = reg.get(addr) {
            return Ok(Arc::clone(n));
        }
        if reg.len() >= MAX_NODES {
            return Err(TierError::Unavailable(format!(
                "cluster: more than {MAX_NODES} nodes"
            )));
        }
        let node = Arc::new((self.make)(addr).map_err(TierError::Unavailable)?);
        reg.insert(addr.clone(), Arc::clone(&node));
        Ok(node)
    }

    /// Reloads the slot map from the first node (of the current map, then the seeds) that
    /// answers `CLUSTER SLOTS` with at least one range. Does nothing if the map's generation
    /// is no longer `seen` (another caller refreshed it meanwhile). After a refresh that found
    /// no map, the next ones fail at once for the node backoff's delay (doubling per failed
    /// refresh, capped), with its error.
    pub fn refresh(&self, seen: u64, budget: Budget<'_>) -> Result<(), TierError> {
        // Another call's refresh may be asking a hung node under that call's later deadline:
        // wait for it no longer than this call may.
        // Planted bug `refresh-waits-on-lock` (scripts/plants.sh): it waits for as long as
        // the other refresh takes.
        let held = if planted!("refresh-waits-on-lock") {
            Some(self.refreshing.lock())
        } else {
            self.refreshing.try_lock_until(budget.deadline)
        };
        let Some(backoff) = held else {
            return Err(TierError::Timeout(self.shared.io_timeout));
        };
        self.refresh_locked(backoff, seen, budget)
    }

    /// [`refresh`](Self::refresh) holding its lock.
    fn refresh_locked(
        &self,
        mut backoff: crate::sync::MutexGuard<'_, RefreshBackoff>,
        seen: u64,
        budget: Budget<'_>,
    ) -> Result<(), TierError> {
        let current = self.map();
        if current.generation != seen {
            return Ok(());
        }
        if let Some(until) = backoff.until {
            let now = Instant::now();
            if now < until {
                return Err(TierError::Unavailable(format!(
                    "cluster: no slot map, next try in {} ms (last error: {})",
                    (until - now).as_millis(),
                    backoff.last
                )));
            }
        }
        let outcome = self.refresh_now(seen, &current, budget);
        match &outcome {
            Ok(()) => *backoff = RefreshBackoff::default(),
            Err(e) => {
                backoff.failures = backoff.failures.saturating_add(1);
                let (initial, max) = self.backoff;
                backoff.until =
                    Some(Instant::now() + backoff_delay(initial, max, backoff.failures));
                backoff.last = e.to_string();
            }
        }
        outcome
    }

    /// A refresh for a call that failed on a node of the map of generation `seen` (refused,
    /// reset, timed out, down): the node may be gone and its slots served by another (a
    /// replica promoted), which nothing else would tell — a dead node sends no `MOVED`. At
    /// most one such refresh runs per [`FAILURE_REFRESH_EVERY`]; the others do nothing.
    ///
    /// A call with less than [`MIN_ASK`] of its time left does not ask (a later one will: the
    /// failing node now fails calls at once, with their time left), nor does one finding
    /// another refresh under way (it is asking already), so the refresh never runs past the
    /// call's deadline nor fails for want of time.
    pub fn refresh_after_failure(&self, seen: u64, budget: Budget<'_>) {
        // Planted bug `redis-refresh-on-spent-time` (scripts/plants.sh, with node.rs): the
        // refresh runs on whatever time is left, and a node it asks with none is marked down.
        if budget.remaining() < MIN_ASK && !planted!("redis-refresh-on-spent-time") {
            return;
        }
        let held = if planted!("refresh-waits-on-lock") {
            Some(self.refreshing.lock())
        } else {
            self.refreshing.try_lock()
        };
        let Some(backoff) = held else {
            return;
        };
        {
            let mut last = self.failure_refresh.lock();
            let now = Instant::now();
            if last.is_some_and(|t| now < t + FAILURE_REFRESH_EVERY) {
                return;
            }
            *last = Some(now);
        }
        // Its failure is the refresh backoff's; the call reports its own error.
        let _ = self.refresh_locked(backoff, seen, budget);
    }

    /// [`refresh`](Self::refresh)'s asking, under its lock.
    fn refresh_now(
        &self,
        seen: u64,
        current: &SlotMap,
        budget: Budget<'_>,
    ) -> Result<(), TierError> {
        self.shared
            .counters
            .slot_refreshes
            .fetch_add(1, Ordering::Relaxed);
        let mut candidates: Vec<NodeAddr> = current.nodes.iter().map(|n| n.addr.clone()).collect();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        // Nodes that are down last (stable: the map's order, then the seeds'), and none given
        // more than its share of the time left: a hung node must not spend it all (planted
        // bug `cluster-refresh-asks-in-order`: the whole budget, in the map's order).
        let in_order = planted!("cluster-refresh-asks-in-order");
        if !in_order {
            let registry = self.registry.lock();
            candidates.sort_by_key(|a| registry.get(a).is_some_and(|n| n.is_down()));
        }
        let packed = resp::pack(&[&[b"CLUSTER", b"SLOTS"]]);
        let mut errors: Vec<String> = Vec::new();
        let asked = candidates.len();
        for (k, addr) in candidates.into_iter().enumerate() {
            let share =
                (budget.remaining() / u32::try_from(asked - k).unwrap_or(u32::MAX)).max(MIN_ASK);
            let ask = Budget {
                deadline: if in_order {
                    budget.deadline
                } else {
                    budget.deadline.min(Instant::now() + share)
                },
                cancel: budget.cancel,
            };
            let answer = self
                .node(&addr)
                .and_then(|n| {
                    let slots = |v: &Value| matches!(v, Value::Array(_));
                    n.request(&packed, 1, Some(&Limits::control()), &slots, ask)
                })
                .and_then(|replies| {
                    let v = replies.first().ok_or_else(|| {
                        TierError::Unavailable(format!("{addr}: no reply to CLUSTER SLOTS"))
                    })?;
                    if let Some(e) = resp::error_text(v) {
                        return Err(TierError::Unavailable(format!("{addr}: {e}")));
                    }
                    parse_slots(v, &addr)
                        .map_err(|e| TierError::Unavailable(format!("{addr}: {e}")))
                });
            match answer {
                Ok(ranges) if !ranges.is_empty() => return self.install(ranges, seen),
                Ok(_) => errors.push(format!("{addr}: no slots assigned")),
                Err(TierError::Timeout(_)) => errors.push(format!("{addr}: no answer in time")),
                Err(TierError::Unavailable(e)) => errors.push(e),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(TierError::Unavailable(match errors.len() {
            0 => "cluster: no seed node".into(),
            1 => errors.remove(0),
            n => format!(
                "cluster: no slot map from {n} nodes ({}{})",
                errors[..n.min(3)].join("; "),
                if n > 3 { "; …" } else { "" }
            ),
        }))
    }

    fn install(&self, ranges: Vec<(u16, u16, NodeAddr)>, seen: u64) -> Result<(), TierError> {
        let mut map = SlotMap::empty();
        map.generation = seen + 1;
        // Each node's index in `map.nodes`, by address (up to 16384 ranges, 1024 nodes).
        let mut index: BTreeMap<NodeAddr, usize> = BTreeMap::new();
        for (start, end, addr) in ranges {
            let idx = match index.get(&addr) {
                Some(&i) => i,
                None => {
                    map.nodes.push(self.node(&addr)?);
                    index.insert(addr, map.nodes.len() - 1);
                    map.nodes.len() - 1
                }
            };
            let idx = u16::try_from(idx)
                .map_err(|_| TierError::Unavailable("cluster: too many nodes".into()))?;
            for slot in start..=end {
                map.owner[usize::from(slot)] = idx;
            }
        }
        // Forget nodes that are neither seeds nor owners (dropping their idle connections).
        self.registry
            .lock()
            .retain(|a, _| self.seeds.contains(a) || map.nodes.iter().any(|n| &n.addr == a));
        *self.map.write() = Arc::new(map);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec() {
        // The Redis Cluster specification's test vector.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn key_slot_follows_the_hash_tag_rule() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"{user1000}.followers"),
            key_slot(b"{user1000}.following")
        );
        // Empty tag, or no closing brace: the whole key.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), crc16(b"{bar") % 16384);
    }

    #[test]
    fn parse_slots_reads_ranges_and_fills_unknown_hosts() {
        let q = NodeAddr {
            host: "10.0.0.9".into(),
            port: 1,
        };
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("", 7001),
                node("x", 1),
            ]),
        ]);
        let r = parse_slots(&v, &q).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].0, r[0].1, r[0].2.to_string().as_str()),
            (0, 5460, "127.0.0.1:7000")
        );
        assert_eq!(
            (r[1].0, r[1].1, r[1].2.to_string().as_str()),
            (5461, 16383, "10.0.0.9:7001")
        );
        let bad = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16384),
            node("h", 1),
        ])]);
        assert!(parse_slots(&bad, &q).is_err());
        assert!(parse_slots(&Value::Nil, &q).is_err());
        // Every slot twice: ranges that overlap.
        let twice = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(16383), node("h", 1)]),
            Value::Array(vec![Value::Int(5), Value::Int(5), node("h", 1)]),
        ]);
        let e = parse_slots(&twice, &q).unwrap_err();
        assert!(e.contains("overlap"), "{e}");
    }
}
