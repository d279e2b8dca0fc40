"""kvsched's recovery rules as vLLM's scheduler needs them, pure and importable without vLLM.

What ``_handle_invalid_blocks`` has in, what it must apply out (``docs/rules.md``):

* :class:`CacheGroup`, :class:`RequestState` — the cache groups and the requests the scheduler
  examines;
* :func:`plan_recovery` — a report of invalid block ids decided by the rules: a
  :class:`RecoveryPlan` (each affected request's new ``num_computed_tokens``, the requests to
  skip, fail or mark ``failed_recving``, the blocks to evict, and in mode ``safe`` the sharers
  that must wait, :class:`Wait`);
* :func:`scenario_of` / :func:`plan_from_outcome` — its two halves: the ``kvsched replay``
  scenario of the call (``docs/replay.md``), and the plan of that scenario's outcome.

Mode ``safe``'s waits across steps are :mod:`kvsched.sharer_holds`; the rules wired into a vLLM
scheduler are :mod:`kvsched.vllm`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched import ScenarioError, _native, recover
from kvsched._args import U64_MAX, unordered

__all__ = [
    "CacheGroup",
    "RequestState",
    "Wait",
    "RecoveryPlan",
    "plan_recovery",
    "scenario_of",
    "plan_from_outcome",
]

KINDS = ("full_attention", "sliding_window", "mamba")


@dataclass(frozen=True)
class CacheGroup:
    """One KV cache group: ``kind`` (``full_attention``, ``sliding_window``, ``mamba``), its
    ``block_size`` in tokens, the ``window`` of a sliding-window group and the ``mamba_mode``
    (``align`` or ``all``) of a Mamba group."""

    kind: str
    block_size: int
    window: int | None = None
    mamba_mode: str | None = None

    def to_json(self) -> dict[str, Any]:
        g: dict[str, Any] = {"kind": self.kind, "block_size": self.block_size}
        if self.window is not None:
            g["window"] = self.window
        if self.mamba_mode is not None:
            g["mamba_mode"] = self.mamba_mode
        return g


@dataclass(frozen=True)
class RequestState:
    """A request as ``_handle_invalid_blocks`` sees it: async (``WAITING_FOR_REMOTE_KVS``, its
    load in flight) or sync (running), its block ids per group, ``num_computed_tokens``
    (including the step's scheduled tokens) and the step's scheduled tokens (0 when async)."""

    request_id: str
    is_async: bool
    block_ids: Sequence[Sequence[int]]
    num_computed_tokens: int
    num_scheduled_tokens: int = 0


@dataclass(frozen=True)
class Wait:
    """A sharer must not read ``block`` until ``owner`` has recomputed it: until the owner's
    ``num_computed_tokens`` reaches ``ready_at`` (the end of the block in the owner's table).
    With one pool per group an id stands for another block in each group: the sharer then
    gets one ``Wait`` per group it reads the id from, each at the owner's entry in that group.

    ``exact``: the block is a Mamba ``align`` state, which only a step *ending* at
    ``ready_at`` writes (a step writes the state where it ends). An owner seen past
    ``ready_at`` without having been seen at it went past the block without writing it: the
    block is handed over as if the owner had ended (:meth:`SharerHolds.refresh`)."""

    block: int
    owner: str
    ready_at: int
    exact: bool = False


@dataclass
class RecoveryPlan:
    """What the scheduler must apply.

    * ``num_computed_tokens`` — the new value of every affected request;
    * ``skip`` — running requests whose sampled tokens of the step are discarded (recompute);
    * ``failed`` — requests to finish with an error (policy ``fail``);
    * ``failed_recving`` — async requests whose load result is cached only up to their new
      ``num_computed_tokens`` (vLLM's ``failed_recving_kv_req_ids``);
    * ``evict_blocks`` — block ids to drop from the prefix cache (reference counts unchanged);
    * ``waits`` — mode ``safe``: per sharer, the blocks it must not read yet, and their owners;
    * ``affected_tokens`` / ``total_affected_tokens`` — computed tokens thrown away;
    * ``outcome`` — the whole outcome dict, as :func:`kvsched.recover` returns it.
    """

    num_computed_tokens: dict[str, int]
    skip: set[str]
    failed: set[str]
    failed_recving: set[str]
    evict_blocks: list[int]
    waits: dict[str, list[Wait]]
    affected_tokens: dict[str, int]
    total_affected_tokens: int
    outcome: dict[str, Any] = field(repr=False)

    @property
    def affected(self) -> set[str]:
        """Every request the report touched."""
        return set(self.num_computed_tokens)

    def request_ids_to_skip(self) -> set[str]:
        """What vLLM's ``_handle_invalid_blocks`` returns: the requests ``update_from_output``
        must not process normally in this step (``skip`` and ``failed``)."""
        return self.skip | self.failed


def plan_recovery(
    requests: Iterable[RequestState],
    groups: Sequence[CacheGroup],
    invalid_block_ids: Iterable[int],
    *,
    null_block_id: int = 0,
    policy: str = "recompute",
    mode: str = "safe",
    invalid_block_ids_by_group: Sequence[Iterable[int]] | None = None,
    scheduler_block_size: int | None = None,
) -> RecoveryPlan:
    """The recovery of ``requests`` (canonical order: queue order within each class; async
    requests are decided first wherever they stand) from a report of ``invalid_block_ids``
    (flat: an id matches in every group whose table holds it) and/or
    ``invalid_block_ids_by_group`` (one list per group).

    ``policy`` is ``"recompute"`` (vLLM's ``recompute_kv_load_failures=True``) or ``"fail"``;
    ``mode`` is ``"safe"`` (kvsched's rules) or ``"vllm"`` (vLLM 0.33's, bit-exact on one
    full-attention group, extended by the hybrid rule). Bad input raises
    :class:`kvsched.ScenarioError` (a ``ValueError``) naming the field, e.g.
    ``requests[2].block_tables``.
    """
    # Listed once, refusing a set (its order would decide who owns a shared block); the
    # scenario then holds every table listed once too, so one-shot iterators are read once.
    reqs = _seq("requests", requests)
    groups = _seq("groups", groups)
    scenario = scenario_of(
        reqs,
        groups,
        invalid_block_ids,
        null_block_id=null_block_id,
        policy=policy,
        mode=mode,
        invalid_block_ids_by_group=invalid_block_ids_by_group,
        scheduler_block_size=scheduler_block_size,
    )
    return plan_from_outcome(recover(scenario), reqs, groups, scenario)


def scenario_of(
    requests: Sequence[RequestState],
    groups: Sequence[CacheGroup],
    invalid_block_ids: Iterable[int],
    *,
    null_block_id: int = 0,
    policy: str = "recompute",
    mode: str = "safe",
    invalid_block_ids_by_group: Sequence[Iterable[int]] | None = None,
    scheduler_block_size: int | None = None,
) -> dict[str, Any]:
    """The replay scenario (``docs/replay.md``) of a ``_handle_invalid_blocks`` call: what
    ``kvsched replay`` would be given to decide it."""
    scenario: dict[str, Any] = {
        "mode": mode,
        "policy": policy,
        "null_block_id": null_block_id,
        "groups": [_group(f"groups[{i}]", g).to_json() for i, g in enumerate(_seq("groups", groups))],
        "requests": [_request(f"requests[{i}]", r) for i, r in enumerate(_seq("requests", requests))],
        "invalid_blocks": _ids("invalid_blocks", invalid_block_ids),
    }
    if scheduler_block_size is not None:
        scenario["scheduler_block_size"] = scheduler_block_size
    if invalid_block_ids_by_group is not None:
        scenario["invalid_blocks_by_group"] = [
            _ids(f"invalid_blocks_by_group[{i}]", g)
            for i, g in enumerate(_seq("invalid_blocks_by_group", invalid_block_ids_by_group))
        ]
    return scenario


def _seq(field: str, value: Any) -> list[Any]:
    """``value`` as a list: any iterable but a string, bytes, or an unordered collection (a
    set, a dict, a dict's view: a table is an ordered list, requests are in canonical order;
    a dict would give its keys). An iterator is read once, here."""
    if value is None or isinstance(value, (str, bytes)) or unordered(value):
        raise ScenarioError(field, f"expected a list, not {type(value).__name__}")
    try:
        return list(value)
    except TypeError:
        raise ScenarioError(field, f"expected a list, not {type(value).__name__}") from None


def _is_block_id(value: Any) -> bool:
    """Whether ``value`` is a block id the scenario parser takes: an ``int`` (no ``bool``, no
    float, however whole) in ``0..=2**64-1``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def _ids(field: str, value: Any) -> list[Any]:
    """Block ids, sorted without duplicates. Every entry is checked where it stands first:
    if any is no id, the entries are passed on unsorted, for the scenario parser to name the
    first bad one at its own index (``invalid_blocks[2]: ...``). Sorting first would move it
    (``[9, 2.5]`` named index 0) or merge it into an equal id (``[2, 2.0]``, ``[1, True]``
    were taken as ``[2]`` and ``[1]``)."""
    if unordered(value) and not isinstance(value, Mapping):  # ids: sorted below
        value = list(value)
    ids = _seq(field, value)
    if not all(_is_block_id(b) for b in ids):
        return ids
    # An int subclass as the int it holds: its own __eq__, __hash__ or __lt__ may say anything.
    return sorted({int.__index__(b) for b in ids})


def _group(field: str, g: Any) -> CacheGroup:
    if not isinstance(g, CacheGroup):
        raise ScenarioError(field, f"expected a CacheGroup, not {type(g).__name__}")
    return g


def _request(field: str, r: Any) -> dict[str, Any]:
    """The scenario entry of request ``r`` (a :class:`RequestState`, or any object with its
    attributes)."""
    try:
        rid, is_async, tables = r.request_id, r.is_async, r.block_ids
        computed, scheduled = r.num_computed_tokens, r.num_scheduled_tokens
    except AttributeError as e:
        raise ScenarioError(field, f"expected a RequestState: {e}") from None
    if not isinstance(is_async, bool) and type(is_async).__name__ != "bool_":
        raise ScenarioError(f"{field}.is_async", f"expected a bool, not {type(is_async).__name__}")
    if isinstance(rid, str) and type(rid) is not str:
        # A str subclass is taken as its characters: its own __eq__ and __hash__, which the
        # plan's maps would otherwise call, may say anything.
        rid = str.__str__(rid)
    return {
        "id": rid,
        "class": "async" if is_async else "sync",
        "num_computed_tokens": computed,
        "num_scheduled_tokens": scheduled,
        "block_tables": [
            _seq(f"{field}.block_tables[{j}]", t)
            for j, t in enumerate(_seq(f"{field}.block_tables", tables))
        ],
    }


def plan_from_outcome(
    outcome: dict[str, Any],
    requests: Sequence[RequestState],
    groups: Sequence[CacheGroup],
    scenario: dict[str, Any],
) -> RecoveryPlan:
    """The plan of a replay outcome of ``requests`` (input order). The owners' tables are
    read from ``scenario`` (listed once by :func:`scenario_of`), never from ``requests``
    again: a table given as an iterator has been consumed."""
    by_id = {r["id"]: r["block_tables"] for r in scenario["requests"]}
    reported = _reported(scenario, len(groups))
    num_computed: dict[str, int] = {}
    affected_tokens: dict[str, int] = {}
    waits: dict[str, list[Wait]] = {}
    ends: dict[str, dict[tuple[int, int], tuple[int, bool]]] = {}
    for d in outcome["requests"]:
        if not d["affected"]:
            continue
        rid = d["id"]
        num_computed[rid] = d["num_computed_tokens"]
        affected_tokens[rid] = d["affected_tokens"]
        if d["waits_for"]:
            ws: list[Wait] = []
            held = [set(t) for t in by_id[rid]]
            for w in d["waits_for"]:
                owner, block = w["owner"], w["block"]
                if owner not in ends:
                    ends[owner] = _rewritten_at(by_id[owner], groups, reported)
                for ready_at, exact in _ready_at(ends[owner], held, block):
                    ws.append(Wait(block, owner, ready_at, exact))
            waits[rid] = ws
    return RecoveryPlan(
        num_computed_tokens=num_computed,
        skip=set(outcome["skip"]),
        failed=set(outcome["failed"]),
        failed_recving=set(outcome["failed_recving"]),
        evict_blocks=list(outcome["evicted_blocks"]),
        waits=waits,
        affected_tokens=affected_tokens,
        total_affected_tokens=outcome["total_affected_tokens"],
        outcome=outcome,
    )


def _reported(scenario: dict[str, Any], n_groups: int) -> list[set[int]]:
    """Per group, the ids the report names for it."""
    flat = set(scenario.get("invalid_blocks", ()))
    by_group = scenario.get("invalid_blocks_by_group") or [[] for _ in range(n_groups)]
    return [flat | set(g) for g in by_group]


def _rewritten_at(
    tables: Sequence[Sequence[int]], groups: Sequence[CacheGroup], reported: list[set[int]]
) -> dict[tuple[int, int], tuple[int, bool]]:
    """Per group and reported block in the owner's ``tables``, the owner's
    ``num_computed_tokens`` from which it is rewritten — the end of its first reported entry
    in that group — and whether that is a Mamba ``align`` state, written only by a step ending
    exactly there (:class:`Wait`). One pass over the owner's tables, however many sharers wait
    for it."""
    out: dict[tuple[int, int], tuple[int, bool]] = {}
    for gi, (g, table) in enumerate(zip(groups, tables)):
        exact = g.kind == "mamba" and g.mamba_mode == "align"
        exact = exact and not _native._PLANT_ALIGN_WAIT_INEXACT
        for i, b in enumerate(table):
            if b in reported[gi] and (gi, b) not in out:
                out[(gi, b)] = ((i + 1) * g.block_size, exact)
    return out


def _ready_at(
    owner_ends: dict[tuple[int, int], tuple[int, bool]],
    sharer_tables: Sequence[set[int]],
    block: int,
) -> list[tuple[int, bool]]:
    """Where the owner has rewritten ``block`` for the sharer: in each group whose table holds
    it in both (with one pool per group an id stands for another block in each group, and the
    owner's entry of another group ends elsewhere), one ``(ready_at, exact)`` each, distinct.
    A sharer that holds it in no group the owner does waits for the owner's first entry."""
    mine = [
        owner_ends[(gi, block)]
        for gi, table in enumerate(sharer_tables)
        if (gi, block) in owner_ends and block in table
    ]
    if _native._PLANT_WAIT_ANY_GROUP or not mine:
        # Planted bug `wait-any-group` (scripts/plants.sh): the owner's first entry of the id
        # in any group, though that group's block is another.
        firsts = [e for (_, b), e in owner_ends.items() if b == block]
        return [min(firsts)] if firsts else [(0, False)]
    return sorted(set(mine))
