"""The recovery rules for vLLM's scheduler, importable without vLLM.

vLLM's scheduler calls ``_handle_invalid_blocks`` when a KV connector reports blocks whose load
failed. vLLM 0.33 handles one full-attention cache group; on a hybrid model (sliding-window or
Mamba groups beside full attention) a multi-group report raises or falls back to recomputing
whole requests. This module gives the scheduler kvsched's rules instead (``docs/rules.md``):
every group scanned with its own block size, null entries skipped, one rollback point every
group can resume from, and in mode ``safe`` one owner per invalid block with the other requests
that read it held back until it is rewritten.

Three layers, use the one that fits:

* :func:`plan_recovery` — pure: what the scheduler has (per request: id, async or sync, block
  ids per group, ``num_computed_tokens``, scheduled tokens; the groups; the null block id; the
  invalid ids; the policy) in, a :class:`RecoveryPlan` out: the new ``num_computed_tokens`` of
  each affected request, the requests to skip, fail or mark ``failed_recving``, the blocks to
  evict, and in mode ``safe`` the sharers that must wait (:class:`Wait`).
* :class:`SharerHolds` — mode ``safe``'s waiting sharers across steps: which requests must not
  be scheduled yet, and the hand-off when an owner ends before rewriting a block.
* :class:`KvschedRecoveryMixin` — both wired into a vLLM ``Scheduler`` / ``AsyncScheduler``
  subclass (``_handle_invalid_blocks`` and ``schedule``), reading vLLM's objects by duck typing.
  Install it with ``--scheduler-cls`` (see ``bindings/python/README.md``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched import ScenarioError, _native, recover
from kvsched._args import unordered

__all__ = [
    "CacheGroup",
    "RequestState",
    "Wait",
    "RecoveryPlan",
    "plan_recovery",
    "SharerHolds",
    "groups_from_kv_cache_config",
    "requests_from_scheduler",
    "KvschedRecoveryMixin",
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


_U64_MAX = (1 << 64) - 1


def _is_block_id(value: Any) -> bool:
    """Whether ``value`` is a block id the scenario parser takes: an ``int`` (no ``bool``, no
    float, however whole) in ``0..=2**64-1``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _U64_MAX


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
    ends: dict[str, dict[int, int]] = {}
    for d in outcome["requests"]:
        if not d["affected"]:
            continue
        rid = d["id"]
        num_computed[rid] = d["num_computed_tokens"]
        affected_tokens[rid] = d["affected_tokens"]
        if d["waits_for"]:
            for w in d["waits_for"]:
                if w["owner"] not in ends:
                    ends[w["owner"]] = _rewritten_at(by_id[w["owner"]], groups, reported)
            waits[rid] = [
                Wait(w["block"], w["owner"], *ends[w["owner"]].get(w["block"], (0, False)))
                for w in d["waits_for"]
            ]
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
) -> dict[int, tuple[int, bool]]:
    """Per reported block in the owner's ``tables``, the owner's ``num_computed_tokens`` from
    which it is rewritten — the end of its first reported entry there — and whether that is
    a Mamba ``align`` state, written only by a step ending exactly there (:class:`Wait`). One
    pass over the owner's tables, however many sharers wait for it."""
    out: dict[int, tuple[int, bool]] = {}
    for gi, (g, table) in enumerate(zip(groups, tables)):
        exact = g.kind == "mamba" and g.mamba_mode == "align"
        exact = exact and not _native._PLANT_ALIGN_WAIT_INEXACT
        for i, b in enumerate(table):
            if b in reported[gi]:
                end = (i + 1) * g.block_size
                if b not in out or end < out[b][0]:
                    out[b] = (end, exact)
    return out


