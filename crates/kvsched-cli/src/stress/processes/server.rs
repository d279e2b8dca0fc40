//! The Redis server the parent owns with `--store redis`: one `LocalRedis`, or a
//! `LocalCluster` with `--redis-cluster N`; started before the engines, restarted by
//! `--redis-restarts`, stopped (with its directory removed) on drop.

use super::super::store::StoreSpec;
use super::args::Plan;

/// The owned server (feature `redis`).
#[cfg(feature = "redis")]
pub enum OwnedServer {
    /// One server.
    Single(Box<kvsched_testkit::redis::LocalRedis>),
    /// A cluster.
    Cluster(kvsched_testkit::redis::LocalCluster),
}

/// Without feature `redis` there is never an owned server.
#[cfg(not(feature = "redis"))]
pub enum OwnedServer {}

#[cfg(feature = "redis")]
impl OwnedServer {
    /// Starts the server `plan` asks for (`None` unless `--store redis`).
    pub fn start(plan: &Plan) -> Result<Option<OwnedServer>, String> {
        use kvsched_testkit::redis::{LocalCluster, LocalRedis, LocalRedisOptions};
        if plan.store != StoreSpec::Redis {
            return Ok(None);
        }
        let mut options = LocalRedisOptions::new();
        if let Some(m) = plan.maxmemory {
            options = options.maxmemory(m);
        }
        let server = match plan.cluster {
            Some(n) => OwnedServer::Cluster(
                LocalCluster::start_with(n, options)
                    .map_err(|e| format!("--redis-cluster {n}: {e}"))?,
            ),
            None => OwnedServer::Single(
                LocalRedis::start(options)
                    .map(Box::new)
                    .map_err(|e| format!("--store redis: {e}"))?,
            ),
        };
        Ok(Some(server))
    }

    /// The URL the engines connect to (`redis://127.0.0.1:PORT`, or every node's address).
    pub fn url(&self) -> String {
        match self {
            OwnedServer::Single(s) => s.url(),
            OwnedServer::Cluster(c) => c.url(),
        }
    }

    /// Restart number `k` (from 0): the server, or in a cluster node `k mod N`, killed and
    /// started again on the same ports, empty. Returns the address restarted.
    pub fn restart(&mut self, k: usize) -> Result<String, String> {
        let node = match self {
            OwnedServer::Single(s) => s,
            OwnedServer::Cluster(c) => {
                let n = c.nodes().len().max(1);
                c.node_mut(k % n).ok_or("the cluster has no nodes")?
            }
        };
        node.restart().map_err(|e| e.to_string())?;
        Ok(node.addr())
    }

    /// `standalone` or `cluster`, and the node count.
    pub fn shape(&self) -> (&'static str, usize) {
        match self {
            OwnedServer::Single(_) => ("standalone", 1),
            OwnedServer::Cluster(c) => ("cluster", c.nodes().len()),
        }
    }
}

#[cfg(not(feature = "redis"))]
impl OwnedServer {
    /// `--store redis` needs feature `redis`.
    pub fn start(plan: &Plan) -> Result<Option<OwnedServer>, String> {
        match plan.store {
            StoreSpec::Redis => Err(
                "--store redis: this kvsched was built without the Redis tier (feature redis)"
                    .into(),
            ),
            _ => Ok(None),
        }
    }

    /// Never called: no value exists.
    pub fn url(&self) -> String {
        match *self {}
    }

    /// Never called: no value exists.
    pub fn restart(&mut self, _k: usize) -> Result<String, String> {
        match *self {}
    }

    /// Never called: no value exists.
    pub fn shape(&self) -> (&'static str, usize) {
        match *self {}
    }
}
