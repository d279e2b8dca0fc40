//! The reply parser against well-formed, hostile and mutated input.

use super::*;

/// Feeds `wire` in pieces of at most `step` bytes; `Io` (end of stream) after it.
fn parse_with(wire: &[u8], step: usize, limits: &Limits) -> Result<Vec<Value>, ConnError> {
    let mut r = ReplyReader::new(0usize);
    let mut out = Vec::new();
    let mut fill = |at: &mut usize, buf: &mut [u8]| {
        let n = (wire.len() - *at).min(step).min(buf.len());
        if n == 0 {
            return Err(ConnError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        buf[..n].copy_from_slice(&wire[*at..*at + n]);
        *at += n;
        Ok(n)
    };
    loop {
        match r.read_value(limits, &mut fill) {
            Ok(v) => out.push(v),
            Err(ConnError::Io(_)) if !out.is_empty() || wire.is_empty() => return Ok(out),
            Err(e) => return Err(e),
        }
    }
}

fn data() -> Limits {
    Limits::data(1 << 20, 0)
}

#[test]
fn well_formed_replies_parse_in_any_split() {
    let wire = b"+OK\r\n+PONG\r\n:42\r\n$3\r\nabc\r\n$-1\r\n$0\r\n\r\n*2\r\n:1\r\n$1\r\nx\r\n-MOVED 1 h:1\r\n";
    for step in [1, 2, 3, 7, 64] {
        let v = parse_with(wire, step, &data()).unwrap();
        assert_eq!(v.len(), 8, "{step}");
        assert_eq!(v[0], Value::Okay);
        assert_eq!(v[1], Value::SimpleString("PONG".into()));
        assert_eq!(v[2], Value::Int(42));
        assert_eq!(v[3], Value::BulkString(b"abc".to_vec()));
        assert_eq!(v[4], Value::Nil);
        assert_eq!(v[5], Value::BulkString(Vec::new()));
        match &v[7] {
            Value::ServerError(e) => {
                assert_eq!((e.code(), e.details()), ("MOVED", Some("1 h:1")))
            }
            other => panic!("{other:?}"),
        }
    }
}

fn refused(wire: &[u8], limits: &Limits, needle: &str) {
    match parse_with(wire, 4096, limits) {
        Err(ConnError::Protocol(p)) => assert!(p.contains(needle), "{p}"),
        other => panic!(
            "{:?} gave {other:?}",
            String::from_utf8_lossy(&wire[..wire.len().min(40)])
        ),
    }
}

#[test]
fn hostile_headers_lines_and_frames_are_refused_without_allocating() {
    refused(
        b"$1099511627776\r\n",
        &data(),
        "bulk string of 1099511627776",
    );
    refused(b"*1099511627776\r\n", &data(), "array of 1099511627776");
    refused(
        b"*1099511627776\r\n",
        &Limits::control(),
        "array of 1099511627776",
    );
    refused(b"$-2\r\n", &data(), "negative");
    refused(b"*-7\r\n", &data(), "negative");
    refused(b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n", &data(), "push");
    refused(b"%1\r\n+a\r\n+b\r\n", &data(), "RESP3");
    refused(b"?\r\n", &data(), "0x3f");
    refused(b"*1\r\n*1\r\n:1\r\n", &data(), "nested");
    refused(b"$3\r\nabcXY", &data(), "CRLF");
    refused(b":12x\r\n", &data(), "number");
    refused(b"$+3\r\nabc\r\n", &data(), "number");
    refused(b":+1\r\n", &data(), "number");
    refused(b": 1\r\n", &data(), "number");
    refused(b":-\r\n", &data(), "number");
    // An array within budget by itself, past it after the values before it: the message
    // says both, not "3 values, over 4".
    let tight = Limits {
        max_elements: 4,
        ..Limits::control()
    };
    refused(
        b"*2\r\n*3\r\n:1\r\n:2\r\n:3\r\n:4\r\n",
        &tight,
        "an array of 3 values after 2 others, past the 4",
    );
    let endless = vec![b'+'; 200_000];
    refused(&endless, &data(), "without CRLF");
    // A line that ends in CR exactly at the limit is still too long.
    let mut long = vec![b'+'; 70_000];
    long.extend_from_slice(b"\r\n");
    refused(&long, &data(), "without CRLF");
    // Many small values: the count is bounded, not the bytes alone.
    let mut many = b"*262144\r\n".to_vec();
    many.extend(std::iter::repeat_n(&b":1\r\n"[..], 300_000).flatten());
    let small = Limits {
        max_elements: 1000,
        ..Limits::control()
    };
    refused(&many, &small, "array of 262144");
}

#[test]
fn a_reply_over_its_byte_budget_is_refused() {
    let limits = Limits {
        max_bytes: 100,
        ..Limits::control()
    };
    let mut wire = b"*10\r\n".to_vec();
    for _ in 0..10 {
        wire.extend_from_slice(b"$20\r\naaaaaaaaaaaaaaaaaaaa\r\n");
    }
    refused(&wire, &limits, "over 100 bytes");
}

/// Seeded mutations of well-formed replies: the parser never panics, and what it returns
/// stays within the limits (CI runs it small; `KVSCHED_FUZZ_CASES` runs more).
#[test]
fn mutated_replies_never_panic_nor_exceed_the_limits() {
    let cases: u64 = std::env::var("KVSCHED_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seeds: [&[u8]; 5] = [
        b"*3\r\n$3\r\nabc\r\n:-12\r\n*1\r\n+OK\r\n",
        b"$5\r\nhello\r\n",
        b"-ERR oops\r\n",
        b"*2\r\n*3\r\n:0\r\n:5460\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n$-1\r\n",
        b":9223372036854775807\r\n",
    ];
    let limits = Limits {
        max_bulk: 64,
        max_bytes: 256,
        max_elements: 32,
        max_depth: 3,
        max_line: 32,
        // Mutated lengths past the bound are read past too.
        skip_bulk_up_to: 128,
    };
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..cases {
        let mut wire = seeds[(next() % 5) as usize].to_vec();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % (wire.len() + 1);
            match next() % 4 {
                0 if at < wire.len() => wire[at] ^= 1 << (next() % 8),
                1 if at < wire.len() => {
                    wire.remove(at);
                }
                2 => wire.insert(at, (next() % 256) as u8),
                _ => wire.insert(at, b"0123456789*$:\r\n-+>"[(next() % 18) as usize]),
            }
        }
        let step = 1 + (next() % 9) as usize;
        if let Ok(values) = parse_with(&wire, step, &limits) {
            for v in values {
                assert!(size(&v) <= limits.max_bytes, "{wire:?}");
            }
        }
    }
}

fn size(v: &Value) -> usize {
    match v {
        Value::BulkString(b) => b.len(),
        Value::Array(items) => items.iter().map(size).sum(),
        _ => 0,
    }
}

/// A bulk string over the bound but within the skip limit is read past, unkept, in any split
/// (the stream stays in step: the next reply parses), answered as an `OVERSIZED` error reply;
/// past the skip limit, or with none, it is a protocol error, refused unread.
#[test]
fn a_value_over_the_bound_is_read_past_within_the_skip_limit() {
    let big = vec![b'x'; 100_000];
    let mut wire = format!("${}\r\n", big.len()).into_bytes();
    wire.extend_from_slice(&big);
    wire.extend_from_slice(b"\r\n:5\r\n$3\r\nabc\r\n");
    for step in [1, 7, 4096, 1 << 20] {
        if step == 1 && big.len() > 10_000 {
            // Byte by byte through 100 kB: slow in a debug build, no different.
            continue;
        }
        let v = parse_with(&wire, step, &Limits::data(1024, 1 << 20)).unwrap();
        assert_eq!(v.len(), 3, "{step}");
        match &v[0] {
            Value::ServerError(e) => assert_eq!(e.code(), OVERSIZED, "{step}"),
            other => panic!("{step}: {other:?}"),
        }
        assert_eq!(v[1], Value::Int(5), "{step}");
        assert_eq!(v[2], Value::BulkString(b"abc".to_vec()), "{step}");
    }
    refused(&wire, &Limits::data(1024, 99_999), "over the 1024");
    refused(&wire, &Limits::data(1024, 0), "over the 1024");
    // A skipped value not followed by its CRLF is out of step: refused.
    let mut bad = format!("${}\r\n", big.len()).into_bytes();
    bad.extend_from_slice(&big);
    bad.extend_from_slice(b"XX:5\r\n");
    refused(&bad, &Limits::data(1024, 1 << 20), "CRLF");
}