class SharerHolds:
    """Mode ``safe``'s waiting sharers, kept across steps.

    After :meth:`add` of a plan, :meth:`held` says whether a request must not be scheduled yet;
    :meth:`refresh` drops the waits whose owner has recomputed past the block (a Mamba ``align``
    state: ended a step at it), and for a block whose owner ended first (finished, failed,
    preempted), or went past an ``align`` state without ending a step there, hands the block
    to the next waiter:
    it returns the requests and block that must be re-planned (the next waiter then owns it and
    rolls back; the others wait for it), which :meth:`replan` does.
    """

    def __init__(self) -> None:
        self._waits: dict[str, list[Wait]] = {}

    def add(self, plan: RecoveryPlan) -> None:
        """Records the waits of ``plan`` (a :class:`RecoveryPlan`, else a ``TypeError``)."""
        if not isinstance(plan, RecoveryPlan):
            raise TypeError(f"plan: expected a RecoveryPlan, not {type(plan).__name__}")
        for rid, ws in plan.waits.items():
            self._waits.setdefault(rid, []).extend(ws)

    def held(self, request_id: str) -> bool:
        """Whether ``request_id`` (a ``str``, else a ``TypeError``) must not be scheduled yet."""
        return bool(self._waits.get(_request_id(request_id)))

    def waiting(self) -> dict[str, list[Wait]]:
        return {k: list(v) for k, v in self._waits.items() if v}

    def forget(self, request_id: str) -> None:
        """A waiting request ended: it waits for nothing any more."""
        self._waits.pop(_request_id(request_id), None)

    def refresh(
        self,
        computed: Callable[[str], int | None],
        last: Callable[[str], int | None] | None = None,
    ) -> dict[int, list[str]]:
        """``computed(id)``: a live request's ``num_computed_tokens``, ``None`` once it ended;
        ``last(id)``: an ended request's ``num_computed_tokens`` when it ended, ``None`` when
        not known. An owner that ended after rewriting a block (as far as ``last`` knows)
        leaves its waiters nothing to wait for.

        Returns, per block whose owner ended before rewriting it (or not known to have), its
        waiters in the order they were added (canonical order); those waits are dropped here,
        for :meth:`replan`. A callback answering anything but a whole number ≥ 0 or ``None``
        (NaN, a float, a string) is a ``TypeError`` or ``ValueError`` naming the callback and
        the request, and leaves every wait as it was; so is a ``computed`` that is not
        callable or a ``last`` that is neither callable nor ``None``, naming it.
        """
        if not callable(computed):
            raise TypeError(f"computed: expected a callable, not {type(computed).__name__}")
        if last is not None and not callable(last):
            raise TypeError(f"last: expected a callable or None, not {type(last).__name__}")
        # Every answer is asked for and checked before any wait changes.
        now: dict[str, int | None] = {}
        ended: dict[str, int | None] = {}
        for rid, ws in self._waits.items():
            for r in [rid, *(w.owner for w in ws)]:
                if r not in now:
                    now[r] = _tokens("computed", r, computed(r))
            for w in ws:
                if now[w.owner] is None and w.owner not in ended:
                    done = last(w.owner) if last is not None else None
                    ended[w.owner] = _tokens("last", w.owner, done)
        orphaned: dict[int, list[str]] = {}
        for rid in list(self._waits):
            if now[rid] is None:
                del self._waits[rid]
                continue
            keep = []
            for w in self._waits[rid]:
                c = now[w.owner]
                if c is None:
                    done = ended[w.owner]
                    if done is None or done < w.ready_at or (w.exact and done != w.ready_at):
                        orphaned.setdefault(w.block, []).append(rid)
                elif c < w.ready_at:
                    keep.append(w)
                elif w.exact and c > w.ready_at:
                    # An ``align`` state the owner went past inside a step: never written.
                    orphaned.setdefault(w.block, []).append(rid)
            self._waits[rid] = keep
        return orphaned

    def replan(
        self,
        orphaned: Mapping[int, Sequence[str]],
        state: Callable[[str], RequestState],
        groups: Sequence[CacheGroup],
        **kw: Any,
    ) -> list[RecoveryPlan]:
        """The hand-off of the orphaned blocks: their waiters (as sync requests with nothing
        scheduled, their current tables) re-planned together on one report of every orphaned
        block, so each block's first waiter owns it and a waiter that owns several rolls back
        to the earliest (block by block, the last plan applied would win); the plan's waits
        are added. Apply the plan's ``num_computed_tokens`` (and evictions) as after
        ``_handle_invalid_blocks``.

        ``orphaned`` is what :meth:`refresh` returns (a mapping of block ids to lists of
        request ids), ``state`` a callable answering a :class:`RequestState` (or an object
        with its attributes) for a request id: anything else is a ``TypeError`` naming the
        argument (``state('r1')`` for an answer), before any wait changes."""
        blocks, waiters = _orphaned(orphaned)
        if not callable(state):
            raise TypeError(f"state: expected a callable, not {type(state).__name__}")
        if not blocks:
            return []
        reqs = [_replanned(r, state(r)) for r in waiters]
        plan = plan_recovery(reqs, groups, blocks, **kw)
        self.add(plan)
        return [plan]


