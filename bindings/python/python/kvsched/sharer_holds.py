"""Mode ``safe``'s waiting sharers across steps, importable without vLLM.

:class:`SharerHolds` keeps the waits (:class:`~kvsched.recovery.Wait`) of each
:class:`~kvsched.recovery.RecoveryPlan`: which requests must not be scheduled yet, which waits
their owners' progress has satisfied, and the hand-off (a re-plan) of a block whose owner ended
before rewriting it. :mod:`kvsched.vllm` re-exports it and drives it from vLLM's scheduler.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvsched._args import U64_MAX, shown, unordered
from kvsched.recovery import CacheGroup, RecoveryPlan, RequestState, Wait, plan_recovery

__all__ = ["SharerHolds"]


class SharerHolds:
    """Mode ``safe``'s waiting sharers, kept across steps.

    After :meth:`add` of a plan, :meth:`held` says whether a request must not be scheduled yet;
    :meth:`refresh` drops the waits whose owner has recomputed past the block (a Mamba ``align``
    state: ended a step at it), and for a block whose owner ended first (finished, failed,
    preempted), or went past an ``align`` state without ending a step there, hands the block
    to the next waiter, and so does an owner that no longer holds the block (its blocks
    freed and new ones given, so it recomputes into those):
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
        holding: Callable[[str, int], bool] | None = None,
    ) -> dict[int, list[str]]:
        """``computed(id)``: a live request's ``num_computed_tokens``, ``None`` once it ended;
        ``last(id)``: an ended request's ``num_computed_tokens`` when it ended, ``None`` when
        not known. An owner that ended after rewriting a block (as far as ``last`` knows)
        leaves its waiters nothing to wait for. ``holding(owner, block)``: whether a live
        owner's block tables still hold the block; one that does not (vLLM freed its blocks
        and gave it new ones, as for an async load that failed at 0 computed tokens) rewrites
        it nowhere, however far it computes, and hands it on as an owner that ended first.

        Returns, per block whose owner ended before rewriting it (or not known to have), its
        waiters in the order they were added (canonical order); those waits are dropped here,
        for :meth:`replan`. A callback answering anything but a whole number ≥ 0 or ``None``
        (NaN, a float, a string) is a ``TypeError`` or ``ValueError`` naming the callback and
        the request, and so is a ``holding`` answering no ``bool``; either leaves every wait
        as it was. So is a ``computed`` that is not callable or a ``last`` or ``holding``
        that is neither callable nor ``None``, naming it.
        """
        if not callable(computed):
            raise TypeError(f"computed: expected a callable, not {type(computed).__name__}")
        if last is not None and not callable(last):
            raise TypeError(f"last: expected a callable or None, not {type(last).__name__}")
        if holding is not None and not callable(holding):
            raise TypeError(
                f"holding: expected a callable or None, not {type(holding).__name__}"
            )
        # Every answer is asked for and checked before any wait changes.
        now: dict[str, int | None] = {}
        ended: dict[str, int | None] = {}
        gone: set[tuple[str, int]] = set()
        for rid, ws in self._waits.items():
            for r in [rid, *(w.owner for w in ws)]:
                if r not in now:
                    now[r] = _tokens("computed", r, computed(r))
            for w in ws:
                if now[w.owner] is None and w.owner not in ended:
                    done = last(w.owner) if last is not None else None
                    ended[w.owner] = _tokens("last", w.owner, done)
                elif now[w.owner] is not None and holding is not None and now[rid] is not None:
                    if not _holds_answer(w.owner, w.block, holding(w.owner, w.block)):
                        gone.add((w.owner, w.block))
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
                        _orphan(orphaned, w.block, rid)
                elif (w.owner, w.block) in gone:
                    # Recomputing into other blocks: this one is never rewritten.
                    _orphan(orphaned, w.block, rid)
                elif c < w.ready_at:
                    keep.append(w)
                elif w.exact and c > w.ready_at:
                    # An ``align`` state the owner went past inside a step: never written.
                    _orphan(orphaned, w.block, rid)
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
        are added. Returns a list of one :class:`RecoveryPlan` (empty when nothing is
        orphaned): apply its ``num_computed_tokens`` (and evictions) as after
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


def _orphan(orphaned: dict[int, list[str]], block: int, rid: str) -> None:
    """Adds ``rid`` to the waiters of ``block`` once (a sharer may wait for one block id in
    several groups: one :class:`Wait` each)."""
    waiters = orphaned.setdefault(block, [])
    if rid not in waiters:
        waiters.append(rid)


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
        if not 0 <= block <= U64_MAX:
            raise ValueError(f"orphaned: block id {shown(block)} is outside 0..={U64_MAX}")
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


def _holds_answer(owner: str, block: int, value: Any) -> bool:
    """A ``holding`` callback's answer: a ``bool`` (numpy's too), else a ``TypeError`` naming
    the callback, the owner and the block."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"holding({owner!r}, {block}): expected a bool, not {value!r}")
    return bool(value)


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
