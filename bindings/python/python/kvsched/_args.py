"""Checks of arguments shared by :mod:`kvsched.tier` and :mod:`kvsched.vllm`."""

from __future__ import annotations

from collections.abc import ItemsView, KeysView, Mapping, Set, ValuesView
from typing import Any


def unordered(value: Any) -> bool:
    """Whether ``value`` is a collection whose order is no list's: a set or frozenset (hash
    order, which changes with ``PYTHONHASHSEED``), a dict or other mapping (iterating gives its
    keys), or a mapping's view. Where items are paired by position (a job's keys with its
    slots, a table's entries with token positions), such a value is refused, never listed."""
    return isinstance(value, (Set, Mapping, KeysView, ValuesView, ItemsView))