def _request_id(value: Any) -> str:
    """A request id given to :class:`SharerHolds`: a ``str``, else a ``TypeError``."""
    if not isinstance(value, str):
        raise TypeError(f"request_id: expected a str, not {type(value).__name__}")
    return str.__str__(value)


def _orphaned(value: Any) -> tuple[list[int], list[str]]:
    """:meth:`SharerHolds.replan`'s ``orphaned``: its block ids, and its waiters in order, each
    once; a ``TypeError`` naming ``orphaned`` for what :meth:`SharerHolds.refresh` would never
    return."""
    if not isinstance(value, Mapping):
        raise TypeError(
            "orphaned: expected a mapping of block ids to waiters (as refresh returns), "
            f"not {type(value).__name__}"
        )
    blocks: list[int] = []
    waiters: list[str] = []
    for block, ws in value.items():
        if isinstance(block, bool) or not isinstance(block, int):
            raise TypeError(
                f"orphaned: a block id must be a whole number, not {type(block).__name__}"
            )
        if not 0 <= block <= _U64_MAX:
            raise ValueError(f"orphaned: block id {_shown(block)} is outside 0..={_U64_MAX}")
        if isinstance(ws, (str, bytes)) or unordered(ws) or not isinstance(ws, Iterable):
            raise TypeError(
                f"orphaned[{block}]: expected a list of request ids, not {type(ws).__name__}"
            )
        blocks.append(int.__index__(block))
        for i, r in enumerate(list(ws)):
            if not isinstance(r, str):
                raise TypeError(f"orphaned[{block}][{i}]: expected a str, not {type(r).__name__}")
            r = str.__str__(r)
            if r not in waiters:
                waiters.append(r)
    return blocks, waiters


def _replanned(rid: str, s: Any) -> RequestState:
    """Waiter ``rid`` as :meth:`SharerHolds.replan` re-plans it: sync, nothing scheduled, from
    ``s``, what ``state(rid)`` answered."""
    try:
        return RequestState(s.request_id, False, s.block_ids, s.num_computed_tokens, 0)
    except AttributeError:
        raise TypeError(
            f"state({rid!r}): expected a RequestState, not {type(s).__name__}"
        ) from None


# --- vLLM's objects, duck-typed ---------------------------------------------------------


