//! A bounded RESP2 reply parser. The server's bytes are untrusted: a reply may not hold a
//! bulk string longer than the tier's largest value, more than [`Limits::max_elements`]
//! values, nest deeper than [`Limits::max_depth`], nor a line longer than
//! [`Limits::max_line`] without its CRLF; memory grows with the bytes that actually arrived,
//! never with a length the server announced. RESP3 frames (push, map, …) are refused: the
//! tier never asks for RESP3.

use ::redis::Value;

use super::conn::ConnError;

/// Values an array reply makes room for before reading them: an announced length is only a
/// claim until the values arrive.
const ANNOUNCED_ROOM: usize = 16;

/// The read buffer's size, and the longest line accepted by default.
const BUF: usize = 64 << 10;

/// What one reply may hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The longest bulk string, in bytes.
    pub max_bulk: usize,
    /// The most bytes of the whole reply (headers included).
    pub max_bytes: usize,
    /// The most values in the reply (every array element, nested ones included).
    pub max_elements: usize,
    /// The deepest nesting of arrays.
    pub max_depth: usize,
    /// The longest line (a simple string, an error, an integer, a header).
    pub max_line: usize,
    /// The longest bulk string read past, unkept, when it is over `max_bulk`: up to this it
    /// is read and dropped as it arrives (no memory grows with it) and answered as
    /// [`OVERSIZED`], so the connection stays in step and the pipeline's other replies count;
    /// past it, a protocol error, refused unread. 0 for control replies.
    pub skip_bulk_up_to: usize,
}

/// The error code an over-the-bound bulk string is answered with (never a Redis server's).
pub(crate) const OVERSIZED: &str = "KVSCHED_OVERSIZED";

impl Limits {
    /// Replies to data commands: bulk strings up to `max_value` bytes (the largest value
    /// the tier stores), longer ones up to `skip_up_to` read past, no nesting.
    pub fn data(max_value: usize, skip_up_to: usize) -> Limits {
        Limits {
            max_bulk: max_value,
            max_bytes: max_value.saturating_add(BUF),
            max_elements: 16,
            max_depth: 1,
            max_line: BUF,
            skip_bulk_up_to: skip_up_to,
        }
    }

    /// Replies to control commands (`CLUSTER SLOTS`, the handshake, `PING`): up to 16 MiB,
    /// 2^18 values, 4 levels.
    pub fn control() -> Limits {
        Limits {
            max_bulk: 64 << 10,
            max_bytes: 16 << 20,
            max_elements: 1 << 18,
            max_depth: 4,
            max_line: BUF,
            skip_bulk_up_to: 0,
        }
    }
}

/// Reads a chunk of bytes from the stream into the buffer: `Ok(n > 0)`, or the error that
/// ends the reply (deadline, cancel, I/O).
pub(crate) type Fill<'a, S> = dyn FnMut(&mut S, &mut [u8]) -> Result<usize, ConnError> + 'a;

/// A stream and the bytes read from it but not yet parsed.
pub(crate) struct ReplyReader<S> {
    inner: S,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

/// The running totals of one reply, against its [`Limits`].
struct Tally<'l> {
    limits: &'l Limits,
    bytes: usize,
    elements: usize,
}

fn protocol(what: impl Into<String>) -> ConnError {
    ConnError::Protocol(what.into())
}

