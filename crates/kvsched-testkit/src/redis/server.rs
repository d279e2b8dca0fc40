//! [`LocalRedis`]: a `redis-server` child process on a free loopback port, owned by the value
//! (killed and reaped on drop, and by the kernel if this process dies); [`LocalCluster`]: `n`
//! of them made into a Redis Cluster.
//!
//! The server runs from `PATH` with no persistence (`save ""`, `appendonly no`), in a private
//! temporary directory (mode 0700, removed on drop) that holds its config file (mode 0600: the
//! passwords are in it, not on the command line), its log and, in cluster mode, its
//! `nodes.conf`. Readiness is `PING` polled until a deadline, never a fixed sleep.
//!
//! # Dying with us
//!
//! Each server is spawned from a keeper thread the `LocalRedis` owns, with
//! `PR_SET_PDEATHSIG(SIGKILL)` set in the child: Linux sends the signal when the *thread* that
//! spawned a child exits, so spawning from the keeper (which lives as long as the
//! `LocalRedis`, or until the process ends) rather than from the caller's thread lets a server
//! outlive the thread that started it (a test harness in a `static`, say) while still dying
//! with the process, however the process ends.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::thread;

use parking_lot::{Condvar, Mutex};

use super::options::{quote, LocalRedisOptions};
use super::private_dir::private_dir;
use super::redact::Redactor;
use crate::process::die_with_parent;

/// Why a local server could not be started or managed. Texts never contain the passwords.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// `redis-server` (or `redis-cli`, for a cluster) is not on `PATH`.
    #[error("{0} is not on PATH")]
    NotFound(&'static str),
    /// An option is out of range.
    #[error("option {field}: {problem}")]
    Options {
        /// The option.
        field: &'static str,
        /// What is wrong.
        problem: &'static str,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// The server exited before it answered `PING`.
    #[error("redis-server exited ({status}) before it was ready; log: {log}")]
    Exited {
        /// Its exit status.
        status: String,
        /// The end of its log.
        log: String,
    },
    /// The server did not answer `PING` within the ready timeout.
    #[error("redis-server on port {port} not ready after {waited:?} ({last}); log: {log}")]
    NotReady {
        /// Its port.
        port: u16,
        /// How long we waited.
        waited: Duration,
        /// The last `PING` failure.
        last: String,
        /// The end of its log.
        log: String,
    },
    /// `redis-cli --cluster create` failed, or the cluster did not reach `cluster_state:ok`.
    #[error("cluster: {0}")]
    Cluster(String),
}

/// Whether an executable named `name` is in a `PATH` directory.
pub(super) fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            let p = d.join(name);
            fs::metadata(&p).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
    })
}

/// Whether `redis-server` is on `PATH` (tests that need one skip, or fail in CI, without it).
pub fn redis_server_on_path() -> bool {
    on_path("redis-server")
}