def groups_from_kv_cache_config(kv_cache_config: Any, mamba_mode: str = "align") -> list[CacheGroup]:
    """The cache groups of a vLLM ``KVCacheConfig`` (``kv_cache_groups[i].kv_cache_spec``):
    a spec with a ``sliding_window`` (not ``None``) is a sliding-window group, a Mamba spec
    (its class name has ``Mamba``) a Mamba group in the spec's ``mamba_cache_mode`` when that
    is ``"align"`` or ``"all"``, else in ``mamba_mode``, any other a full-attention group.

    What the rules refuse is refused here, as a :class:`kvsched.ScenarioError` naming the
    field: a ``block_size`` or ``sliding_window`` that is no whole number in ``1..=2**64-1``
    (``kv_cache_groups[1].block_size: must be > 0, got 0``), a ``mamba_mode`` other than
    ``"align"`` or ``"all"``."""
    if not isinstance(mamba_mode, str) or str.__str__(mamba_mode) not in ("align", "all"):
        raise ScenarioError(
            "mamba_mode", f'expected "align" or "all", got {_shown(mamba_mode)}'
        )
    out = []
    for g in kv_cache_config.kv_cache_groups:
        field = f"kv_cache_groups[{len(out)}]"
        spec = g.kv_cache_spec
        name = type(spec).__name__
        bs = _positive(f"{field}.block_size", spec.block_size)
        if "Mamba" in name:
            # A spec's own mode where it names one of the rules' (vLLM's default, "none",
            # caches no Mamba prefix and names none): else `mamba_mode`.
            mode = getattr(spec, "mamba_cache_mode", None)
            if not isinstance(mode, str) or str.__str__(mode) not in ("align", "all"):
                mode = mamba_mode
            out.append(CacheGroup("mamba", bs, mamba_mode=str.__str__(mode)))
        elif getattr(spec, "sliding_window", None) is not None:
            window = _positive(f"{field}.sliding_window", spec.sliding_window)
            out.append(CacheGroup("sliding_window", bs, window=window))
        else:
            out.append(CacheGroup("full_attention", bs))
    return out


def _tokens(callback: str, request_id: str, value: Any) -> int | None:
    """A :meth:`SharerHolds.refresh` callback's answer for ``request_id``: ``None`` or a whole
    number ≥ 0, else a ``TypeError`` or ``ValueError`` naming the callback and the request."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{callback}({request_id!r}): expected a token count or None, not {value!r}"
        )
    if value < 0:
        raise ValueError(f"{callback}({request_id!r}): {int(value)} tokens is negative")
    return int(value)


def _whole(field: str, value: Any) -> int:
    """``value`` as an int: a float is not floored into one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ScenarioError(field, f"expected a whole number, not {_shown(value)}")
    return int(value)


def _positive(field: str, value: Any) -> int:
    """A block size or window as the rules take it: a whole number in ``1..=2**64-1``."""
    v = _whole(field, value)
    if v <= 0:
        raise ScenarioError(field, f"must be > 0, got {_shown(v)}")
    if v > _U64_MAX:
        raise ScenarioError(field, f"does not fit in 64 bits (got {_shown(v)}; at most {_U64_MAX})")
    return v


def _shown(value: Any) -> str:
    """``value`` for a one-line message: its repr, cut to 60 characters."""
    try:
        text = repr(value)
    except Exception:  # a repr that raises says nothing about the value
        text = f"<{type(value).__name__} too long to show>"
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _status_name(request: Any) -> str:
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


def _waiting_requests(scheduler: Any) -> list[Any]:
    """The scheduler's waiting requests (``skipped_waiting`` first where vLLM has it)."""
    seen: set[str] = set()
    out = []
    for queue in _waiting_queues(scheduler):
        for r in getattr(queue, "requests", queue):
            if r.request_id not in seen:
                seen.add(r.request_id)
                out.append(r)
    return out


def requests_from_scheduler(
    scheduler: Any, num_scheduled_tokens: Mapping[str, int] | None = None
) -> list[RequestState]:
    """The requests ``_handle_invalid_blocks`` examines, in canonical order: the waiting ones
    in ``WAITING_FOR_REMOTE_KVS`` (async), then ``running`` (sync, with their scheduled tokens
    of the step from ``num_scheduled_tokens``, else ``scheduler_output``'s), block ids from
    ``kv_cache_manager.get_block_ids``."""
    sched = dict(num_scheduled_tokens or {})
    manager = scheduler.kv_cache_manager
    out = [
        RequestState(r.request_id, True, manager.get_block_ids(r.request_id), r.num_computed_tokens, 0)
        for r in _waiting_requests(scheduler)
        if _status_name(r) == "WAITING_FOR_REMOTE_KVS"
    ]
    out += [
        RequestState(
            r.request_id,
            False,
            manager.get_block_ids(r.request_id),
            r.num_computed_tokens,
            sched.get(r.request_id, 0),
        )
        for r in scheduler.running
    ]
    return out


