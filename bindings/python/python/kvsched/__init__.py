"""kvsched for Python: hybrid-correct recovery of failed KV-cache loads.

* :func:`recover` — the recovery rules on a scenario in the ``kvsched replay`` format
  (``docs/replay.md``): a dict in, the outcome dict out, the same as ``kvsched replay`` prints.
* :mod:`kvsched.vllm` — the rules as vLLM's scheduler needs them at ``_handle_invalid_blocks``
  (re-exporting :mod:`kvsched.recovery`, the pure plan of a report, and
  :mod:`kvsched.sharer_holds`, mode ``safe``'s waiting sharers across steps).
* :mod:`kvsched.tier` — a vLLM secondary tier (``SecondaryTierManager``) on kvsched's memory,
  disk and Redis tiers, every chunk checked by checksum and keyed MAC.

None of these modules imports vLLM unless it is installed.
"""

from __future__ import annotations

import json
from typing import Any

from kvsched import _native

__all__ = ["ScenarioError", "recover", "recover_json", "HAS_REDIS"]

#: Whether this build has the Redis tier.
HAS_REDIS: bool = _native.HAS_REDIS


class ScenarioError(ValueError):
    """A bad scenario: ``field`` (a path such as ``requests[1].block_tables``) and ``problem``.

    ``str(e)`` is ``"field: problem"``, the line ``kvsched replay`` prints after ``error:``.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def recover_json(scenario: str | bytes, *, explain: bool = False) -> str:
    """The outcome of a scenario given as JSON text, as the exact text ``kvsched replay``
    prints (``--explain`` with ``explain=True``): pretty-printed, trailing newline.

    Raises :class:`ScenarioError` (a ``ValueError``) on bad input, with the command's message.
    A ``scenario`` that is no text or an ``explain`` that is no ``bool`` is a ``TypeError``
    naming it.
    """
    _check_explain(explain)
    if not isinstance(scenario, (str, bytes, bytearray, memoryview)):
        # (A list of ints would pass for bytes on the native side.)
        raise TypeError(f"scenario: expected str or bytes, not {type(scenario).__name__}")
    if isinstance(scenario, str):
        try:
            scenario.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ScenarioError(
                "input", f"invalid UTF-8: a lone surrogate at character {e.start}"
            ) from None
    text, field, problem = _native.recover_json(scenario, explain)
    if text is None:
        raise ScenarioError(field, problem)
    return text


def recover(scenario: dict[str, Any], *, explain: bool = False) -> dict[str, Any]:
    """The recovery outcome of ``scenario`` (the ``kvsched replay`` format, as a dict).

    The dict is written as JSON and read by the same parser as ``kvsched replay``, so every
    check and message is the command's: ``ScenarioError`` (a ``ValueError``) names the field
    (``groups[0].window: missing required field (for a sliding_window group)``). Values JSON
    cannot hold (a set, bytes, an object) are errors on their field too. Tuples count as lists.
    The outcome is ``json.loads`` of what the command prints. An ``explain`` that is no
    ``bool`` is a ``TypeError`` naming it.
    """
    _check_explain(explain)
    try:
        text = json.dumps(scenario, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        err = _unencodable(scenario, "")
        if err is not _TOO_DEEP:
            raise err from None
        # Nested too deeply for json.dumps itself. The parser reads the text in order and
        # stops, with its own message, at the first container past its nesting limit; the
        # levels down to there, written with nothing below them, give that message.
        text = json.dumps(
            _cut(scenario, _PARSER_DEPTH + 1), allow_nan=True, skipkeys=True, default=lambda _: None
        )
    try:
        return json.loads(recover_json(text, explain=explain))
    except ScenarioError:
        # json.dumps writes a key that is not a str (an int, a float, a bool, None) as a
        # string: the parser's error would name the field "1". Name the dict holding it.
        # A walk stopped by the nesting limit found none: the parser's message (the
        # command's, as for recover_json) stands.
        found = _find_unencodable(scenario, "", 0)
        if found is not None and found is not _TOO_DEEP:
            raise found from None
        raise


#: The nesting the parser reads (serde_json's limit); deeper is its error.
_PARSER_DEPTH = 128

#: What the walk below answers past the parser's nesting, never raised: the parser's own
#: message is given instead.
_TOO_DEEP = ScenarioError("scenario", "nested too deeply")


def _cut(value: Any, levels: int) -> Any:
    """``value`` down to ``levels`` levels of lists and dicts, those below written empty."""
    if isinstance(value, dict):
        return {} if levels <= 0 else {k: _cut(v, levels - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [] if levels <= 0 else [_cut(v, levels - 1) for v in value]
    return value


def _check_explain(explain: Any) -> None:
    if not isinstance(explain, bool):
        raise TypeError(f"explain: expected a bool, not {type(explain).__name__}")


def _unencodable(value: Any, path: str) -> ScenarioError:
    """The error for the first value under ``value`` that JSON cannot hold."""
    found = _find_unencodable(value, path, 0)
    if found is None:  # json.dumps failed on something this walk accepts
        return ScenarioError(path or "scenario", "cannot be written as JSON")
    return found


def _find_unencodable(value: Any, path: str, depth: int) -> ScenarioError | None:
    shown = path or "scenario"
    if depth > _PARSER_DEPTH:
        return _TOO_DEEP
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            str(value)
        except ValueError:  # past Python's digit limit for int -> str
            return ScenarioError(shown, "an integer too long to write as JSON")
        return None
    if value is None or isinstance(value, (bool, float, str)):
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return ScenarioError(
                    shown, f"keys must be strings, got {type(k).__name__} {k!r}"
                )
            sub = f"{path}.{k}" if path else k
            err = _find_unencodable(v, sub, depth + 1)
            if err is not None:
                return err
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            err = _find_unencodable(v, f"{path}[{i}]", depth + 1)
            if err is not None:
                return err
        return None
    return ScenarioError(
        shown,
        f"a {type(value).__name__} is not a JSON value; "
        "expected a number, string, list or dict",
    )