/// The thread a server is spawned from (see the module docs), and the hand-off to it.
struct Keeper {
    slot: Arc<(Mutex<KeeperState>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

enum KeeperState {
    Idle,
    Spawn(Box<Command>),
    Spawned(io::Result<Child>),
    Exit,
}

impl Keeper {
    fn new() -> io::Result<Keeper> {
        let slot = Arc::new((Mutex::new(KeeperState::Idle), Condvar::new()));
        let s = Arc::clone(&slot);
        let thread = thread::Builder::new()
            .name("kvsched-redis-keeper".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut st = lock.lock();
                loop {
                    match std::mem::replace(&mut *st, KeeperState::Idle) {
                        KeeperState::Spawn(mut cmd) => {
                            *st = KeeperState::Spawned(cmd.spawn());
                            cv.notify_all();
                        }
                        KeeperState::Exit => return,
                        other => {
                            *st = other;
                            cv.wait(&mut st);
                        }
                    }
                }
            })?;
        Ok(Keeper {
            slot,
            thread: Some(thread),
        })
    }

    /// Spawns `cmd` on the keeper thread.
    fn spawn(&self, cmd: Command) -> io::Result<Child> {
        let (lock, cv) = &*self.slot;
        let mut st = lock.lock();
        *st = KeeperState::Spawn(Box::new(cmd));
        cv.notify_all();
        loop {
            match std::mem::replace(&mut *st, KeeperState::Idle) {
                KeeperState::Spawned(r) => return r,
                other => {
                    *st = other;
                    cv.wait(&mut st);
                }
            }
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let (lock, cv) = &*self.slot;
        *lock.lock() = KeeperState::Exit;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `count` distinct free loopback ports (bound together, then released).
fn free_ports(count: usize) -> Result<Vec<u16>, ServerError> {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|source| ServerError::Io {
            what: "bind a free loopback port".into(),
            source,
        })?;
        held.push(l);
    }
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<io::Result<Vec<u16>>>()
        .map_err(|source| ServerError::Io {
            what: "read a bound port".into(),
            source,
        })
}

/// A `redis-server` child process on a free loopback port, owned by this value.
///
/// The server runs from `PATH` with no persistence (`save ""`, `appendonly no`), in a
/// private temporary directory (mode 0700, removed on drop) holding its config file (mode
/// 0600: passwords go there, not on the command line), its log and, in cluster mode, its
/// `nodes.conf`. Readiness is `PING` polled until a deadline.
///
/// It dies with this process however the process ends: the child is spawned with
/// `PR_SET_PDEATHSIG(SIGKILL)` from a keeper thread the `LocalRedis` owns (Linux signals the
/// child when the *thread* that spawned it exits, so the keeper, not the caller's thread, is
/// the parent: a server may outlive the thread that started it, as in a `static` test
/// harness).
///
/// Dropping it kills (SIGKILL) and reaps the process and removes its directory. Data lives
/// in memory only: a [`restart`](Self::restart) comes back empty (a cluster node keeps its
/// `nodes.conf`, so it rejoins its cluster with the same slots).
pub struct LocalRedis {
    child: Option<Child>,
    port: u16,
    tls_port: Option<u16>,
    cluster_port: Option<u16>,
    dir: PathBuf,
    options: LocalRedisOptions,
    redactor: Redactor,
    keeper: Keeper,
}

impl std::fmt::Debug for LocalRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRedis")
            .field("pid", &self.child.as_ref().map(|c| c.id()))
            .field("port", &self.port)
            .field("tls_port", &self.tls_port)
            .field("cluster_port", &self.cluster_port)
            .field("dir", &self.dir)
            .finish()
    }
}

impl LocalRedis {
    /// Starts `redis-server` from `PATH` on free loopback ports and waits until it answers
    /// `PING` (authenticated if the options set a password). Retries with new ports if one
    /// was taken in the meantime.
    pub fn start(options: LocalRedisOptions) -> Result<LocalRedis, ServerError> {
        if !redis_server_on_path() {
            return Err(ServerError::NotFound("redis-server"));
        }
        options.validate()?;
        let redactor = options.redactor();
        let count = 1 + usize::from(options.tls.is_some()) + usize::from(options.cluster);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = free_ports(count)?;
            let mut it = ports.iter().copied();
            let port = it.next().unwrap_or(0);
            let tls_port = options.tls.as_ref().and_then(|_| it.next());
            let cluster_port = options.cluster.then(|| it.next()).flatten();
            let dir = private_dir()?;
            let keeper = Keeper::new().map_err(|source| ServerError::Io {
                what: "spawn the keeper thread".into(),
                source,
            })?;
            let mut server = LocalRedis {
                child: None,
                port,
                tls_port,
                cluster_port,
                dir,
                options: options.clone(),
                redactor: redactor.clone(),
                keeper,
            };
            server.write_config()?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(ServerError::Exited { log, .. })
                    if attempt < 5 && log.contains("Address already in use") =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn write_config(&self) -> Result<(), ServerError> {
        let o = &self.options;
        let mut c = String::new();
        let mut line = |s: String| {
            c.push_str(&s);
            c.push('\n');
        };
        line(format!("port {}", self.port));
        line("bind 127.0.0.1".into());
        line("daemonize no".into());
        line("save \"\"".into());
        line("appendonly no".into());
        line(format!("dir {}", quote(&self.dir.to_string_lossy())));
        line("logfile \"\"".into());
        if let Some(m) = o.maxmemory {
            line(format!("maxmemory {m}"));
            line("maxmemory-policy allkeys-lru".into());
        }
        if let Some(p) = &o.requirepass {
            line(format!("requirepass {}", quote(&p.0)));
        }
        if let Some((name, p)) = &o.acl_user {
            if o.requirepass.is_none() {
                line("user default off".into());
            }
            line(format!(
                "user {name} on {} ~* &* +@all",
                quote(&format!(">{}", p.0))
            ));
        }
        if let (Some((cert, key)), Some(tp)) = (&o.tls, self.tls_port) {
            line(format!("tls-port {tp}"));
            line(format!("tls-cert-file {}", quote(&cert.to_string_lossy())));
            line(format!("tls-key-file {}", quote(&key.to_string_lossy())));
            line("tls-auth-clients no".into());
        }
        if let Some(cp) = self.cluster_port {
            line("cluster-enabled yes".into());
            line("cluster-config-file nodes.conf".into());
            line(format!("cluster-port {cp}"));
            line("cluster-node-timeout 5000".into());
        }
        let path = self.dir.join("redis.conf");
        let io_err = |what: &str, source| ServerError::Io {
            what: format!("{what} {}", path.display()),
            source,
        };
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err("create", e))?;
        f.write_all(c.as_bytes()).map_err(|e| io_err("write", e))
    }

