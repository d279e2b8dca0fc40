"""The recovery rules for vLLM's scheduler, importable without vLLM.

vLLM's scheduler calls ``_handle_invalid_blocks`` when a KV connector reports blocks whose load
failed. vLLM's rule recovers one full-attention cache group; on a hybrid model (sliding-window
or Mamba groups beside full attention) a multi-group request raises (earlier versions) or is
replayed from token 0, every block of it evicted (the current one). This module gives the scheduler kvsched's rules instead (``docs/rules.md``):
every group scanned with its own block size, null entries skipped, one rollback point every
group can resume from, and in mode ``safe`` one owner per invalid block with the other requests
that read it held back until it is rewritten.

Three layers, use the one that fits, all importable from here:

* :func:`plan_recovery` (:mod:`kvsched.recovery`) — pure: what the scheduler has (per
  request: id, async or sync, block ids per group, ``num_computed_tokens``, scheduled tokens;
  the groups; the null block id; the invalid ids; the policy) in, a :class:`RecoveryPlan` out:
  the new ``num_computed_tokens`` of each affected request, the requests to skip, fail or mark
  ``failed_recving``, the blocks to evict, and in mode ``safe`` the sharers that must wait
  (:class:`Wait`).
* :class:`SharerHolds` (:mod:`kvsched.sharer_holds`) — mode ``safe``'s waiting sharers across
  steps: which requests must not be scheduled yet, and the hand-off when an owner ends before
  rewriting a block.
* :class:`KvschedRecoveryMixin` — both wired into a vLLM ``Scheduler`` / ``AsyncScheduler``
  subclass (``_handle_invalid_blocks`` and ``schedule``), reading vLLM's objects by duck typing.
  Install it with ``--scheduler-cls`` (see ``bindings/python/README.md``).

This module holds the third: the mixin, and what it reads from vLLM's objects
(:func:`groups_from_kv_cache_config`, :func:`requests_from_scheduler`, the waiting queues).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvsched import ScenarioError, _native
from kvsched import recovery as _recovery
from kvsched._args import U64_MAX, shown
from kvsched.recovery import CacheGroup, RecoveryPlan, RequestState, Wait, plan_recovery
from kvsched.sharer_holds import SharerHolds

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

# kvsched.recovery's names outside __all__, importable from here as before the split.
KINDS = _recovery.KINDS
scenario_of = _recovery.scenario_of
plan_from_outcome = _recovery.plan_from_outcome


def groups_from_kv_cache_config(kv_cache_config: Any, mamba_mode: str = "align") -> list[CacheGroup]:
    """The cache groups of a vLLM ``KVCacheConfig`` (``kv_cache_groups[i].kv_cache_spec``):
    a spec with a ``sliding_window`` (not ``None``) is a sliding-window group, a
    ``ChunkedLocalAttentionSpec`` (chunked local attention, its class name has
    ``ChunkedLocal``) a sliding-window group whose window is its ``attention_chunk_size``, a
    Mamba spec (its class name has ``Mamba``) a Mamba group in the spec's ``mamba_cache_mode``
    when that is ``"align"`` or ``"all"``, else in ``mamba_mode``, any other a full-attention
    group.

    Chunked local attention: a token attends to the tokens of its own chunk before it, so
    resuming at ``c`` needs at most the ``chunk - 1`` tokens before ``c`` — what a window of
    the chunk size needs, or more — and vLLM puts the null block in the entries before the
    current chunk, which a window group allows. Where those null entries lie inside the
    window, the rules find no state there and roll the request back further: never less safe
    than the chunk needs. (A ``FullAttentionSpec`` with an ``attention_chunk_size``, vLLM's
    layout without the hybrid allocator, keeps every entry: a full-attention group.)

    What the rules refuse is refused here, as a :class:`kvsched.ScenarioError` naming the
    field: a ``block_size`` or ``sliding_window`` that is no whole number in ``1..=2**64-1``
    (``kv_cache_groups[1].block_size: must be > 0, got 0``), a ``mamba_mode`` other than
    ``"align"`` or ``"all"``."""
    if not isinstance(mamba_mode, str) or str.__str__(mamba_mode) not in ("align", "all"):
        raise ScenarioError(
            "mamba_mode", f'expected "align" or "all", got {shown(mamba_mode)}'
        )
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Iterable):
        raise TypeError(
            "kv_cache_config: expected a vLLM KVCacheConfig (its kv_cache_groups), "
            f"not {type(kv_cache_config).__name__}"
        )
    out = []
    for g in groups:
        field = f"kv_cache_groups[{len(out)}]"
        spec = getattr(g, "kv_cache_spec", None)
        if spec is None:
            raise TypeError(f"{field}.kv_cache_spec: missing")
        name = type(spec).__name__
        bs = _positive(f"{field}.block_size", getattr(spec, "block_size", None))
        if "Mamba" in name:
            # A spec's own mode where it names one of the rules' (vLLM's default, "none",
            # caches no Mamba prefix and names none): else `mamba_mode`.
            mode = getattr(spec, "mamba_cache_mode", None)
            if not isinstance(mode, str) or str.__str__(mode) not in ("align", "all"):
                mode = mamba_mode
            out.append(CacheGroup("mamba", bs, mamba_mode=str.__str__(mode)))
        elif "ChunkedLocal" in name:
            chunk = _positive(
                f"{field}.attention_chunk_size", getattr(spec, "attention_chunk_size", None)
            )
            out.append(CacheGroup("sliding_window", bs, window=chunk))
        elif getattr(spec, "sliding_window", None) is not None:
            window = _positive(f"{field}.sliding_window", spec.sliding_window)
            out.append(CacheGroup("sliding_window", bs, window=window))
        else:
            out.append(CacheGroup("full_attention", bs))
    return out


def _whole(field: str, value: Any) -> int:
    """``value`` as an int: a float is not floored into one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ScenarioError(field, f"expected a whole number, not {shown(value)}")
    return int(value)


