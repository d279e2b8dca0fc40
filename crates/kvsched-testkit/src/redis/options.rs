//! [`LocalRedisOptions`]: how a [`LocalRedis`](super::LocalRedis) is configured, checked
//! before anything starts, and the quoting of its config file.

use std::path::PathBuf;
use std::time::Duration;

use super::redact::{Redactor, Secret};
use super::server::ServerError;

/// How to run a [`LocalRedis`](super::LocalRedis). Defaults: no memory limit, no authentication, no TLS, not a
/// cluster node, 10 s to become ready.
#[derive(Clone, Debug)]
pub struct LocalRedisOptions {
    pub(super) maxmemory: Option<u64>,
    pub(super) requirepass: Option<Secret>,
    pub(super) acl_user: Option<(String, Secret)>,
    pub(super) tls: Option<(PathBuf, PathBuf)>,
    pub(super) cluster: bool,
    pub(super) ready_timeout: Duration,
}

impl Default for LocalRedisOptions {
    fn default() -> Self {
        LocalRedisOptions {
            maxmemory: None,
            requirepass: None,
            acl_user: None,
            tls: None,
            cluster: false,
            ready_timeout: Duration::from_secs(10),
        }
    }
}

impl LocalRedisOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Caps the dataset at `bytes` (at least 1 MiB) and evicts least-recently-used keys
    /// (`allkeys-lru`) past it.
    pub fn maxmemory(mut self, bytes: u64) -> Self {
        self.maxmemory = Some(bytes);
        self
    }

    /// Requires `password` for the `default` user (`requirepass`).
    pub fn requirepass(mut self, password: &str) -> Self {
        self.requirepass = Some(Secret(password.to_owned()));
        self
    }

    /// Adds ACL user `name` (letters, digits, `-`, `_`) with `password` and every permission,
    /// and disables the `default` user unless [`requirepass`](Self::requirepass) is set.
    pub fn acl_user(mut self, name: &str, password: &str) -> Self {
        self.acl_user = Some((name.to_owned(), Secret(password.to_owned())));
        self
    }

    /// Also listens for TLS on a second free port with this certificate chain and key (PEM
    /// files); clients are not asked for certificates. The plain port stays open (readiness
    /// is checked there).
    pub fn tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls = Some((cert.into(), key.into()));
        self
    }

    /// Runs as a cluster node (`cluster-enabled yes`, its bus on a third free port).
    pub fn cluster(mut self, on: bool) -> Self {
        self.cluster = on;
        self
    }

    /// How long [`LocalRedis::start`](super::LocalRedis::start) and [`LocalRedis::restart`](super::LocalRedis::restart) wait for `PING`.
    pub fn ready_timeout(mut self, d: Duration) -> Self {
        self.ready_timeout = d;
        self
    }

    pub(super) fn validate(&self) -> Result<(), ServerError> {
        let bad = |field, problem| Err(ServerError::Options { field, problem });
        if self.maxmemory.is_some_and(|m| m < 1 << 20) {
            return bad("maxmemory", "at least 1 MiB");
        }
        if let Some((name, pw)) = &self.acl_user {
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return bad("acl_user", "name: 1 to 64 letters, digits, '-' or '_'");
            }
            if pw.0.is_empty() {
                return bad("acl_user", "empty password");
            }
        }
        if self.requirepass.as_ref().is_some_and(|p| p.0.is_empty()) {
            return bad("requirepass", "empty password");
        }
        if self.ready_timeout.is_zero() || self.ready_timeout > Duration::from_secs(600) {
            return bad("ready_timeout", "more than 0 and at most 10 minutes");
        }
        Ok(())
    }

    pub(super) fn redactor(&self) -> Redactor {
        Redactor::new(
            [
                self.requirepass.as_ref(),
                self.acl_user.as_ref().map(|(_, p)| p),
            ]
            .into_iter()
            .flatten()
            .map(|p| p.0.clone()),
        )
    }

    /// The credentials a client of this server uses: the ACL user if set, else the
    /// `default` user's password if set.
    pub(super) fn client_credentials(&self) -> Option<(Option<&str>, &str)> {
        match (&self.acl_user, &self.requirepass) {
            (Some((u, p)), _) => Some((Some(u.as_str()), p.0.as_str())),
            (None, Some(p)) => Some((None, p.0.as_str())),
            (None, None) => None,
        }
    }
}

/// A config-file argument: double-quoted, with `\` and `"` escaped and control bytes as hex.
pub(super) fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_ascii_control() => q.push_str(&format!("\\x{:02x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_quoting_escapes_what_the_parser_reads() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quote("x\ny"), "\"x\\x0ay\"");
    }

    #[test]
    fn options_are_checked() {
        let field = |o: LocalRedisOptions| match o.validate() {
            Err(ServerError::Options { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(LocalRedisOptions::new().maxmemory(1000)), "maxmemory");
        assert_eq!(
            field(LocalRedisOptions::new().acl_user("a b", "pw")),
            "acl_user"
        );
        assert_eq!(
            field(LocalRedisOptions::new().acl_user("a", "")),
            "acl_user"
        );
        assert_eq!(
            field(LocalRedisOptions::new().ready_timeout(Duration::ZERO)),
            "ready_timeout"
        );
        LocalRedisOptions::new()
            .acl_user("kv_user-1", "pw")
            .maxmemory(1 << 20)
            .validate()
            .unwrap();
    }
}
