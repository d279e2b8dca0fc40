//! Local `redis-server` processes for tests and benchmarks (feature `redis`): [`LocalRedis`],
//! one server on a free loopback port owned by the value, and [`LocalCluster`], `n` of them
//! made into a Redis Cluster. The tier that talks to them is the library's
//! [`RedisTier`](kvsched::kv::redis::RedisTier).
//!
//! * `server` — [`LocalRedis`], [`ServerError`];
//! * `options` — [`LocalRedisOptions`];
//! * `cluster` — [`LocalCluster`];
//! * `redact` — credentials out of a server's log and replies.

mod cluster;
mod options;
mod private_dir;
mod redact;
pub mod resp;
mod server;

pub use cluster::LocalCluster;
pub use options::LocalRedisOptions;
pub use server::{redis_server_on_path, LocalRedis, ServerError};
