//! Replays every scenario in `tests/scenarios/` through the library (parse → run → render)
//! and compares the outcome with `NAME.expected.json` (values hand-computed from docs/rules.md).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::replay::{parse_scenario, render_outcome};
use serde_json::Value;

fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

/// Every `NAME.json` (not `NAME.expected.json`) in the folder, sorted.
fn scenario_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(scenario_dir())
        .expect("tests/scenarios exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".json") && !name.ends_with(".expected.json")
        })
        .collect();
    files.sort();
    files
}

fn expected_path(scenario: &Path) -> PathBuf {
    let stem = scenario
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("utf-8 file name");
    scenario.with_file_name(format!("{stem}.expected.json"))
}

/// Lists the differences between two JSON values, one per line, with their paths.
fn diff(path: &str, expected: &Value, actual: &Value, out: &mut String) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, ev) in e {
                match a.get(k) {
                    Some(av) => diff(&format!("{path}.{k}"), ev, av, out),
                    None => {
                        let _ = writeln!(out, "  {path}.{k}: missing (expected {ev})");
                    }
                }
            }
            for k in a.keys().filter(|k| !e.contains_key(*k)) {
                let _ = writeln!(out, "  {path}.{k}: unexpected key (value {})", a[k]);
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                diff(&format!("{path}[{i}]"), ev, av, out);
            }
        }
        _ if expected != actual => {
            let _ = writeln!(out, "  {path}: expected {expected}, got {actual}");
        }
        _ => {}
    }
}

fn check(scenario: &Path) -> Result<(), String> {
    let name = scenario.display();
    let text = std::fs::read_to_string(scenario).map_err(|e| format!("{name}: {e}"))?;
    let expected_file = expected_path(scenario);
    let expected_text = std::fs::read_to_string(&expected_file).map_err(|e| {
        format!(
            "{name}: no expected outcome {} ({e})",
            expected_file.display()
        )
    })?;
    let expected: Value = serde_json::from_str(&expected_text)
        .map_err(|e| format!("{}: bad JSON: {e}", expected_file.display()))?;
    let parsed = parse_scenario(&text).map_err(|e| format!("{name}: rejected: {e}"))?;
    let outcome = parsed.run();
    let rendered = render_outcome(&parsed, &outcome);
    let actual: Value = serde_json::from_str(&rendered)
        .map_err(|e| format!("{name}: rendered output is not JSON: {e}\n{rendered}"))?;
    if actual != expected {
        let mut d = String::new();
        diff("$", &expected, &actual, &mut d);
        return Err(format!("{name}: outcome differs from expected:\n{d}"));
    }
    Ok(())
}

#[test]
fn every_scenario_matches_its_expected_outcome() {
    let files = scenario_files();
    assert!(
        files.len() >= 10,
        "tests/scenarios must hold at least 10 scenarios, found {}",
        files.len()
    );
    let failures: Vec<String> = files.iter().filter_map(|f| check(f).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn every_expected_file_has_a_scenario() {
    let dir = scenario_dir();
    for entry in std::fs::read_dir(&dir).expect("tests/scenarios exists") {
        let path = entry.expect("readable dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(stem) = name.strip_suffix(".expected.json") {
            assert!(
                dir.join(format!("{stem}.json")).is_file(),
                "{name} has no scenario {stem}.json"
            );
        } else {
            assert!(
                name.ends_with(".json"),
                "unexpected file in tests/scenarios: {name}"
            );
        }
    }
}

#[test]
fn rendering_is_pretty_with_trailing_newline_and_spec_key_order() {
    let files = scenario_files();
    let first = files.first().expect("at least one scenario");
    let text = std::fs::read_to_string(first).expect("readable");
    let parsed = parse_scenario(&text).expect("valid scenario");
    let rendered = render_outcome(&parsed, &parsed.run());
    assert!(rendered.ends_with("}\n"), "{rendered}");
    let keys = [
        "\"affected\"",
        "\"skip\"",
        "\"failed\"",
        "\"failed_recving\"",
        "\"total_affected_tokens\"",
        "\"evicted_blocks\"",
        "\"requests\"",
    ];
    let positions: Vec<usize> = keys
        .iter()
        .map(|k| rendered.find(k).expect("key present"))
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "keys out of order:\n{rendered}"
    );
    assert!(rendered.starts_with("{\n  \"affected\": "), "{rendered}");
}

/// The explained run is the plain run: the same outcome, one trace per request whose chosen
/// computed length is the outcome's, and a rendering that is the plain one plus `explain`.
#[test]
fn explained_runs_equal_plain_runs() {
    use crate::replay::{render_explain_text, render_outcome_explained};
    for f in scenario_files() {
        let text = std::fs::read_to_string(&f).expect("readable");
        let sc = parse_scenario(&text).expect("valid scenario");
        let plain = sc.run();
        let (outcome, traces) = sc.run_explained();
        assert_eq!(outcome, plain, "{}", f.display());
        assert_eq!(traces.len(), sc.requests.len(), "{}", f.display());
        for (t, d) in traces.iter().zip(&outcome.requests) {
            let chosen = t.chosen.map(|(b, _)| b);
            assert_eq!(chosen, Some(d.num_computed_tokens), "{}", f.display());
            assert_eq!(t.scan.len(), sc.geometry.num_groups(), "{}", f.display());
        }
        let mut with: Value =
            serde_json::from_str(&render_outcome_explained(&sc, &outcome, &traces)).expect("JSON");
        let without: Value = serde_json::from_str(&render_outcome(&sc, &plain)).expect("JSON");
        assert!(with
            .as_object_mut()
            .and_then(|o| o.remove("explain"))
            .is_some());
        assert_eq!(with, without, "{}", f.display());
        assert!(render_explain_text(&sc, &outcome, &traces).starts_with("mode "));
    }
}
