//! The JSON tree a scenario is first read into, and the reader that builds it.
//!
//! A small private reader (RFC 8259) rather than serde's, for three reasons:
//!
//! * **messages**: a syntax error names the field path it occurred in (`groups[0]`,
//!   `invalid_blocks[3]`), whole-input problems (empty, a byte order mark, UTF-16, invalid
//!   UTF-8) are told apart, and `NaN` or `Infinity` are named as such;
//! * **number kinds**: non-negative 64-bit integers are kept apart from every other number,
//!   which is kept as written (negative, fractional, exponent, beyond 64 bits) so a message can
//!   show it;
//! * **memory**: object entries stay in order (so a key given twice is detected), and an array
//!   of non-negative integers — a block table, a report — is stored as a `Vec<u64>`, 8 bytes
//!   per id instead of a tree node each.
//!
//! Also the short descriptions of values that error messages show.

use std::fmt::Write as _;

use crate::ScenarioError;

/// How deep arrays and objects may nest (a scenario needs 4 levels).
const MAX_DEPTH: usize = 128;
/// The most characters of a value a message shows.
pub(super) use super::show::{cut, describe, quote};

pub(super) const SHOW_MAX: usize = 80;

/// A JSON value as written: object entries in order (duplicates kept), numbers by kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) enum Json {
    #[default]
    Null,
    Bool(bool),
    /// A non-negative integer literal within 64 bits (`-0` included: it is zero).
    UInt(u64),
    /// Any other number, exactly as written: negative, with a fraction or exponent, or an
    /// integer beyond 64 bits.
    Num(Box<str>),
    Str(String),
    /// An array whose every element is a [`Json::UInt`], stored compactly.
    UInts(Vec<u64>),
    /// Any other array.
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Where a reading error occurred: path segments innermost first (each enclosing array or
/// object adds its own as the error travels out), the problem and the byte offset.
struct ReadError {
    segments: Vec<Segment>,
    problem: String,
    offset: usize,
}

enum Segment {
    Index(usize),
    Key(String),
}

impl ReadError {
    fn at(mut self, segment: Segment) -> Self {
        self.segments.push(segment);
        self
    }
}

/// Reads a JSON document (UTF-8, no byte order mark) into a tree. Every problem is a
/// [`ScenarioError`]: on `input` for the input as a whole (empty, a byte order mark, UTF-16 or
/// UTF-32, invalid UTF-8), else on the path of the innermost value being read (`scenario` at
/// the top level), with the line and column.
pub(super) fn read(bytes: &[u8]) -> Result<Json, ScenarioError> {
    check_encoding(bytes)?;
    let mut r = Reader { b: bytes, i: 0 };
    let fail = |e: ReadError| {
        let path = path_of(&e.segments);
        let (line, column) = line_column(bytes, e.offset);
        let field = if path.is_empty() { "scenario" } else { &path };
        ScenarioError::new(
            field,
            format!("{} at line {line} column {column}", e.problem),
        )
    };
    r.skip_ws();
    let doc = r.value(0).map_err(fail)?;
    r.skip_ws();
    if r.i < bytes.len() {
        return Err(fail(r.malformed(format!(
            "trailing characters after the document, starting {}",
            r.shown_here()
        ))));
    }
    Ok(doc)
}

/// The problems of the input as a whole, before any JSON is read.
fn check_encoding(bytes: &[u8]) -> Result<(), ScenarioError> {
    let input = |problem: String| Err(ScenarioError::new("input", problem));
    if bytes
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return input(if bytes.is_empty() {
            "empty input: expected a JSON object".to_owned()
        } else {
            "only whitespace: expected a JSON object".to_owned()
        });
    }
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return input(
            "starts with a UTF-8 byte order mark (EF BB BF); save the scenario as UTF-8 \
             without a byte order mark"
                .to_owned(),
        );
    }
    let utf16 = match bytes {
        [0xFF, 0xFE, 0, 0, ..] | [0, 0, 0xFE, 0xFF, ..] => Some("UTF-32 (a byte order mark)"),
        [0xFF, 0xFE, ..] => Some("UTF-16 little-endian (byte order mark FF FE)"),
        [0xFE, 0xFF, ..] => Some("UTF-16 big-endian (byte order mark FE FF)"),
        [0, 0, 0, _, ..] | [_, 0, 0, 0, ..] => Some("UTF-32 (NUL bytes between characters)"),
        [0, _, ..] | [_, 0, ..] => Some("UTF-16 (NUL bytes between characters)"),
        _ => None,
    };
    if let Some(what) = utf16 {
        return input(format!("looks like {what}; the scenario must be UTF-8"));
    }
    if let Err(e) = std::str::from_utf8(bytes) {
        let at = e.valid_up_to();
        let (line, column) = line_column(bytes, at);
        return input(format!(
            "invalid UTF-8 at byte {at} (line {line} column {column}); the scenario must be \
             UTF-8"
        ));
    }
    Ok(())
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    (line, column)
}