def _null_block_id(scheduler: Any) -> int:
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    null = getattr(pool, "null_block", None)
    return int(getattr(null, "block_id", 0))


_ENDED = {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED", "FINISHED_IGNORED",
          "FINISHED_ERROR", "PREEMPTED"}


class KvschedRecoveryMixin:
    """kvsched's recovery in a vLLM scheduler: put it first in the bases of a subclass of
    vLLM's ``Scheduler`` or ``AsyncScheduler``.

    ``_handle_invalid_blocks`` decides with :func:`plan_recovery` and applies the plan as vLLM's
    own does: each affected request's ``num_computed_tokens``, ``failed_recving_kv_req_ids``,
    the prefix-cache evictions (``kv_cache_manager.evict_blocks``), and returns the ids
    ``update_from_output`` must skip. In mode ``safe`` it also records the waiting sharers, and
    ``schedule`` holds them out of ``running`` until their owners have rewritten the shared
    blocks (handing a block to the next waiter when its owner ends first).

    Class attributes: ``kvsched_mode`` (``"safe"`` or ``"vllm"``), ``kvsched_mamba_mode``.
    """

    kvsched_mode = "safe"
    kvsched_mamba_mode = "align"

    def _kvsched_holds(self) -> SharerHolds:
        holds = self.__dict__.get("_kvsched_sharer_holds")
        if holds is None:
            holds = SharerHolds()
            self.__dict__["_kvsched_sharer_holds"] = holds
        return holds

    def _kvsched_groups(self) -> list[CacheGroup]:
        return groups_from_kv_cache_config(self.kv_cache_config, self.kvsched_mamba_mode)

    def _kvsched_policy(self) -> str:
        return "recompute" if getattr(self, "recompute_kv_load_failures", True) else "fail"

    def update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        # The step's scheduled tokens, for vLLM versions whose `_handle_invalid_blocks` is not
        # given them.
        self._kvsched_num_scheduled_tokens = getattr(scheduler_output, "num_scheduled_tokens", None)
        # Owners' progress now counts the step's scheduled tokens (vLLM adds them at schedule
        # time), and an owner this output finishes is still live: the waits it satisfied are
        # dropped before it ends, not handed off as if it ended first.
        self._kvsched_release()
        return super().update_from_output(scheduler_output, *args, **kwargs)  # type: ignore[misc]

    def _handle_invalid_blocks(
        self, invalid_block_ids: set[int], num_scheduled_tokens: Mapping[str, int] | None = None
    ) -> set[str]:
        if num_scheduled_tokens is None:
            num_scheduled_tokens = getattr(self, "_kvsched_num_scheduled_tokens", None) or {}
        plan = plan_recovery(
            requests_from_scheduler(self, num_scheduled_tokens),
            self._kvsched_groups(),
            invalid_block_ids,
            null_block_id=_null_block_id(self),
            policy=self._kvsched_policy(),
            mode=self.kvsched_mode,
        )
        self._kvsched_apply(plan)
        self._kvsched_holds().add(plan)
        return plan.request_ids_to_skip()

    def _kvsched_apply(self, plan: RecoveryPlan) -> None:
        for rid, n in plan.num_computed_tokens.items():
            req = self.requests.get(rid)
            if req is not None:
                req.num_computed_tokens = n
        self.failed_recving_kv_req_ids |= plan.failed_recving
        if plan.evict_blocks:
            evict = getattr(self.kv_cache_manager, "evict_blocks", None)
            if evict is not None:
                evict(set(plan.evict_blocks))

    def _kvsched_computed(self, rid: str) -> int | None:
        req = self.requests.get(rid)
        if req is None or _status_name(req) in _ENDED:
            return None
        return req.num_computed_tokens

    def _kvsched_last(self, rid: str) -> int | None:
        """An ended request's progress when it ended, while the scheduler still has it (a
        preempted one restarts from 0: not known to have rewritten anything)."""
        req = self.requests.get(rid)
        if req is None or _status_name(req) == "PREEMPTED":
            return None
        return req.num_computed_tokens

    def _kvsched_release(self) -> None:
        """Refreshes the holds; hands orphaned blocks to their next waiters."""
        holds = self._kvsched_holds()
        orphaned = holds.refresh(self._kvsched_computed, self._kvsched_last)
        if not orphaned:
            return
        manager = self.kv_cache_manager

        def state(rid: str) -> RequestState:
            r = self.requests[rid]
            return RequestState(rid, False, manager.get_block_ids(rid), r.num_computed_tokens)

        for plan in holds.replan(
            orphaned,
            state,
            self._kvsched_groups(),
            null_block_id=_null_block_id(self),
            policy=self._kvsched_policy(),
            mode=self.kvsched_mode,
        ):
            self._kvsched_apply(plan)

    def kvsched_held(self, request_id: str) -> bool:
        """Whether a request must not be scheduled yet (a sharer whose owner has not rewritten
        the shared block)."""
        return self._kvsched_holds().held(request_id)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._kvsched_release()
        holds = self._kvsched_holds()
        held = [r for r in self.running if holds.held(r.request_id)]
        # A held sharer still waiting (its async load landed, or it was preempted) must not
        # be admitted either: it leaves the waiting queues for the call.
        out_of_waiting = [
            (q, _take_out(q, lambda r: holds.held(r.request_id))) for q in _waiting_queues(self)
        ]
        if not held:
            try:
                return super().schedule(*args, **kwargs)  # type: ignore[misc]
            finally:
                _put_back(out_of_waiting)
        before = list(self.running)
        self.running = [r for r in before if not holds.held(r.request_id)]
        try:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            # The held requests go back where they stood; what schedule added follows.
            after = list(self.running)
            kept = {id(r) for r in after} | {id(r) for r in held}
            self.running = [r for r in before if id(r) in kept] + [
                r for r in after if all(r is not b for b in before)
            ]
            _put_back(out_of_waiting)


