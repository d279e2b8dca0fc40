//! A call's rounds: one pipeline per node it touches, resent where a cluster redirects,
//! until every key has a reply that is not a redirect.

use ::redis::Value;

use super::cluster::{key_slot, SlotMap};
use super::config::NodeAddr;
use super::conn::Budget;
use super::node::Node;
use super::{reply, resp, RedisTier, Topology};
use crate::connector::CancelToken;
use crate::kv::{ChunkKey, TierError};
use crate::sync::{Arc, Ordering};

/// What a call does to each key.
#[derive(Clone, Copy)]
pub(super) enum Op<'a> {
    Exists,
    Get,
    Put(&'a [(ChunkKey, Vec<u8>)]),
    Del,
}

impl Op<'_> {
    /// Whether `v` is a reply this operation's command gives (other than an error reply):
    /// any other is a sign the connection's replies fell out of step with its commands.
    fn answers(self, v: &Value) -> bool {
        match self {
            Op::Exists | Op::Del => matches!(v, Value::Int(_)),
            Op::Get => matches!(v, Value::BulkString(_) | Value::Nil),
            Op::Put(_) => matches!(v, Value::Okay),
        }
    }
}

/// One node's share of a round: key indices, each with whether it goes after `ASKING`.
type Group = Vec<(usize, bool)>;

/// Where a pending key goes in the next round.
enum Target {
    /// The owner of its slot by the current map.
    Slot,
    /// The node a `MOVED` named.
    Moved(NodeAddr),
    /// The node an `ASK` named (sent after `ASKING`).
    Ask(NodeAddr),
}

impl RedisTier {
    /// The node for a key in a round: by slot (refreshing an empty cluster map), or the
    /// redirect's node.
    fn target_node(
        &self,
        map: &mut Option<Arc<SlotMap>>,
        slot: u16,
        target: &Target,
        budget: Budget<'_>,
    ) -> Result<Arc<Node>, TierError> {
        let cluster = match &self.topology {
            Topology::Single(n) => return Ok(Arc::clone(n)),
            Topology::Cluster(c) => c,
        };
        match target {
            Target::Moved(a) | Target::Ask(a) => cluster.node(a),
            Target::Slot => {
                let m = map.get_or_insert_with(|| cluster.map());
                if let Some(n) = m.node_for(slot) {
                    return Ok(Arc::clone(n));
                }
                let seen = m.generation();
                cluster.refresh(seen, budget)?;
                let m = map.insert(cluster.map());
                m.node_for(slot).cloned().ok_or_else(|| {
                    TierError::Unavailable(format!("cluster: slot {slot} has no node"))
                })
            }
        }
    }