/// Segments a path shows at each end when it has more than twice as many; the levels
/// between are counted, not listed (a 128-deep `[[[…` names one field, not 128 of them).
const PATH_ENDS: usize = 4;

/// `a.b[3]`, `["a b"]`: the path of a field from its segments (innermost first); a path of
/// more than `2 × PATH_ENDS` segments shows its outer and inner `PATH_ENDS` around
/// `…(N levels)…`.
fn path_of(segments: &[Segment]) -> String {
    let n = segments.len();
    let mut path = String::new();
    for (depth, s) in segments.iter().rev().enumerate() {
        if n > 2 * PATH_ENDS && (PATH_ENDS..n - PATH_ENDS).contains(&depth) {
            if depth == PATH_ENDS {
                let _ = write!(path, "…({} levels)…", n - 2 * PATH_ENDS);
            }
            continue;
        }
        match s {
            Segment::Index(i) => {
                let _ = write!(path, "[{i}]");
            }
            Segment::Key(k) => path = join(&path, k),
        }
    }
    path
}

/// `path.key`, or `path["key"]` (quoted, cut to [`SHOW_MAX`] characters) when the key is not
/// a plain identifier or is long.
pub(super) fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.len() <= SHOW_MAX
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{}]", quote(key)),
    }
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn malformed(&self, problem: String) -> ReadError {
        ReadError {
            segments: Vec::new(),
            problem: format!("malformed JSON: {problem}"),
            offset: self.i,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// What stands at the current position, for a message: a quoted character or "the end".
    fn shown_here(&self) -> String {
        match std::str::from_utf8(&self.b[self.i..]) {
            Ok(rest) => match rest.chars().next() {
                Some(c) => format!("with {c:?}"),
                None => "at the end".to_owned(),
            },
            // The input was checked to be UTF-8 and positions are character boundaries.
            Err(_) => "here".to_owned(),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, ReadError> {
        match self.peek() {
            None => Err(self.malformed("EOF while parsing a value".to_owned())),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Json::Str),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            Some(_) => {
                let rest = &self.b[self.i..];
                for word in ["NaN", "Infinity", "+Infinity", "-Infinity"] {
                    if rest.starts_with(word.as_bytes()) {
                        return Err(self.malformed(format!(
                            "{word} is not a JSON number (JSON has no NaN or infinities)"
                        )));
                    }
                }
                Err(self.malformed(format!("expected a value, found {}", self.shown_char())))
            }
        }
    }

    fn shown_char(&self) -> String {
        match std::str::from_utf8(&self.b[self.i..]) {
            Ok(rest) => rest
                .chars()
                .next()
                .map_or_else(|| "the end".to_owned(), |c| format!("{c:?}")),
            Err(_) => "a byte that is not a character".to_owned(),
        }
    }

    fn literal(&mut self, word: &str, v: Json) -> Result<Json, ReadError> {
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.malformed(format!("expected a value, found {}", self.shown_word())))
        }
    }

    /// The identifier-like word at the current position, quoted and cut.
    fn shown_word(&self) -> String {
        let rest = &self.b[self.i..];
        let n = rest
            .iter()
            .position(|b| !b.is_ascii_alphanumeric())
            .unwrap_or(rest.len())
            .max(1);
        quote(&String::from_utf8_lossy(&rest[..n.min(rest.len())]))
    }

    fn number(&mut self) -> Result<Json, ReadError> {
        let start = self.i;
        let digits = |r: &mut Self| {
            let from = r.i;
            while let Some(b'0'..=b'9') = r.peek() {
                r.i += 1;
            }
            r.i - from
        };
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let int_start = self.i;
        let n = digits(self);
        if n == 0 {
            return Err(
                self.malformed(if self.b[self.i..].starts_with(b"Infinity") {
                    "-Infinity is not a JSON number (JSON has no NaN or infinities)".to_owned()
                } else {
                    format!(
                        "invalid number: expected a digit, found {}",
                        self.shown_char()
                    )
                }),
            );
        }
        if n > 1 && self.b[int_start] == b'0' {
            self.i = int_start + 1;
            return Err(self.malformed("invalid number: a leading zero".to_owned()));
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.i += 1;
            if digits(self) == 0 {
                return Err(self.malformed(format!(
                    "invalid number: expected a digit after the decimal point, found {}",
                    self.shown_char()
                )));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if digits(self) == 0 {
                return Err(self.malformed(format!(
                    "invalid number: expected a digit in the exponent, found {}",
                    self.shown_char()
                )));
            }
        }
        // ASCII only: a valid str.
        let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or_default();
        if integer {
            let digits = &text[usize::from(negative)..];
            if negative && digits.bytes().all(|b| b == b'0') {
                return Ok(Json::UInt(0)); // `-0` is the integer zero
            }
            if !negative {
                if let Ok(v) = digits.parse::<u64>() {
                    return Ok(Json::UInt(v));
                }
            }
        }
        Ok(Json::Num(text.into()))
    }

    fn string(&mut self) -> Result<String, ReadError> {
        let open = self.i;
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let from = self.i;
            while let Some(&b) = self.b.get(self.i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            // Whole UTF-8 sequences: the stops are ASCII.
            out.push_str(std::str::from_utf8(&self.b[from..self.i]).unwrap_or_default());
            match self.peek() {
                None => {
                    self.i = open;
                    return Err(self.malformed("EOF while parsing a string".to_owned()));
                }
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => self.escape(&mut out)?,
                Some(c) => {
                    return Err(self.malformed(format!(
                        "control character U+{c:04X} in a string (escape it)"
                    )))
                }
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), ReadError> {
        self.i += 1; // the backslash
        let Some(c) = self.peek() else {
            return Err(self.malformed("EOF while parsing a string".to_owned()));
        };
        self.i += 1;
        let simple =
            match c {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let hi = self.hex4()?;
                    let ch = if (0xD800..0xDC00).contains(&hi) {
                        if !self.b[self.i..].starts_with(b"\\u") {
                            return Err(self
                                .malformed("invalid escape: a lone leading surrogate".to_owned()));
                        }
                        self.i += 2;
                        let lo = self.hex4()?;
                        if !(0xDC00..0xE000).contains(&lo) {
                            return Err(self.malformed(
                                "invalid escape: a leading surrogate without its trailing one"
                                    .to_owned(),
                            ));
                        }
                        char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                    } else {
                        char::from_u32(hi)
                    };
                    match ch {
                        Some(ch) => ch,
                        None => {
                            return Err(self
                                .malformed("invalid escape: a lone trailing surrogate".to_owned()))
                        }
                    }
                }
                _ => {
                    self.i -= 1;
                    return Err(self.malformed(format!(
                        "invalid escape \\{}",
                        self.shown_char().trim_matches('\'')
                    )));
                }
            };
        out.push(simple);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, ReadError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => {
                    return Err(
                        self.malformed("invalid escape: \\u needs four hex digits".to_owned())
                    )
                }
            };
            v = v * 16 + u32::from(d);
            self.i += 1;
        }
        Ok(v)
    }

    fn array(&mut self, depth: usize) -> Result<Json, ReadError> {
        if depth > MAX_DEPTH {
            return Err(self.malformed(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        self.i += 1; // [
        self.skip_ws();
        let mut uints: Vec<u64> = Vec::new();
        let mut items: Option<Vec<Json>> = None;
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Json::UInts(uints));
        }
        let mut k = 0usize;
        loop {
            self.skip_ws();
            if self.peek().is_none() {
                return Err(self.malformed("EOF while parsing a list".to_owned()));
            }
            let v = self.value(depth).map_err(|e| e.at(Segment::Index(k)))?;
            match (&mut items, v) {
                (None, Json::UInt(n)) => uints.push(n),
                (None, v) => {
                    let mut all: Vec<Json> = Vec::with_capacity(uints.len() + 1);
                    all.extend(std::mem::take(&mut uints).into_iter().map(Json::UInt));
                    all.push(v);
                    items = Some(all);
                }
                (Some(all), v) => all.push(v),
            }
            k += 1;
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    // Trimmed to size: a scenario is mostly small arrays and objects, where the
                    // slack of a growing vector would be most of the memory.
                    return Ok(match items {
                        Some(mut all) => {
                            all.shrink_to_fit();
                            Json::Array(all)
                        }
                        None => {
                            uints.shrink_to_fit();
                            Json::UInts(uints)
                        }
                    });
                }
                None => return Err(self.malformed("EOF while parsing a list".to_owned())),
                Some(_) => {
                    return Err(self.malformed(format!(
                        "expected ',' or ']' after a list element, found {}",
                        self.shown_char()
                    )))
                }
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, ReadError> {
        if depth > MAX_DEPTH {
            return Err(self.malformed(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        self.i += 1; // {
        let mut entries: Vec<(String, Json)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Json::Object(entries));
        }
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'"') => {}
                None => return Err(self.malformed("EOF while parsing an object".to_owned())),
                Some(_) => {
                    return Err(self.malformed(format!(
                        "expected a key (a string), found {}",
                        self.shown_char()
                    )))
                }
            }
            let key = self.string()?;
            self.skip_ws();
            match self.peek() {
                Some(b':') => self.i += 1,
                None => {
                    return Err(self
                        .malformed("EOF while parsing an object".to_owned())
                        .at(Segment::Key(key)))
                }
                Some(_) => {
                    let e = self.malformed(format!(
                        "expected ':' after the key, found {}",
                        self.shown_char()
                    ));
                    return Err(e.at(Segment::Key(key)));
                }
            }
            self.skip_ws();
            let v = match self.value(depth) {
                Ok(v) => v,
                Err(e) => return Err(e.at(Segment::Key(key))),
            };
            entries.push((key, v));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    entries.shrink_to_fit();
                    return Ok(Json::Object(entries));
                }
                None => return Err(self.malformed("EOF while parsing an object".to_owned())),
                Some(_) => {
                    return Err(self.malformed(format!(
                        "expected ',' or '}}' after an object entry, found {}",
                        self.shown_char()
                    )))
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
