//! Tests of the scenario JSON reader.

use super::*;

fn parse_json(text: &str) -> Json {
    read(text.as_bytes()).unwrap()
}

fn error(bytes: &[u8]) -> ScenarioError {
    read(bytes).unwrap_err()
}

#[test]
fn json_tree_keeps_duplicates_and_number_kinds() {
    let v = parse_json(
        r#"{"a": 1, "a": -2, "b": 16.0, "c": 18446744073709551616, "d": [true, null, "x"], "e": [1, 2], "f": -0}"#,
    );
    let Json::Object(entries) = v else {
        panic!("not an object")
    };
    assert_eq!(entries.len(), 7);
    assert_eq!(entries[0], ("a".to_owned(), Json::UInt(1)));
    assert_eq!(entries[1], ("a".to_owned(), Json::Num("-2".into())));
    assert_eq!(entries[2], ("b".to_owned(), Json::Num("16.0".into())));
    assert_eq!(entries[3].1, Json::Num("18446744073709551616".into()));
    assert_eq!(
        entries[4].1,
        Json::Array(vec![Json::Bool(true), Json::Null, Json::Str("x".into())])
    );
    assert_eq!(entries[5].1, Json::UInts(vec![1, 2]));
    assert_eq!(entries[6].1, Json::UInt(0));
    assert_eq!(parse_json("18446744073709551615"), Json::UInt(u64::MAX));
    assert_eq!(
        parse_json("[1, \"a\", 2]"),
        Json::Array(vec![Json::UInt(1), Json::Str("a".into()), Json::UInt(2)])
    );
    assert_eq!(parse_json(" [ ] "), Json::UInts(vec![]));
}

#[test]
fn strings_and_escapes() {
    assert_eq!(
        parse_json(r#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00é""#),
        Json::Str("a\"\\/\u{8}\u{c}\n\r\té😀é".into())
    );
    for (bad, needle) in [
        (&br#""\x""#[..], "invalid escape"),
        (br#""\ud83d""#, "surrogate"),
        (br#""\ude00""#, "surrogate"),
        (br#""\u12""#, "four hex digits"),
        (b"\"a\nb\"", "control character U+000A"),
        (b"\"abc", "EOF while parsing a string"),
    ] {
        let e = error(bad);
        assert_eq!(e.field, "scenario", "{e}");
        assert!(e.problem.contains(needle), "{e}");
    }
}

#[test]
fn errors_name_the_path() {
    for (text, field, needle) in [
        (r#"{"groups": ["#, "groups", "EOF while parsing a list"),
        (
            r#"{"groups": [{"kind": }]}"#,
            "groups[0].kind",
            "expected a value",
        ),
        (r#"{"a": [1, 2, NaN]}"#, "a[2]", "NaN is not a JSON number"),
        (
            r#"{"a": [Infinity]}"#,
            "a[0]",
            "Infinity is not a JSON number",
        ),
        (r#"{"a": -Infinity}"#, "a", "-Infinity is not a JSON number"),
        (r#"{"a": 01}"#, "a", "leading zero"),
        (r#"{"a": 1.}"#, "a", "after the decimal point"),
        (r#"{"a": 1e}"#, "a", "exponent"),
        (r#"{"a": tru}"#, "a", "expected a value, found \"tru\""),
        (r#"{"a" 1}"#, "a", "expected ':'"),
        (r#"{"a": 1 "b": 2}"#, "scenario", "expected ',' or '}'"),
        (r#"{"a": [1 2]}"#, "a", "expected ',' or ']'"),
        (r#"{1: 2}"#, "scenario", "expected a key"),
        (r#"{"a b": x}"#, r#"["a b"]"#, "expected a value"),
        ("{} x", "scenario", "trailing characters"),
    ] {
        let e = error(text.as_bytes());
        assert_eq!(e.field, field, "{text}: {e}");
        assert!(e.problem.contains(needle), "{text}: {e}");
        assert!(e.problem.contains(" at line 1 column "), "{text}: {e}");
    }
    let deep = "[".repeat(200);
    let e = error(deep.as_bytes());
    assert!(e.problem.contains("nested deeper"), "{e}");
    // The path names the deep field without listing 128 levels.
    assert_eq!(e.field, "[0][0][0][0]…(120 levels)…[0][0][0][0]", "{e}");
    let keyed = format!("{}tru{}", "{\"k\": ".repeat(10), "}".repeat(10));
    let e = error(keyed.as_bytes());
    assert_eq!(e.field, "k.k.k.k…(2 levels)….k.k.k.k", "{e}");
}

#[test]
fn whole_input_problems_are_on_input() {
    for (bytes, needle) in [
        (&b""[..], "empty input"),
        (b" \n", "only whitespace"),
        (b"\xEF\xBB\xBF{}", "byte order mark"),
        (b"\xFF\xFE{\x00}\x00", "UTF-16 little-endian"),
        (b"\xFE\xFF\x00{\x00}", "UTF-16 big-endian"),
        (b"{\x00}\x00", "UTF-16"),
        (b"{\"a\": \"\xFF\"}", "invalid UTF-8 at byte 7"),
    ] {
        let e = error(bytes);
        assert_eq!(e.field, "input", "{e}");
        assert!(e.problem.contains(needle), "{e}");
    }
}

#[test]
fn line_and_column() {
    assert_eq!(line_column(b"ab\ncd", 4), (2, 2));
    assert_eq!(line_column("é\nx".as_bytes(), 1), (1, 2));
    let e = error(b"{\n  \"a\": ?\n}");
    assert!(e.problem.ends_with("at line 2 column 8"), "{e}");
}

#[test]
fn shown_values_are_cut() {
    let long = "x".repeat(1000);
    assert!(quote(&long).chars().count() <= SHOW_MAX + 1);
    assert!(quote(&long).ends_with('…'));
    assert_eq!(quote("ab"), "\"ab\"");
    assert!(cut(&"9".repeat(500)).chars().count() <= SHOW_MAX);
    assert!(join("", &long).chars().count() <= SHOW_MAX + 3);
    assert_eq!(join("", "mode"), "mode");
    assert_eq!(join("groups[0]", "window"), "groups[0].window");
    assert_eq!(join("", "a b"), "[\"a b\"]");
}
