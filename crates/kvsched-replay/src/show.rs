//! Showing JSON values and strings in error messages: described, quoted, cut short.

use super::json::{Json, SHOW_MAX};

/// A short description of a value for error messages.
pub(super) fn describe(v: &Json) -> String {
    match v {
        Json::Null => "null".to_owned(),
        Json::Bool(b) => format!("boolean {b}"),
        Json::UInt(n) => format!("number {n}"),
        Json::Num(text) => format!("number {}", cut(text)),
        Json::Str(s) => format!("string {}", quote(s)),
        Json::UInts(_) | Json::Array(_) => "an array".to_owned(),
        Json::Object(_) => "an object".to_owned(),
    }
}

/// `s` quoted and escaped, at most [`SHOW_MAX`] characters in all (cut with `…`).
pub(super) fn quote(s: &str) -> String {
    let full = format!("{s:?}");
    if full.chars().count() <= SHOW_MAX {
        return full;
    }
    let mut out = String::new();
    for c in s.chars() {
        let piece = format!("{}", c.escape_debug());
        if out.chars().count() + piece.chars().count() > SHOW_MAX - 3 {
            break;
        }
        out.push_str(&piece);
    }
    format!("\"{out}\"…")
}

/// `s` (a number as written) cut to [`SHOW_MAX`] characters with `…`.
pub(super) fn cut(s: &str) -> String {
    if s.chars().count() <= SHOW_MAX {
        return s.to_owned();
    }
    let head: String = s.chars().take(SHOW_MAX - 1).collect();
    format!("{head}…")
}