def _positive(field: str, value: Any) -> int:
    """A block size or window as the rules take it: a whole number in ``1..=2**64-1``."""
    v = _whole(field, value)
    if v <= 0:
        raise ScenarioError(field, f"must be > 0, got {shown(v)}")
    if v > U64_MAX:
        raise ScenarioError(field, f"does not fit in 64 bits (got {shown(v)}; at most {U64_MAX})")
    return v


def _status_name(request: Any) -> str:
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


def _ended(request: Any) -> bool:
    """Whether a request has ended as far as its blocks go: preempted, or finished by vLLM's
    own rule (``RequestStatus.is_finished``: every status past ``PREEMPTED``, whatever new
    finished statuses a vLLM version adds, such as ``FINISHED_REPETITION``); a status with no
    such rule is finished when its name starts with ``FINISHED``."""
    status = getattr(request, "status", None)
    name = _status_name(request)
    if name == "PREEMPTED":
        return True
    if _native._PLANT_ENDED_BY_STATUS_LIST:
        # Planted bug `ended-by-status-list` (scripts/plants.sh): a fixed list of names.
        return name in _ENDED_BY_NAME
    is_finished = getattr(type(status), "is_finished", None)
    if callable(is_finished):
        try:
            return bool(is_finished(status))
        except Exception:  # a rule that does not take its own status: ask by name
            pass
    return name.startswith("FINISHED")


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
    scheduler: Any,
    num_scheduled_tokens: Mapping[str, int] | None = None,
    groups: Sequence[CacheGroup] | None = None,
    scheduled_since: Mapping[str, int] | None = None,
) -> list[RequestState]:
    """The requests ``_handle_invalid_blocks`` examines, in canonical order: the waiting ones
    in ``WAITING_FOR_REMOTE_KVS`` (async), then ``running`` (sync, with their scheduled tokens
    of the step from ``num_scheduled_tokens``, else ``scheduler_output``'s), block ids from
    ``kv_cache_manager.get_block_ids``.

    ``scheduled_since``: per request, the tokens of steps scheduled after the reported one
    and not yet reported (vLLM's ``AsyncScheduler`` schedules step N+1 before it hands
    ``update_from_output`` step N's output, and adds a step's tokens to
    ``num_computed_tokens`` when it schedules it): they are no part of the request's length
    at the reported step, whose pre-step length is ``num_computed_tokens`` less both.

    With ``groups`` (the one-argument ``_handle_invalid_blocks`` of an older vLLM, which sets
    an async loader's ``num_computed_tokens`` only once its load lands): an async request at
    0 tokens and not in ``failed_recving_kv_req_ids`` is taken at the tokens its tables
    cover, as that vLLM's scan does — at 0 its scan range would be empty, and a failed load
    would go unnoticed."""
    sched = dict(num_scheduled_tokens or {})
    since = dict(scheduled_since or {})
    manager = scheduler.kv_cache_manager
    failed = getattr(scheduler, "failed_recving_kv_req_ids", set())

    def loading(r: Any) -> int:
        tables = manager.get_block_ids(r.request_id)
        if (
            groups is None
            or r.num_computed_tokens != 0
            or r.request_id in failed
            or _native._PLANT_LEGACY_LOADER_AT_ZERO
        ):
            return r.num_computed_tokens
        return min(len(t) * g.block_size for t, g in zip(tables, groups))

    out = [
        RequestState(r.request_id, True, manager.get_block_ids(r.request_id), loading(r), 0)
        for r in _waiting_requests(scheduler)
        if _status_name(r) == "WAITING_FOR_REMOTE_KVS"
    ]
    out += [
        RequestState(
            r.request_id,
            False,
            manager.get_block_ids(r.request_id),
            r.num_computed_tokens - since.get(r.request_id, 0),
            sched.get(r.request_id, 0),
        )
        for r in scheduler.running
    ]
    return out


