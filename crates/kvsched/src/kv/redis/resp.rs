//! RESP2 command packing (a pipeline is its commands' encodings back to back) and reply
//! helpers.

use ::redis::Value;

use super::config::NodeAddr;

/// Appends one command (an array of bulk strings) to `buf`.
pub(crate) fn push_command(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.push(b'*');
    push_decimal(buf, args.len());
    buf.extend_from_slice(b"\r\n");
    for a in args {
        buf.push(b'$');
        push_decimal(buf, a.len());
        buf.extend_from_slice(b"\r\n");
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

/// The encoded bytes of `len` bulk strings' headers and terminators (for sizing a buffer).
pub(crate) fn overhead(args: usize) -> usize {
    16 + args * 24
}

/// The commands packed into one buffer.
pub(crate) fn pack(cmds: &[&[&[u8]]]) -> Vec<u8> {
    let mut buf = Vec::new();
    for c in cmds {
        push_command(&mut buf, c);
    }
    buf
}

/// Appends `n` in decimal.
pub(crate) fn push_decimal(buf: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// A reply's type, for error messages (never its contents).
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "integer",
        Value::BulkString(_) => "bulk string",
        Value::Array(_) => "array",
        Value::SimpleString(_) => "simple string",
        Value::Okay => "OK",
        Value::ServerError(_) => "error",
        _ => "RESP3 value",
    }
}

/// The code of an error reply (`MOVED`, `OOM`, `ERR`, …); `None` for other replies.
pub(crate) fn error_code(v: &Value) -> Option<&str> {
    match v {
        Value::ServerError(e) => Some(e.code()),
        _ => None,
    }
}

/// The most characters of a server's own text (an error reply's) an error message repeats.
const SHOWN_MAX: usize = 200;

/// Text a server sent, as an error message may repeat it: control characters (a newline
/// that would forge a second log line, a terminal escape) written as escapes, and cut to
/// [`SHOWN_MAX`] characters with `…` — the server chooses these bytes, up to a whole read
/// buffer of them.
pub(crate) fn shown(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN_MAX {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `host` can name a server: 1 to 253 characters (a DNS name's limit), none of
/// them a control character or white space. A redirect or slot map naming anything else
/// is not followed.
pub(crate) fn host_ok(host: &str) -> bool {
    (1..=253).contains(&host.len()) && !host.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// An error reply as `CODE detail` (`None` for other replies), as [`shown`].
pub(crate) fn error_text(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(shown(&match e.details() {
            Some(d) => format!("{} {d}", e.code()),
            None => e.code().to_owned(),
        })),
        _ => None,
    }
}

/// A redirect reply: whether it is `ASK` (else `MOVED`) and its target (`MOVED slot
/// host:port`). `None` for other replies, or a redirect without a readable target.
pub(crate) fn redirect(v: &Value) -> Option<(bool, NodeAddr)> {
    let Value::ServerError(e) = v else {
        return None;
    };
    // The redis crate reads the redirect (its kind, slot and target); only the target's
    // `host:port` split, IPv6 brackets included, is ours.
    let e = ::redis::RedisError::from(e.clone());
    let ask = match e.kind() {
        ::redis::ErrorKind::Ask => true,
        ::redis::ErrorKind::Moved => false,
        _ => return None,
    };
    let (addr, _slot) = e.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !host_ok(host) {
        return None;
    }
    let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
    Some((
        ask,
        NodeAddr {
            host: host.to_owned(),
            port,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_resp_arrays_of_bulk_strings() {
        let buf = pack(&[&[b"GET", b"k1"], &[b"SET", b"k", b""]]);
        assert_eq!(
            buf,
            b"*2\r\n$3\r\nGET\r\n$2\r\nk1\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
        let mut b = Vec::new();
        push_decimal(&mut b, 0);
        push_decimal(&mut b, usize::MAX);
        assert_eq!(b, format!("0{}", usize::MAX).as_bytes());
    }

    fn reply(wire: &str) -> Value {
        ::redis::parse_redis_value(wire.as_bytes()).unwrap()
    }

    #[test]
    fn reads_redirects_and_error_codes() {
        let moved = reply("-MOVED 3999 127.0.0.1:6381\r\n");
        let (ask, to) = redirect(&moved).unwrap();
        assert_eq!((ask, to.to_string().as_str()), (false, "127.0.0.1:6381"));
        let (ask, to) = redirect(&reply("-ASK 1 [::1]:7000\r\n")).unwrap();
        assert_eq!((ask, to.to_string().as_str()), (true, "[::1]:7000"));
        assert_eq!(redirect(&reply("-MOVED 3999\r\n")), None);
        assert_eq!(redirect(&reply("-MOVED x 127.0.0.1:6381\r\n")), None);
        assert_eq!(redirect(&reply("$1\r\nx\r\n")), None);
        assert_eq!(
            error_text(&moved).as_deref(),
            Some("MOVED 3999 127.0.0.1:6381")
        );
        let long = format!("-MOVED 1 {}:7000\r\n", "h".repeat(300));
        assert_eq!(redirect(&reply(&long)), None, "a 300-character host");
        let oom = reply("-OOM command not allowed\r\n");
        assert_eq!(error_code(&oom), Some("OOM"));
        assert_eq!(error_code(&Value::Nil), None);
    }

    #[test]
    fn a_servers_text_is_shown_escaped_and_cut() {
        let forged = reply("-ERR x\n[ERROR] forged \u{1b}[31mred\r\n");
        let text = error_text(&forged).unwrap();
        assert_eq!(text, "ERR x\\n[ERROR] forged \\u{1b}[31mred");
        assert!(!text.chars().any(char::is_control), "{text:?}");
        let long = reply(&format!("-ERR {}\r\n", "y".repeat(60_000)));
        let text = error_text(&long).unwrap();
        assert_eq!(
            text.chars().count(),
            SHOWN_MAX + 1,
            "cut, with its ellipsis"
        );
        assert!(text.ends_with('…'));
        assert!(host_ok("redis-3.internal") && host_ok("::1"));
        assert!(!host_ok("") && !host_ok("a b") && !host_ok("a\nb") && !host_ok(&"h".repeat(254)));
    }
}
