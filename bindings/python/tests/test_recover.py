"""`kvsched.recover` against `kvsched replay`: every scenario of the repository (outputs
committed beside them, and the binary's output), with and without `--explain`, generated
scenarios of every group kind, mode and policy, and bad input (the same one-line messages)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvsched
from conftest import scenario_files

FILES = scenario_files()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_scenario_matches_its_committed_outcome(path):
    expected_bytes = path.with_name(path.stem + ".expected.json").read_bytes()
    # The text form is the command's stdout byte for byte...
    assert kvsched.recover_json(path.read_bytes()).encode() == expected_bytes
    # ... and the dict form is that text read back, from the scenario read as a dict.
    assert kvsched.recover(json.loads(path.read_text())) == json.loads(expected_bytes)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_scenario_matches_the_binary_with_explain(path, cli):
    text = path.read_bytes()
    code, out, err = cli.replay(text, "--explain")
    assert code == 0, err
    assert kvsched.recover_json(text, explain=True).encode() == out
    assert kvsched.recover(json.loads(text), explain=True) == json.loads(out)


def test_the_scenarios_cover_both_modes_policies_and_every_group_kind():
    seen = {"mode": set(), "policy": set(), "kind": set()}
    for p in FILES:
        s = json.loads(p.read_text())
        seen["mode"].add(s.get("mode", "safe"))
        seen["policy"].add(s.get("policy", "recompute"))
        seen["kind"].update(g["kind"] for g in s["groups"])
    assert seen == {
        "mode": {"safe", "vllm"},
        "policy": {"recompute", "fail"},
        "kind": {"full_attention", "sliding_window", "mamba"},
    }


# --- generated scenarios --------------------------------------------------------------------


@st.composite
def scenarios(draw):
    """A valid scenario: 1-3 groups of every kind, block sizes dividing a common S, async and
    sync requests sharing ids from a small pool (so blocks are shared), flat and/or
    group-qualified reports."""
    n_groups = draw(st.integers(1, 3))
    groups = []
    for _ in range(n_groups):
        kind = draw(st.sampled_from(["full_attention", "sliding_window", "mamba"]))
        g = {"kind": kind, "block_size": draw(st.sampled_from([1, 2, 4, 8, 16]))}
        if kind == "sliding_window":
            g["window"] = draw(st.integers(1, 64))
        if kind == "mamba":
            g["mamba_mode"] = draw(st.sampled_from(["align", "all"]))
        groups.append(g)
    null = draw(st.sampled_from([0, 0, 7]))
    ids = st.integers(1, 24).filter(lambda b: b != null)
    requests = []
    for r in range(draw(st.integers(0, 5))):
        is_async = draw(st.booleans())
        scheduled = 0 if is_async else draw(st.integers(0, 8))
        computed = scheduled + draw(st.integers(0, 64))
        pre = computed - scheduled
        tables = []
        for g in groups:
            n = -(-pre // g["block_size"]) + draw(st.integers(0, 1))
            table = draw(st.lists(ids, min_size=n, max_size=n))
            if g["kind"] != "full_attention":
                # Non-full-attention groups may hold the null block anywhere.
                table = [null if draw(st.integers(0, 3)) == 0 else b for b in table]
            tables.append(table)
        requests.append(
            {
                "id": f"r{r}",
                "class": "async" if is_async else "sync",
                "num_computed_tokens": computed,
                "num_scheduled_tokens": scheduled,
                "block_tables": tables,
            }
        )
    s = {
        "mode": draw(st.sampled_from(["safe", "vllm"])),
        "policy": draw(st.sampled_from(["recompute", "fail"])),
        "groups": groups,
        "requests": requests,
    }
    if null:
        s["null_block_id"] = null
    report = st.lists(st.integers(0, 26), max_size=6)
    form = draw(st.sampled_from(["flat", "by_group", "both"]))
    if form in ("flat", "both"):
        s["invalid_blocks"] = draw(report)
    if form in ("by_group", "both"):
        s["invalid_blocks_by_group"] = [draw(report) for _ in groups]
    return s


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_generated_scenarios_match_the_binary(cli, s):
    text = json.dumps(s).encode()
    code, out, err = cli.replay(text)
    assert code == 0, err
    assert kvsched.recover_json(text).encode() == out
    assert kvsched.recover(s) == json.loads(out)


# --- bad input ----------------------------------------------------------------------------

BASE = {
    "groups": [{"kind": "full_attention", "block_size": 16}],
    "requests": [
        {"id": "a", "class": "sync", "num_computed_tokens": 32, "num_scheduled_tokens": 16,
         "block_tables": [[1, 2]]}
    ],
    "invalid_blocks": [1],
}

BAD = [
    ({**BASE, "mode": "fast"}, "mode"),
    ({**BASE, "policy": 3}, "policy"),
    ({**BASE, "groups": []}, "groups"),
    ({**BASE, "groups": [{"kind": "sliding_window", "block_size": 16}]}, "groups[0].window"),
    ({**BASE, "groups": [{"kind": "full_attention", "block_size": 16.0}]}, "groups[0].block_size"),
    ({**BASE, "groups": [{"kind": "full_attention", "block_size": 0}]}, "groups[0].block_size"),
    ({**BASE, "scheduler_block_size": 24}, "scheduler_block_size"),
    ({**BASE, "null_block_id": -1}, "null_block_id"),
    ({**BASE, "null_block_id": True}, "null_block_id"),
    ({**BASE, "invalid_blocks": [1, 2**64]}, "invalid_blocks[1]"),
    ({**BASE, "invalid_blocks": float("nan")}, "invalid_blocks"),
    ({k: v for k, v in BASE.items() if k != "invalid_blocks"}, "invalid_blocks"),
    ({**BASE, "requests": [{**BASE["requests"][0], "block_tables": []}]}, "requests[0].block_tables"),
    ({**BASE, "requests": [{**BASE["requests"][0], "num_scheduled_tokens": 40}]},
     "requests[0].num_scheduled_tokens"),
    ({**BASE, "requests": [BASE["requests"][0], BASE["requests"][0]]}, "requests[1].id"),
    ({**BASE, "requests": [{**BASE["requests"][0], "extra": 1}]}, "requests[0].extra"),
    ({**BASE, "requests": [{**BASE["requests"][0], "id": ""}]}, "requests[0].id"),
    ({**BASE, "invalid_blocks_by_group": [[1], [2]]}, "invalid_blocks_by_group"),
    ([], "scenario"),
    ("{}", "scenario"),
]


@pytest.mark.parametrize("scenario,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_a_value_error_naming_the_field_like_the_cli(scenario, field, cli):
    with pytest.raises(ValueError) as e:
        kvsched.recover(scenario)
    assert isinstance(e.value, kvsched.ScenarioError)
    assert e.value.field == field
    code, out, err = cli.replay(json.dumps(scenario).encode())
    assert (code, out) == (2, b"")
    assert err == f"error: {e.value}\n"


def test_values_json_cannot_hold_are_errors_on_their_field():
    s = {**BASE, "requests": [{**BASE["requests"][0], "block_tables": [{1, 2}]}]}
    with pytest.raises(kvsched.ScenarioError) as e:
        kvsched.recover(s)
    assert e.value.field == "requests[0].block_tables[0]"
    with pytest.raises(kvsched.ScenarioError) as e:
        kvsched.recover({**BASE, "groups": [{("kind",): 1}]})
    assert e.value.field == "groups[0]"
    # A key that is not a str: json.dumps would write it as one; the error names its dict.
    with pytest.raises(kvsched.ScenarioError) as e:
        kvsched.recover({**BASE, 1: 2})
    assert e.value.field == "scenario" and "keys must be strings" in e.value.problem
    with pytest.raises(kvsched.ScenarioError) as e:
        kvsched.recover({**BASE, "groups": [{**BASE["groups"][0], None: 1}]})
    assert e.value.field == "groups[0]"
    # An int past Python's digit limit for writing it.
    with pytest.raises(kvsched.ScenarioError) as e:
        kvsched.recover({**BASE, "invalid_blocks": [10**5000]})
    assert e.value.field == "invalid_blocks[0]"


def test_tuples_are_lists():
    s = {**BASE, "invalid_blocks": (1,), "requests": [{**BASE["requests"][0], "block_tables": ((1, 2),)}]}
    assert kvsched.recover(s) == kvsched.recover(BASE)


def test_whole_input_problems_of_the_text_form():
    for text, problem in [(b"", "empty input"), (b"\xef\xbb\xbf{}", "byte order mark"),
                          (b'{"a": "\xff"}', "invalid UTF-8")]:
        with pytest.raises(kvsched.ScenarioError) as e:
            kvsched.recover_json(text)
        assert e.value.field == "input" and problem in e.value.problem
    # A str that is no UTF-8 (a lone surrogate): the same whole-input error as such bytes.
    with pytest.raises(kvsched.ScenarioError) as e:
        kvsched.recover_json('{"groups": "\ud800"}')
    assert e.value.field == "input" and "invalid UTF-8" in e.value.problem
    with pytest.raises(TypeError):
        kvsched.recover_json(42)
    with pytest.raises(TypeError, match="^scenario:"):
        kvsched.recover_json([123, 125])  # not taken for the bytes b"{}"