    /// Runs `op` on `keys`: rounds of one pipeline per node until every key has a reply
    /// that is not a redirect. Returns each key's reply, in order.
    pub(super) fn run(
        &self,
        keys: &[ChunkKey],
        op: Op<'_>,
        cancel: Option<&CancelToken>,
    ) -> Result<Vec<Value>, TierError> {
        let budget = self.budget(cancel);
        let names: Vec<Vec<u8>> = keys.iter().map(|&k| self.redis_key(k)).collect();
        // Slots matter only to a cluster.
        let slots: Vec<u16> = match self.topology {
            Topology::Cluster(_) => names.iter().map(|n| key_slot(n)).collect(),
            Topology::Single(_) => vec![0; names.len()],
        };
        let mut out: Vec<Value> = vec![Value::Nil; keys.len()];
        let mut pending: Vec<(usize, Target)> =
            (0..keys.len()).map(|i| (i, Target::Slot)).collect();
        let mut rounds = 0u32;
        while !pending.is_empty() {
            if rounds > self.config.max_redirects {
                return Err(TierError::Unavailable(format!(
                    "cluster: still redirected after {} redirects",
                    self.config.max_redirects
                )));
            }
            rounds += 1;
            // Group by node, in order of first appearance.
            let mut map = None;
            let mut groups: Vec<(Arc<Node>, Group)> = Vec::new();
            for (i, target) in pending.drain(..) {
                let node = self.target_node(&mut map, slots[i], &target, budget)?;
                let asking = matches!(target, Target::Ask(_));
                match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                    Some((_, g)) => g.push((i, asking)),
                    None => groups.push((node, vec![(i, asking)])),
                }
            }
            // The generation of the map this round routed by (a round of redirects only:
            // the current one).
            let seen = match (&self.topology, &map) {
                (Topology::Cluster(_), Some(m)) => m.generation(),
                (Topology::Cluster(c), None) => c.map().generation(),
                (Topology::Single(_), _) => 0,
            };
            let mut moved = false;
            for (node, group) in groups {
                if cancel.is_some_and(|c| c.is_cancelled()) {
                    return Err(TierError::Cancelled);
                }
                let (packed, replies) = self.pack(op, &names, &group);
                let asking = group.iter().any(|&(_, a)| a);
                let accept = |v: &Value| op.answers(v) || (asking && matches!(v, Value::Okay));
                let values = match node.request(&packed, replies, None, &accept, budget) {
                    Ok(values) => values,
                    Err(e) => {
                        if self.rerouted(&node, &group, &slots, seen, &e, budget) {
                            pending.extend(group.iter().map(|&(i, _)| (i, Target::Slot)));
                            continue;
                        }
                        return Err(e);
                    }
                };
                let mut values = values.into_iter();
                for &(i, asking) in &group {
                    if asking {
                        // The ASKING reply.
                        if let Some(e) = values.next().as_ref().and_then(resp::error_text) {
                            return Err(self.server_error(&node, &e, op));
                        }
                    }
                    let v = values.next().ok_or_else(|| {
                        TierError::Unavailable(format!("{}: missing reply", node.addr))
                    })?;
                    if let Some((ask, to)) = resp::redirect(&v) {
                        if matches!(self.topology, Topology::Single(_)) {
                            return Err(TierError::Unavailable(format!(
                                "{}: redirected: the server is a cluster node (configure a \
                                 cluster: several seeds or cluster=yes)",
                                node.addr
                            )));
                        }
                        self.shared
                            .counters
                            .redirects
                            .fetch_add(1, Ordering::Relaxed);
                        moved |= !ask;
                        pending.push((
                            i,
                            if ask {
                                Target::Ask(to)
                            } else {
                                Target::Moved(to)
                            },
                        ));
                        continue;
                    }
                    match resp::error_text(&v) {
                        // Someone else's non-string value under our key: not a chunk.
                        Some(_)
                            if matches!(op, Op::Get)
                                && resp::error_code(&v) == Some("WRONGTYPE") => {}
                        // A value past the bound, read past unkept: held, but no chunk of
                        // ours — handed back empty, it fails the chunk's checks.
                        Some(_)
                            if matches!(op, Op::Get)
                                && resp::error_code(&v) == Some(reply::OVERSIZED) =>
                        {
                            self.shared
                                .counters
                                .oversized_values
                                .fetch_add(1, Ordering::Relaxed);
                            out[i] = Value::BulkString(Vec::new());
                        }
                        Some(e) => return Err(self.server_error(&node, &e, op)),
                        None => out[i] = v,
                    }
                }
            }
            if moved {
                if let Topology::Cluster(c) = &self.topology {
                    // A failed refresh is not the call's failure: the MOVED targets are known.
                    let _ = c.refresh(c.map().generation(), budget);
                }
            }
        }
        Ok(out)
    }

    /// After `node` failed `group`'s pipeline with `e` (of a round on the map of generation
    /// `seen`): whether the cluster's map, refreshed, now gives none of the group's slots to
    /// `node`, so the keys go to their new owners in the next round — a failover promoted a
    /// replica in the dead node's place. A server's error reply and a cancel are the call's.
    fn rerouted(
        &self,
        node: &Arc<Node>,
        group: &Group,
        slots: &[u16],
        seen: u64,
        e: &TierError,
        budget: Budget<'_>,
    ) -> bool {
        let Topology::Cluster(c) = &self.topology else {
            return false;
        };
        if !matches!(e, TierError::Unavailable(_) | TierError::Timeout(_))
            || planted!("cluster-no-refresh-on-node-failure")
        {
            return false;
        }
        c.refresh_after_failure(seen, budget);
        let map = c.map();
        map.generation() != seen
            && group.iter().all(|&(i, _)| {
                map.node_for(slots[i])
                    .is_some_and(|owner| !Arc::ptr_eq(owner, node))
            })
    }

    /// The pipeline for `group` (indices into `names`, with `ASKING` first where set) and
    /// the number of replies it gets.
    fn pack(&self, op: Op<'_>, names: &[Vec<u8>], group: &[(usize, bool)]) -> (Vec<u8>, usize) {
        let value_bytes: usize = match op {
            Op::Put(chunks) => group.iter().map(|&(i, _)| chunks[i].1.len()).sum(),
            _ => 0,
        };
        let mut buf = Vec::with_capacity(
            value_bytes + group.len() * (self.prefix.len() + 32 + resp::overhead(5)),
        );
        let mut replies = 0;
        for &(i, asking) in group {
            if asking {
                resp::push_command(&mut buf, &[b"ASKING"]);
                replies += 1;
            }
            let name = names[i].as_slice();
            match op {
                Op::Exists => resp::push_command(&mut buf, &[b"EXISTS", name]),
                Op::Get => resp::push_command(&mut buf, &[b"GET", name]),
                Op::Del => resp::push_command(&mut buf, &[b"DEL", name]),
                Op::Put(chunks) => match &self.ttl_ms {
                    Some(ms) => {
                        resp::push_command(&mut buf, &[b"SET", name, &chunks[i].1, b"PX", ms])
                    }
                    None => resp::push_command(&mut buf, &[b"SET", name, &chunks[i].1]),
                },
            }
            replies += 1;
        }
        (buf, replies)
    }

    fn server_error(&self, node: &Node, text: &str, op: Op<'_>) -> TierError {
        let msg = format!("{}: {text}", node.addr);
        if matches!(op, Op::Put(_)) && text.starts_with("OOM") {
            TierError::Refused(msg)
        } else {
            TierError::Unavailable(msg)
        }
    }
}
