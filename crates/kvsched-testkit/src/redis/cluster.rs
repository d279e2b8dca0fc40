//! [`LocalCluster`]: `n` [`LocalRedis`] nodes made into one Redis Cluster.

use std::fs;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::options::LocalRedisOptions;
use super::server::{on_path, LocalRedis, ServerError};
use crate::process::die_with_parent;

/// [`LocalRedis`] cluster nodes made into one Redis Cluster (`redis-cli --cluster create`):
/// `n` primaries, and with [`start_with_replicas`](Self::start_with_replicas) replicas of
/// each, ready (`cluster_state:ok` on every node) when it returns. Dropping it stops every
/// node.
#[derive(Debug)]
pub struct LocalCluster {
    nodes: Vec<LocalRedis>,
}

impl LocalCluster {
    /// `n` nodes (3..=16) with default options.
    pub fn start(n: usize) -> Result<LocalCluster, ServerError> {
        LocalCluster::start_with(n, LocalRedisOptions::new())
    }

    /// `n` nodes (3..=16), each with `options` (cluster mode is turned on).
    pub fn start_with(n: usize, options: LocalRedisOptions) -> Result<LocalCluster, ServerError> {
        LocalCluster::start_with_replicas(n, 0, options)
    }

    /// `primaries` primaries (3..=16) with `replicas` replicas each (0..=2), each node with
    /// `options`. The first `primaries` nodes are the primaries ([`nodes`](Self::nodes)), as
    /// `redis-cli --cluster create` assigns them; a primary's replica takes its slots
    /// over when it stops for longer than the nodes' `cluster-node-timeout` (5 s; set it with
    /// `CONFIG SET` on every node for a faster failover).
    pub fn start_with_replicas(
        primaries: usize,
        replicas: usize,
        options: LocalRedisOptions,
    ) -> Result<LocalCluster, ServerError> {
        if !(3..=16).contains(&primaries) {
            return Err(ServerError::Options {
                field: "n",
                problem: "a cluster needs 3 to 16 nodes",
            });
        }
        if replicas > 2 {
            return Err(ServerError::Options {
                field: "replicas",
                problem: "at most 2 replicas per primary",
            });
        }
        let n = primaries * (1 + replicas);
        if !on_path("redis-cli") {
            return Err(ServerError::NotFound("redis-cli"));
        }
        let options = options.cluster(true);
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            nodes.push(LocalRedis::start(options.clone())?);
        }
        let cluster = LocalCluster { nodes };
        cluster.create(&options, replicas)?;
        cluster.wait_ok(options.ready_timeout.max(Duration::from_secs(30)))?;
        Ok(cluster)
    }

    fn create(&self, options: &LocalRedisOptions, replicas: usize) -> Result<(), ServerError> {
        let dir = self
            .nodes
            .first()
            .map(|n| n.dir().to_path_buf())
            .unwrap_or_default();
        let out_path = dir.join("cluster-create.log");
        let io_err = |what: &str, source| ServerError::Io {
            what: what.to_owned(),
            source,
        };
        let out = fs::File::create(&out_path).map_err(|e| io_err("create the redis-cli log", e))?;
        let err = out
            .try_clone()
            .map_err(|e| io_err("duplicate the redis-cli log", e))?;
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(n.addr());
        }
        cmd.arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some((user, pw)) = options.client_credentials() {
            if let Some(u) = user {
                cmd.args(["--user", u]);
            }
            // The password goes through the environment, not the command line.
            cmd.env("REDISCLI_AUTH", pw);
        }
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| io_err("spawn redis-cli", e))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ServerError::Cluster(
                        "redis-cli --cluster create timed out".into(),
                    ));
                }
                Err(e) => return Err(io_err("wait for redis-cli", e)),
            }
        };
        if !status.success() {
            let text = fs::read_to_string(&out_path).unwrap_or_default();
            let tail: String = text
                .chars()
                .rev()
                .take(2048)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let redactor = options.redactor();
            return Err(ServerError::Cluster(format!(
                "redis-cli --cluster create: {status}: {}",
                redactor.clean(tail.trim())
            )));
        }
        Ok(())
    }

    /// Polls `CLUSTER INFO` on every node until each says `cluster_state:ok` with all 16384
    /// slots assigned and every node known.
    fn wait_ok(&self, timeout: Duration) -> Result<(), ServerError> {
        let deadline = Instant::now() + timeout;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let mut last = String::new();
            let all_ok = self
                .nodes
                .iter()
                .all(|n| match n.query(&["CLUSTER", "INFO"]) {
                    Ok(info) => {
                        let ok = info.lines().any(|l| l.trim() == "cluster_state:ok")
                            && info
                                .lines()
                                .any(|l| l.trim() == "cluster_slots_assigned:16384")
                            && info.lines().any(|l| l.trim() == known);
                        if !ok {
                            last = format!("{} not ok yet", n.addr());
                        }
                        ok
                    }
                    Err(e) => {
                        last = e;
                        false
                    }
                });
            if all_ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ServerError::Cluster(format!(
                    "not cluster_state:ok after {timeout:?}: {last}"
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[LocalRedis] {
        &self.nodes
    }

    /// Node `i`, to stop or restart it.
    pub fn node_mut(&mut self, i: usize) -> Option<&mut LocalRedis> {
        self.nodes.get_mut(i)
    }

    /// `host:port` of every node.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr()).collect()
    }

    /// `redis://h:p,h:p,...` (no credentials).
    pub fn url(&self) -> String {
        format!("redis://{}", self.seeds().join(","))
    }
}
