//! The parts of a Redis URL read by hand: its list of hosts (`host[:port]`, IPv6 in
//! brackets) and percent-decoding.

use super::config::{ConfigError, NodeAddr, DEFAULT_PORT, MAX_SEEDS};

pub(super) fn parse_hosts<'a>(
    hosts: impl Iterator<Item = &'a str>,
) -> Result<Vec<NodeAddr>, ConfigError> {
    let mut out = Vec::new();
    for (i, h) in hosts.enumerate() {
        let index = i + 1;
        if index > MAX_SEEDS {
            return Err(ConfigError::Seed {
                index,
                problem: "too many seeds (at most 64)",
            });
        }
        out.push(parse_host(h).map_err(|problem| ConfigError::Seed { index, problem })?);
    }
    if out.is_empty() {
        return Err(ConfigError::Url("no host"));
    }
    Ok(out)
}

pub(super) fn parse_host(h: &str) -> Result<NodeAddr, &'static str> {
    let h = h.trim();
    let (host, port) = if let Some(r) = h.strip_prefix('[') {
        let (host, after) = r.split_once(']').ok_or("unclosed '[' of an IPv6 address")?;
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err("junk after ']'"),
        }
    } else {
        match h.split_once(':') {
            Some((host, p)) => (host, Some(p)),
            None => (h, None),
        }
    };
    if host.is_empty() {
        return Err("empty host");
    }
    if host.len() > 253
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
    {
        return Err("host must be a name or an IP address");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or("port is not a number in 1..=65535")?,
    };
    Ok(NodeAddr {
        host: host.to_owned(),
        port,
    })
}

/// Decodes `%XX` escapes; `None` if an escape is malformed or the result is not UTF-8.
pub(super) fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