    /// Spawns the process (on the keeper thread) and waits until it is ready.
    fn launch(&mut self) -> Result<(), ServerError> {
        let log_path = self.dir.join("redis.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| ServerError::Io {
                what: format!("open {}", log_path.display()),
                source,
            })?;
        let log2 = log.try_clone().map_err(|source| ServerError::Io {
            what: "duplicate the log file".into(),
            source,
        })?;
        let mut cmd = Command::new("redis-server");
        cmd.arg(self.dir.join("redis.conf"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        die_with_parent(&mut cmd);
        let child = self.keeper.spawn(cmd).map_err(|source| ServerError::Io {
            what: "spawn redis-server".into(),
            source,
        })?;
        self.child = Some(child);
        let r = self.wait_ready();
        if r.is_err() {
            self.stop();
        }
        r
    }

    /// Polls `PING` until it answers, the process exits, or the ready timeout passes.
    fn wait_ready(&mut self) -> Result<(), ServerError> {
        let start = Instant::now();
        let deadline = start + self.options.ready_timeout;
        let mut last;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(ServerError::Exited {
                        status: status.to_string(),
                        log: self.log_tail(),
                    });
                }
            }
            match self.query(&["PING"]) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                return Err(ServerError::NotReady {
                    port: self.port,
                    waited: start.elapsed(),
                    last,
                    log: self.log_tail(),
                });
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs one command on the plain port (authenticated as the options say) and returns its
    /// reply as text. For setup and tests; errors redacted.
    pub fn query(&self, args: &[&str]) -> Result<String, String> {
        let (username, password) = match self.options.client_credentials() {
            Some((user, pw)) => (user.map(str::to_owned), Some(pw.to_owned())),
            None => (None, None),
        };
        let info = ::redis::ConnectionInfo {
            addr: ::redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), self.port),
            redis: ::redis::RedisConnectionInfo {
                username,
                password,
                ..::redis::RedisConnectionInfo::default()
            },
        };
        let client =
            ::redis::Client::open(info).map_err(|e| self.redactor.clean(&e.to_string()))?;
        let t = Duration::from_secs(2);
        let run = || -> ::redis::RedisResult<String> {
            let mut con = client.get_connection_with_timeout(t)?;
            con.set_read_timeout(Some(t))?;
            con.set_write_timeout(Some(t))?;
            let mut cmd = ::redis::cmd(args.first().copied().unwrap_or("PING"));
            for a in args.iter().skip(1) {
                cmd.arg(*a);
            }
            let v: ::redis::Value = cmd.query(&mut con)?;
            Ok(value_text(&v))
        };
        run().map_err(|e| self.redactor.clean(&e.to_string()))
    }

    /// The last 2 KiB of the server's log, passwords redacted.
    fn log_tail(&self) -> String {
        let path = self.dir.join("redis.log");
        let mut buf = Vec::new();
        if let Ok(mut f) = fs::File::open(&path) {
            let len = f.metadata().map_or(0, |m| m.len());
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(2048)));
            let _ = f.read_to_end(&mut buf);
        }
        self.redactor.clean(String::from_utf8_lossy(&buf).trim())
    }

    /// The plain port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, if TLS is on.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>` (no credentials).
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// `rediss://127.0.0.1:<tls port>`, if TLS is on.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The server's directory (config, log, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process is running (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Kills (SIGKILL) and reaps the process. Idempotent; [`restart`](Self::restart) starts
    /// it again.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server and starts it again on the same ports (empty: nothing persists).
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.stop();
        self.launch()
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A reply as text: strings as they are, integers in decimal, arrays one item per line.
fn value_text(v: &::redis::Value) -> String {
    use ::redis::Value;
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        Value::Int(n) => n.to_string(),
        Value::Nil => String::new(),
        Value::Array(items) => items.iter().map(value_text).collect::<Vec<_>>().join("\n"),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_spawns_and_exits() {
        let k = Keeper::new().unwrap();
        let mut c = k.spawn(Command::new("true")).unwrap();
        assert!(c.wait().unwrap().success());
        assert!(k.spawn(Command::new("/nonexistent/binary")).is_err());
        drop(k); // joins the thread
    }
}