impl<S> ReplyReader<S> {
    pub fn new(inner: S) -> ReplyReader<S> {
        ReplyReader {
            inner,
            buf: vec![0; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Bytes read from the stream and not yet parsed: after a pipeline's last reply, bytes
    /// the server sent that no command asked for.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Reads one reply.
    pub fn read_value(
        &mut self,
        limits: &Limits,
        fill: &mut Fill<'_, S>,
    ) -> Result<Value, ConnError> {
        let mut tally = Tally {
            limits,
            bytes: 0,
            elements: 0,
        };
        self.value(&mut tally, fill, 0)
    }

    /// More bytes into the buffer (moving what is left to its front first).
    fn more(&mut self, fill: &mut Fill<'_, S>) -> Result<(), ConnError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            return Err(protocol("a reply line longer than the read buffer"));
        }
        let n = fill(&mut self.inner, &mut self.buf[self.end..])?;
        self.end += n.min(self.buf.len() - self.end);
        Ok(())
    }

    /// One line, without its CRLF.
    fn line(
        &mut self,
        tally: &mut Tally<'_>,
        fill: &mut Fill<'_, S>,
    ) -> Result<Vec<u8>, ConnError> {
        let max = tally.limits.max_line.min(self.buf.len() - 2);
        let mut scanned = 0usize;
        loop {
            let pending = &self.buf[self.start..self.end];
            // A CR already scanned may be the first half of the CRLF.
            let from = scanned.saturating_sub(1);
            let found = pending[from..].windows(2).position(|w| w == b"\r\n");
            if let Some(i) = found.map(|p| from + p) {
                if i > max {
                    break;
                }
                let line = pending[..i].to_vec();
                self.start += i + 2;
                tally.charge(i + 2)?;
                return Ok(line);
            }
            scanned = pending.len();
            if scanned > max + 1 {
                break;
            }
            self.more(fill)?;
        }
        Err(protocol(format!(
            "a reply line longer than {} bytes without CRLF",
            tally.limits.max_line
        )))
    }

    fn value(
        &mut self,
        tally: &mut Tally<'_>,
        fill: &mut Fill<'_, S>,
        depth: usize,
    ) -> Result<Value, ConnError> {
        tally.count(1)?;
        let line = self.line(tally, fill)?;
        let (&kind, rest) = line
            .split_first()
            .ok_or_else(|| protocol("an empty reply line"))?;
        match kind {
            b'+' if rest == b"OK" => Ok(Value::Okay),
            b'+' => Ok(Value::SimpleString(
                String::from_utf8_lossy(rest).into_owned(),
            )),
            b'-' => {
                // The redis crate's `ServerError` has no public constructor: its parser makes
                // one from this single, already bounded line.
                let mut wire = line;
                wire.extend_from_slice(b"\r\n");
                match ::redis::parse_redis_value(&wire) {
                    Ok(v @ Value::ServerError(_)) => Ok(v),
                    _ => Err(protocol("a malformed error reply")),
                }
            }
            b':' => Ok(Value::Int(number(rest)?)),
            b'$' => {
                let len = number(rest)?;
                if len == -1 {
                    return Ok(Value::Nil);
                }
                let len =
                    usize::try_from(len).map_err(|_| protocol("a negative bulk string length"))?;
                if len > tally.limits.max_bulk {
                    // (Planted bug `redis-oversized-drops-node`, scripts/plants.sh: every
                    // value past the bound is a protocol error, the node taken for down.)
                    if len <= tally.limits.skip_bulk_up_to
                        && !planted!("redis-oversized-drops-node")
                    {
                        self.skip(len, fill)?;
                        return oversized(len, tally.limits.max_bulk);
                    }
                    return Err(protocol(format!(
                        "a bulk string of {len} bytes, over the {} the tier accepts",
                        tally.limits.max_bulk
                    )));
                }
                tally.charge(len.saturating_add(2))?;
                self.bulk(len, fill).map(Value::BulkString)
            }
            b'*' => {
                let n = number(rest)?;
                if n == -1 {
                    return Ok(Value::Nil);
                }
                let n = usize::try_from(n).map_err(|_| protocol("a negative array length"))?;
                if depth >= tally.limits.max_depth {
                    return Err(protocol(format!(
                        "arrays nested deeper than {}",
                        tally.limits.max_depth
                    )));
                }
                if n > tally.limits.max_elements.saturating_sub(tally.elements) {
                    return Err(protocol(format!(
                        "an array of {n} values after {} others, past the {} a reply may hold",
                        tally.elements, tally.limits.max_elements
                    )));
                }
                // Room grows with the values read, never with the length announced.
                let mut items = Vec::with_capacity(n.min(ANNOUNCED_ROOM));
                for _ in 0..n {
                    items.push(self.value(tally, fill, depth + 1)?);
                }
                Ok(Value::Array(items))
            }
            b'>' => Err(protocol("a RESP3 push frame (the tier speaks RESP2)")),
            b'%' | b'~' | b'_' | b',' | b'#' | b'(' | b'=' | b'!' | b'|' => {
                Err(protocol("a RESP3 frame (the tier speaks RESP2)"))
            }
            other => Err(protocol(format!(
                "an unknown reply type byte 0x{other:02x}"
            ))),
        }
    }

    /// `len` bytes and their CRLF, dropped as they arrive.
    fn skip(&mut self, len: usize, fill: &mut Fill<'_, S>) -> Result<(), ConnError> {
        let mut left = len;
        while left > 0 {
            if self.start == self.end {
                self.more(fill)?;
            }
            let take = left.min(self.end - self.start);
            self.start += take;
            left -= take;
        }
        self.crlf(fill)
    }

    /// The CRLF after a bulk string.
    fn crlf(&mut self, fill: &mut Fill<'_, S>) -> Result<(), ConnError> {
        while self.end - self.start < 2 {
            self.more(fill)?;
        }
        if &self.buf[self.start..self.start + 2] != b"\r\n" {
            return Err(protocol("a bulk string not followed by CRLF"));
        }
        self.start += 2;
        Ok(())
    }

    /// `len` bytes and their CRLF; the vector grows with what arrives.
    fn bulk(&mut self, len: usize, fill: &mut Fill<'_, S>) -> Result<Vec<u8>, ConnError> {
        let mut out = Vec::with_capacity(len.min(BUF));
        while out.len() < len {
            if self.start == self.end {
                self.more(fill)?;
            }
            let take = (len - out.len()).min(self.end - self.start);
            out.extend_from_slice(&self.buf[self.start..self.start + take]);
            self.start += take;
        }
        self.crlf(fill)?;
        Ok(out)
    }
}

impl Tally<'_> {
    fn charge(&mut self, bytes: usize) -> Result<(), ConnError> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.limits.max_bytes {
            return Err(protocol(format!(
                "a reply over {} bytes",
                self.limits.max_bytes
            )));
        }
        Ok(())
    }