def _null_block_id(scheduler: Any) -> int:
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    null = getattr(pool, "null_block", None)
    return int(getattr(null, "block_id", 0))


# The finished statuses of vLLM 0.33, for the plant `ended-by-status-list` only.
_ENDED_BY_NAME = {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED",
                  "FINISHED_IGNORED", "FINISHED_ERROR"}


class KvschedRecoveryMixin:
    """kvsched's recovery in a vLLM scheduler: put it first in the bases of a subclass of
    vLLM's ``Scheduler`` or ``AsyncScheduler``.

    ``_handle_invalid_blocks`` decides with :func:`plan_recovery` and applies the plan as vLLM's
    own does: each affected request's ``num_computed_tokens``, ``failed_recving_kv_req_ids``,
    the prefix-cache evictions (``kv_cache_manager.evict_blocks``), and returns the ids
    ``update_from_output`` must skip. In mode ``safe`` it also records the waiting sharers, and
    ``schedule`` holds them out of ``running`` until their owners have rewritten the shared
    blocks (handing a block to the next waiter when its owner ends first, or no longer holds
    it), lowering ``max_num_running_reqs`` by their number meanwhile. Under ``AsyncScheduler``
    the tokens of steps scheduled after the reported one (recorded from the outputs
    ``schedule`` returned) are left out of the pre-step length.

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
        # Under async scheduling the steps scheduled after this one are already counted in
        # `num_computed_tokens`: their tokens, per request, for the pre-step length.
        self._kvsched_scheduled_since = self._kvsched_reported(scheduler_output)
        # Owners' progress now counts the step's scheduled tokens (vLLM adds them at schedule
        # time), and an owner this output finishes is still live: the waits it satisfied are
        # dropped before it ends, not handed off as if it ended first.
        self._kvsched_release()
        return super().update_from_output(scheduler_output, *args, **kwargs)  # type: ignore[misc]

    def _handle_invalid_blocks(
        self, invalid_block_ids: set[int], num_scheduled_tokens: Mapping[str, int] | None = None
    ) -> set[str]:
        groups = self._kvsched_groups()
        legacy = None
        if num_scheduled_tokens is None:
            # An older vLLM: the scheduled tokens come from the output `update_from_output`
            # was given, and an async loader's computed length is not set yet.
            num_scheduled_tokens = getattr(self, "_kvsched_num_scheduled_tokens", None) or {}
            legacy = groups
        since = getattr(self, "_kvsched_scheduled_since", None)
        if _native._PLANT_ASYNC_PRE_STEP_COUNTS_NEXT_STEP:
            # Planted bug `async-pre-step-counts-next-step` (scripts/plants.sh).
            since = None
        plan = plan_recovery(
            requests_from_scheduler(self, num_scheduled_tokens, legacy, since),
            groups,
            invalid_block_ids,
            null_block_id=_null_block_id(self),
            policy=self._kvsched_policy(),
            mode=self.kvsched_mode,
        )
        self._kvsched_apply(plan)
        self._kvsched_holds().add(plan)
        return plan.request_ids_to_skip()

    def _kvsched_reported(self, scheduler_output: Any) -> dict[str, int]:
        """The output of step N is reported: drops it (and any older) from the outputs this
        scheduler's ``schedule`` returned and no ``update_from_output`` has seen yet, and
        returns, per request, the tokens of those left — the steps scheduled after N
        (``AsyncScheduler``; none under the synchronous ``Scheduler``)."""
        pending = self.__dict__.setdefault("_kvsched_pending_outputs", [])
        at = next((i for i, o in enumerate(pending) if o is scheduler_output), None)
        if at is None:
            return {}
        del pending[: at + 1]
        since: dict[str, int] = {}
        for out in pending:
            for rid, n in (getattr(out, "num_scheduled_tokens", None) or {}).items():
                since[rid] = since.get(rid, 0) + n
        return since

    def _kvsched_scheduled(self, scheduler_output: Any) -> None:
        """Records an output ``schedule`` returned until ``update_from_output`` is given it
        (at most 8 kept: vLLM's async scheduling runs one step ahead, pipeline parallelism a
        few)."""
        pending = self.__dict__.setdefault("_kvsched_pending_outputs", [])
        pending.append(scheduler_output)
        del pending[:-8]

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
        if req is None or _ended(req):
            return None
        return req.num_computed_tokens

    def _kvsched_last(self, rid: str) -> int | None:
        """An ended request's progress when it ended, while the scheduler still has it (a
        preempted one restarts from 0: not known to have rewritten anything)."""
        req = self.requests.get(rid)
        if req is None or _status_name(req) == "PREEMPTED":
            return None
        return req.num_computed_tokens

    def _kvsched_holding(self, rid: str, block: int) -> bool:
        """Whether owner ``rid``'s block tables still hold ``block``: vLLM frees an owner's
        blocks and gives it new ones (a failed async load at 0 computed tokens, freed when it
        lands; a preemption), and the owner then recomputes into those, never rewriting the
        shared block."""
        if _native._PLANT_OWNER_FREED_STILL_WAITED_FOR:
            # Planted bug `owner-freed-still-waited-for` (scripts/plants.sh).
            return True
        tables = self.kv_cache_manager.get_block_ids(rid)
        return any(block in t for t in tables)

    def _kvsched_release(self) -> None:
        """Refreshes the holds; hands orphaned blocks to their next waiters."""
        holds = self._kvsched_holds()
        orphaned = holds.refresh(self._kvsched_computed, self._kvsched_last, self._kvsched_holding)
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
                out = super().schedule(*args, **kwargs)  # type: ignore[misc]
            finally:
                _put_back(out_of_waiting)
            self._kvsched_scheduled(out)
            return out
        before = list(self.running)
        self.running = [r for r in before if not holds.held(r.request_id)]
        # The held requests count against vLLM's limit on running requests (`max_num_seqs`):
        # its `schedule` admits while `len(self.running)` is below the limit and asserts it,
        # and they go back into `running` after it.
        limit = getattr(self, "max_num_running_reqs", None)
        lowered = isinstance(limit, int) and not isinstance(limit, bool)
        if lowered:
            self.max_num_running_reqs = max(limit - len(held), 0)
        try:
            out = super().schedule(*args, **kwargs)  # type: ignore[misc]
            self._kvsched_scheduled(out)
            return out
        finally:
            if lowered:
                self.max_num_running_reqs = limit
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
