"""Checks of arguments shared by :mod:`kvsched.tier`, :mod:`kvsched.vllm` and the modules
behind it (:mod:`kvsched.recovery`, :mod:`kvsched.sharer_holds`)."""

from __future__ import annotations

from collections.abc import ItemsView, KeysView, Mapping, Set, ValuesView
from typing import Any

#: The largest block id (and block size, window) the rules take: ``2**64 - 1``.
U64_MAX = (1 << 64) - 1


def unordered(value: Any) -> bool:
    """Whether ``value`` is a collection whose order is no list's: a set or frozenset (hash
    order, which changes with ``PYTHONHASHSEED``), a dict or other mapping (iterating gives its
    keys), or a mapping's view. Where items are paired by position (a job's keys with its
    slots, a table's entries with token positions), such a value is refused, never listed."""
    return isinstance(value, (Set, Mapping, KeysView, ValuesView, ItemsView))


def shown(value: Any) -> str:
    """``value`` for a one-line message: its repr, cut to 60 characters."""
    try:
        text = repr(value)
    except Exception:  # a repr that raises says nothing about the value
        text = f"<{type(value).__name__} too long to show>"
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."
