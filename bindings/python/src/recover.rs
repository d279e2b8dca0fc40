//! `recover_json`: a scenario in the replay format (`docs/replay.md`) through the same parser,
//! rules and renderer as `kvsched replay` (the `kvsched-replay` crate), so the text it returns
//! is the command's standard output byte for byte and its errors are the command's one-line
//! messages, split into field and problem.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use kvsched_replay::{parse_scenario_bytes, render_outcome, render_outcome_explained};

/// What `recover_json` returns: `(outcome, None, None)`, or `(None, field, problem)` for bad
/// input.
type Answer = (Option<String>, Option<String>, Option<String>);

/// `recover_json(scenario: str | bytes, explain: bool = False)`: the outcome JSON of the
/// scenario, or the field and problem of its first error. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (scenario, explain = false))]
pub fn recover_json(
    py: Python<'_>,
    scenario: &Bound<'_, PyAny>,
    explain: bool,
) -> PyResult<Answer> {
    let bytes: Vec<u8> = if let Ok(text) = scenario.extract::<String>() {
        text.into_bytes()
    } else if let Ok(raw) = scenario.extract::<Vec<u8>>() {
        raw
    } else {
        return Err(PyTypeError::new_err(
            "scenario: expected the scenario's JSON as str or bytes",
        ));
    };
    Ok(py.detach(move || match parse_scenario_bytes(bytes) {
        Ok(scenario) => {
            let text = if explain {
                let (outcome, traces) = scenario.run_explained();
                render_outcome_explained(&scenario, &outcome, &traces)
            } else {
                render_outcome(&scenario, &scenario.run())
            };
            (Some(text), None, None)
        }
        Err(e) => (None, Some(e.field), Some(e.problem)),
    }))
}