    fn count(&mut self, values: usize) -> Result<(), ConnError> {
        self.elements = self.elements.saturating_add(values);
        if self.elements > self.limits.max_elements {
            return Err(protocol(format!(
                "a reply of more than {} values",
                self.limits.max_elements
            )));
        }
        Ok(())
    }
}

/// The answer for a bulk string of `len` bytes read past, over the `bound`: an error reply of
/// code [`OVERSIZED`] (the redis crate's `ServerError` has no public constructor: its parser
/// makes one from the line).
fn oversized(len: usize, bound: usize) -> Result<Value, ConnError> {
    let wire =
        format!("-{OVERSIZED} a value of {len} bytes, over the {bound} the tier accepts\r\n");
    match ::redis::parse_redis_value(wire.as_bytes()) {
        Ok(v @ Value::ServerError(_)) => Ok(v),
        _ => Err(protocol(format!(
            "a value of {len} bytes, over the {bound}"
        ))),
    }
}

/// A decimal integer of a header or an integer reply: digits, after a `-` if negative (no
/// `+`, no white space).
fn number(digits: &[u8]) -> Result<i64, ConnError> {
    let magnitude = digits.strip_prefix(b"-").unwrap_or(digits);
    if magnitude.is_empty() || !magnitude.iter().all(u8::is_ascii_digit) {
        return Err(protocol("a malformed number"));
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| protocol("a malformed number"))
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
