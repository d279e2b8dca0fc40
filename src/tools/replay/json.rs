//! The JSON tree a scenario is first read into.
//!
//! A small private tree that keeps object entries in order (so a key given twice is detected,
//! where `serde_json::Value` would keep the last one) and keeps every kind of number apart
//! (non-negative integer, negative integer, float — serde_json reads integers beyond 64 bits
//! as floats); fields are then extracted by hand with their path known (`fields`). Also the
//! short descriptions of values that error messages show.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value as written: object entries in order (duplicates kept), numbers by kind.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Json {
    Null,
    Bool(bool),
    /// A non-negative integer within 64 bits.
    UInt(u64),
    /// A negative integer within 64 bits.
    NegInt(i64),
    /// Anything else numeric: a fraction, an exponent, or an integer beyond 64 bits.
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::UInt(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(match u64::try_from(v) {
            Ok(u) => Json::UInt(u),
            Err(_) => Json::NegInt(v),
        })
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Json>()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value::<Json>()?;
            entries.push((key, value));
        }
        Ok(Json::Object(entries))
    }
}

/// A short description of a value for error messages.
pub(super) fn describe(v: &Json) -> String {
    match v {
        Json::Null => "null".to_owned(),
        Json::Bool(b) => format!("boolean {b}"),
        Json::UInt(n) => format!("number {n}"),
        Json::NegInt(n) => format!("number {n}"),
        Json::Float(f) => format!("number {f:?}"),
        Json::Str(s) => format!("string {}", quote(s)),
        Json::Array(_) => "an array".to_owned(),
        Json::Object(_) => "an object".to_owned(),
    }
}

/// `s` quoted and escaped, cut after 40 characters.
pub(super) fn quote(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() > MAX {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}…")
    } else {
        format!("{s:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_json(text: &str) -> Json {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn json_tree_keeps_duplicates_and_number_kinds() {
        let v = parse_json(
            r#"{"a": 1, "a": -2, "b": 16.0, "c": 18446744073709551616, "d": [true, null, "x"]}"#,
        );
        let Json::Object(entries) = v else {
            panic!("not an object")
        };
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0], ("a".to_owned(), Json::UInt(1)));
        assert_eq!(entries[1], ("a".to_owned(), Json::NegInt(-2)));
        assert_eq!(entries[2], ("b".to_owned(), Json::Float(16.0)));
        assert!(matches!(entries[3].1, Json::Float(_)));
        assert_eq!(
            entries[4].1,
            Json::Array(vec![Json::Bool(true), Json::Null, Json::Str("x".into())])
        );
        assert_eq!(parse_json("18446744073709551615"), Json::UInt(u64::MAX));
    }
}
