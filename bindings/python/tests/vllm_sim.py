"""A small simulation of vLLM's scheduler for `kvsched.vllm`'s mixin (no vLLM import): what
its decisions meet over several steps in vLLM.

* `RequestStatus` is vLLM's enum (`vllm/v1/request.py`), `FINISHED_REPETITION` included, with
  its rule `is_finished` (every status past `PREEMPTED`).
* `Manager` allocates and frees blocks from one pool (the null block 0), as vLLM's
  `KVCacheManager`, and records what each block holds (`"ok"`, `"garbage"`) and every read of
  garbage.
* `Sim.schedule` promotes landed loads as vLLM's `_update_waiting_for_remote_kv` does (a
  failed load at 0 computed tokens is freed: the request gets new blocks), admits waiting
  requests up to `max_num_running_reqs` and asserts that bound as vLLM does, then runs each
  running request `chunk` tokens, adding them to `num_computed_tokens` at schedule time (as
  vLLM does); it reads every block below a request's start.
* `update_from_output(output, invalid)` calls `_handle_invalid_blocks(invalid, scheduled)`.

Under async scheduling a test calls `schedule` for step N+1 before `update_from_output(N)`,
as vLLM's `AsyncScheduler` does.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvsched.vllm import KvschedRecoveryMixin


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


@dataclass(eq=False)
class Request:
    request_id: str
    num_tokens: int
    status: RequestStatus = RequestStatus.RUNNING
    num_computed_tokens: int = 0


@dataclass
class FullAttentionSpec:
    block_size: int


@dataclass
class ChunkedLocalAttentionSpec:
    block_size: int
    attention_chunk_size: int


@dataclass
class Output:
    num_scheduled_tokens: dict[str, int]


class Manager:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}
        self.content: dict[int, str] = {}
        self.evicted: set[int] = set()
        self.block_pool = SimpleNamespace(null_block=SimpleNamespace(block_id=0))
        self._next = itertools.count(1)

    def allocate(self, rid: str, n: int, shared: list[int] = ()) -> list[int]:
        self.tables[rid] = list(shared) + [next(self._next) for _ in range(n - len(shared))]
        return self.tables[rid]

    def get_block_ids(self, rid: str) -> tuple[list[int], ...]:
        return (list(self.tables.get(rid, [])),)

    def free(self, request: Request) -> None:
        self.tables.pop(request.request_id, None)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.evicted |= block_ids


class SimBase:
    max_num_running_reqs = 16

    def __init__(self, block_size: int = 16, chunk: int = 16) -> None:
        self.kv_cache_config = SimpleNamespace(
            kv_cache_groups=[SimpleNamespace(kv_cache_spec=FullAttentionSpec(block_size))]
        )
        self.kv_cache_manager = Manager(block_size)
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.failed_recving_kv_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.chunk = chunk
        self.garbage_reads: list[tuple[str, int]] = []

    def add(self, r: Request, blocks: int, shared: list[int] = ()) -> list[int]:
        self.requests[r.request_id] = r
        (self.waiting if r.status != RequestStatus.RUNNING else self.running).append(r)
        table = self.kv_cache_manager.allocate(r.request_id, blocks, shared)
        for b in table:
            self.kv_cache_manager.content.setdefault(b, "ok")
        return table

    def _update_waiting_for_remote_kv(self, r: Request) -> None:
        if r.request_id in self.failed_recving_kv_req_ids:
            if not r.num_computed_tokens:
                self.kv_cache_manager.free(r)
            self.failed_recving_kv_req_ids.discard(r.request_id)
        self.finished_recving_kv_req_ids.discard(r.request_id)

    def schedule(self) -> Output:
        m = self.kv_cache_manager
        for r in list(self.waiting):
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if r.request_id not in self.finished_recving_kv_req_ids:
                    continue
                self._update_waiting_for_remote_kv(r)
                r.status = RequestStatus.WAITING
            if len(self.running) == self.max_num_running_reqs:
                break
            self.waiting.remove(r)
            if r.request_id not in m.tables:
                m.allocate(r.request_id, -(-r.num_tokens // m.block_size))
            r.status = RequestStatus.RUNNING
            self.running.append(r)
        assert len(self.running) <= self.max_num_running_reqs, (
            f"len(self.running)={len(self.running)} > {self.max_num_running_reqs}"
        )
        out = {}
        for r in self.running:
            n = min(self.chunk, r.num_tokens - r.num_computed_tokens)
            if n <= 0:
                continue
            start, end = r.num_computed_tokens, r.num_computed_tokens + n
            (table,) = m.get_block_ids(r.request_id)
            for i in range(-(-end // m.block_size)):
                if i < start // m.block_size:
                    if m.content.get(table[i]) == "garbage":
                        self.garbage_reads.append((r.request_id, table[i]))
                else:
                    m.content[table[i]] = "ok"
            r.num_computed_tokens = end
            out[r.request_id] = n
        return Output(out)

    def update_from_output(self, output: Output, invalid: set[int] | None = None) -> set[str]:
        if invalid:
            return self._handle_invalid_blocks(invalid, output.num_scheduled_tokens)
        return set()


class Sim(KvschedRecoveryMixin, SimBase):
    kvsched_mode = "safe"
