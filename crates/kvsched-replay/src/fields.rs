//! Typed fields out of the JSON tree, each with its path known: non-negative integers, arrays,
//! lists of integers, one of a set of strings, and objects whose keys were checked (none
//! twice, none unknown). Every problem is a [`ScenarioError`] on the field's path.
//!
//! The tree is consumed as it is read: lists of ids move out of it rather than being copied,
//! so a scenario's tables exist once in memory.

use crate::json::{cut, describe, join, quote, Json};
use crate::{err, ScenarioError};

pub(super) fn uint(v: &Json, path: &str) -> Result<u64, ScenarioError> {
    match v {
        Json::UInt(n) => Ok(*n),
        Json::Num(text) => Err(err(path, number_problem(text))),
        other => Err(err(
            path,
            format!("expected a non-negative integer, got {}", describe(other)),
        )),
    }
}

/// Why a number other than a non-negative 64-bit integer literal is rejected.
fn number_problem(text: &str) -> String {
    let shown = cut(text);
    if text.starts_with('-') {
        return format!("must be a non-negative integer, got {shown}");
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return format!(
            "integer does not fit in 64 bits (got {shown}; at most {})",
            u64::MAX
        );
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => format!("must be a non-negative integer, got float {shown}"),
        _ => format!(
            "number out of range (got {shown}); must be a non-negative integer, at most {}",
            u64::MAX
        ),
    }
}

/// The elements of an array, whichever way the tree stores it.
pub(super) enum Elems {
    Values(std::vec::IntoIter<Json>),
    UInts(std::vec::IntoIter<u64>),
}

impl Iterator for Elems {
    type Item = Json;

    fn next(&mut self) -> Option<Json> {
        match self {
            Elems::Values(it) => it.next(),
            Elems::UInts(it) => it.next().map(Json::UInt),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Elems::Values(it) => it.size_hint(),
            Elems::UInts(it) => it.size_hint(),
        }
    }
}

impl ExactSizeIterator for Elems {}

pub(super) fn array(v: Json, path: &str) -> Result<Elems, ScenarioError> {
    match v {
        Json::Array(items) => Ok(Elems::Values(items.into_iter())),
        Json::UInts(items) => Ok(Elems::UInts(items.into_iter())),
        other => Err(err(
            path,
            format!("expected an array, got {}", describe(&other)),
        )),
    }
}

pub(super) fn uint_list(v: Json, path: &str) -> Result<Vec<u64>, ScenarioError> {
    match v {
        Json::UInts(ids) => Ok(ids),
        Json::Array(items) => items
            .iter()
            .enumerate()
            .map(|(k, item)| uint(item, &format!("{path}[{k}]")))
            .collect(),
        other => Err(err(
            path,
            format!("expected an array, got {}", describe(&other)),
        )),
    }
}

/// Index of the string value `v` in `choices`.
pub(super) fn one_of(v: &Json, path: &str, choices: &[&str]) -> Result<usize, ScenarioError> {
    let list = || {
        choices
            .iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match v {
        Json::Str(s) => choices.iter().position(|c| c == s).ok_or_else(|| {
            err(
                path,
                format!("unknown value {}; expected one of {}", quote(s), list()),
            )
        }),
        other => Err(err(
            path,
            format!("expected one of {}, got {}", list(), describe(other)),
        )),
    }
}

/// An object whose keys were checked: no key twice, none outside `allowed`. Values are taken
/// out one by one.
pub(super) struct Obj {
    path: String,
    entries: Vec<(String, Json)>,
}

impl Obj {
    pub(super) fn new(
        v: Json,
        path: &str,
        what: &str,
        allowed: &[&str],
    ) -> Result<Self, ScenarioError> {
        let shown = if path.is_empty() { "scenario" } else { path };
        let entries = match v {
            Json::Object(entries) => entries,
            other => {
                return Err(err(
                    shown,
                    format!("{what} must be a JSON object, got {}", describe(&other)),
                ))
            }
        };
        // Checking stops at the first repeated or unknown key, so at most `allowed.len()`
        // keys are ever compared: a linear scan is enough.
        for (k, (key, _)) in entries.iter().enumerate() {
            if entries[..k].iter().any(|(seen, _)| seen == key) {
                return Err(err(join(path, key), "key given twice"));
            }
            if !allowed.contains(&key.as_str()) {
                return Err(err(
                    join(path, key),
                    format!("unknown field; expected one of {}", allowed.join(", ")),
                ));
            }
        }
        Ok(Obj {
            path: path.to_owned(),
            entries,
        })
    }

    /// Whether `key` is present.
    pub(super) fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, _)| k == key)
    }

    /// Takes the value of `key` out of the object (keys are unique: each is taken once).
    pub(super) fn take(&mut self, key: &str) -> Option<Json> {
        self.entries
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, v)| std::mem::take(v))
    }

    pub(super) fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(super) fn required(&mut self, key: &str) -> Result<Json, ScenarioError> {
        self.take(key)
            .ok_or_else(|| err(self.field(key), "missing required field"))
    }

    pub(super) fn opt_uint(&mut self, key: &str) -> Result<Option<u64>, ScenarioError> {
        self.take(key)
            .map(|v| uint(&v, &self.field(key)))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint_messages() {
        assert_eq!(uint(&Json::UInt(7), "f"), Ok(7));
        for (v, needle) in [
            (Json::Num("-1".into()), "non-negative integer, got -1"),
            (Json::Num("-1.5".into()), "non-negative integer, got -1.5"),
            (Json::Num("16.0".into()), "float 16.0"),
            (Json::Num("1e3".into()), "float 1e3"),
            (Json::Num("18446744073709551616".into()), "64 bits"),
            (Json::Num("1e400".into()), "out of range (got 1e400)"),
            (Json::Str("3".into()), "string"),
            (Json::Bool(true), "boolean"),
            (Json::Null, "null"),
        ] {
            let e = uint(&v, "f").unwrap_err();
            assert_eq!(e.field, "f");
            assert!(e.problem.contains(needle), "{e}");
        }
        let e = uint(&Json::Num("9".repeat(10_000).into()), "f").unwrap_err();
        assert!(e.problem.len() < 200, "{e}");
    }

    #[test]
    fn keys_checked_and_values_taken() {
        let o = |entries: Vec<(&str, Json)>| {
            Json::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
            )
        };
        let mut obj = Obj::new(o(vec![("a", Json::UInt(1))]), "x", "a thing", &["a", "b"]).unwrap();
        assert!(obj.has("a") && !obj.has("b"));
        assert_eq!(obj.opt_uint("a"), Ok(Some(1)));
        assert_eq!(obj.opt_uint("b"), Ok(None));
        assert_eq!(obj.required("b").unwrap_err().field, "x.b");
        let twice = Obj::new(
            o(vec![("a", Json::Null), ("a", Json::Null)]),
            "",
            "a thing",
            &["a"],
        );
        assert_eq!(twice.err().map(|e| e.field), Some("a".to_owned()));
        let long = "k".repeat(1_000_000);
        let e = Obj::new(o(vec![(long.as_str(), Json::Null)]), "", "a thing", &["a"])
            .err()
            .unwrap();
        assert!(e.field.chars().count() < 100, "{}", e.field.len());
        assert!(e.problem.contains("unknown field"));
    }
}
