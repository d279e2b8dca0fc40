//! Typed fields out of the JSON tree, each with its path known: non-negative integers, arrays,
//! lists of integers, one of a set of strings, and objects whose keys were checked (none
//! twice, none unknown). Every problem is a [`ScenarioError`] on the field's path.

use std::collections::HashSet;

use crate::tools::replay::json::{describe, quote, Json};
use crate::tools::replay::{err, ScenarioError};

/// `path.key`, or `path["key"]` when the key is not a plain identifier.
fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{key:?}]"),
    }
}

pub(super) fn uint(v: &Json, path: &str) -> Result<u64, ScenarioError> {
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    match v {
        Json::UInt(n) => Ok(*n),
        Json::NegInt(n) => Err(err(
            path,
            format!("must be a non-negative integer, got {n}"),
        )),
        Json::Float(f) if f.is_finite() && f.fract() == 0.0 && *f >= TWO_POW_64 => Err(err(
            path,
            format!(
                "integer does not fit in 64 bits (got {f:?}; at most {})",
                u64::MAX
            ),
        )),
        Json::Float(f) if *f < 0.0 => Err(err(
            path,
            format!("must be a non-negative integer, got {f:?}"),
        )),
        Json::Float(f) => Err(err(
            path,
            format!("must be a non-negative integer, got float {f:?}"),
        )),
        other => Err(err(
            path,
            format!("expected a non-negative integer, got {}", describe(other)),
        )),
    }
}

pub(super) fn array<'a>(v: &'a Json, path: &str) -> Result<&'a [Json], ScenarioError> {
    match v {
        Json::Array(items) => Ok(items),
        other => Err(err(
            path,
            format!("expected an array, got {}", describe(other)),
        )),
    }
}

pub(super) fn uint_list(v: &Json, path: &str) -> Result<Vec<u64>, ScenarioError> {
    array(v, path)?
        .iter()
        .enumerate()
        .map(|(k, item)| uint(item, &format!("{path}[{k}]")))
        .collect()
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

/// An object whose keys were checked: no key twice, none outside `allowed`.
pub(super) struct Obj<'a> {
    path: String,
    entries: &'a [(String, Json)],
}

impl<'a> Obj<'a> {
    pub(super) fn new(
        v: &'a Json,
        path: &str,
        what: &str,
        allowed: &[&str],
    ) -> Result<Self, ScenarioError> {
        let shown = if path.is_empty() { "scenario" } else { path };
        let Json::Object(entries) = v else {
            return Err(err(
                shown,
                format!("{what} must be a JSON object, got {}", describe(v)),
            ));
        };
        let mut seen = HashSet::new();
        for (key, _) in entries {
            if !seen.insert(key.as_str()) {
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

    pub(super) fn get(&self, key: &str) -> Option<&'a Json> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(super) fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(super) fn required(&self, key: &str) -> Result<&'a Json, ScenarioError> {
        self.get(key)
            .ok_or_else(|| err(self.field(key), "missing required field"))
    }

    pub(super) fn opt_uint(&self, key: &str) -> Result<Option<u64>, ScenarioError> {
        self.get(key).map(|v| uint(v, &self.field(key))).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(join("", "mode"), "mode");
        assert_eq!(join("groups[0]", "window"), "groups[0].window");
        assert_eq!(join("", "a b"), "[\"a b\"]");
    }

    #[test]
    fn uint_messages() {
        assert_eq!(uint(&Json::UInt(7), "f"), Ok(7));
        for (v, needle) in [
            (Json::NegInt(-1), "non-negative"),
            (Json::Float(16.0), "float 16.0"),
            (Json::Float(1.8446744073709552e19), "64 bits"),
            (Json::Str("3".into()), "string"),
            (Json::Bool(true), "boolean"),
            (Json::Null, "null"),
        ] {
            let e = uint(&v, "f").unwrap_err();
            assert_eq!(e.field, "f");
            assert!(e.problem.contains(needle), "{e}");
        }
    }
}