def _waiting_queues(scheduler: Any) -> list[Any]:
    """The scheduler's waiting queues (``skipped_waiting`` first where vLLM has it; a
    multi-queue's parts)."""
    out = []
    for q in (getattr(scheduler, "skipped_waiting", None), getattr(scheduler, "waiting", None)):
        if q is not None:
            out.extend(q.get_all_queues() if hasattr(q, "get_all_queues") else [q])
    return out


def _take_out(queue: Any, held: Callable[[Any], bool]) -> list[tuple[int, Any]]:
    """Removes the held requests from ``queue``; returns them with their positions."""
    items = list(getattr(queue, "requests", queue))
    taken = [(i, r) for i, r in enumerate(items) if held(r)]
    if not taken:
        return []
    if hasattr(queue, "remove_requests"):
        queue.remove_requests([r for _, r in taken])
    else:
        for _, r in taken:
            queue.remove(r)
    return taken


def _put_back(taken: list[tuple[Any, list[tuple[int, Any]]]]) -> None:
    """Puts the held requests back: where they stood in a list, else at the queue's front
    (``prepend_request``), else by ``add_request`` (a priority queue orders them itself)."""
    for queue, reqs in taken:
        if isinstance(queue, list):
            for i, r in reqs:
                queue.insert(min(i, len(queue)), r)
        elif hasattr(queue, "prepend_request"):
            for _, r in reversed(reqs):
                queue.prepend_request(r)
        else:
            for _, r in reqs:
                queue.add_request(r)
