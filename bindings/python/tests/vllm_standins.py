"""Duck-typed stand-ins of vLLM's scheduler objects (no vLLM import), built from a replay
scenario: cache specs named as vLLM's classes, requests with a status, the waiting queue and
`running`, a KV cache manager answering `get_block_ids` and recording `evict_blocks`, and a
base `schedule` that records which requests it was offered."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvsched.vllm import KvschedRecoveryMixin


@dataclass
class FullAttentionSpec:
    block_size: int


@dataclass
class SlidingWindowSpec:
    block_size: int
    sliding_window: int


@dataclass
class MambaSpec:
    block_size: int
    mamba_cache_mode: str


@dataclass(frozen=True)
class Status:
    name: str


WAITING_FOR_REMOTE_KVS = Status("WAITING_FOR_REMOTE_KVS")
RUNNING = Status("RUNNING")
FINISHED = Status("FINISHED_STOPPED")


@dataclass(eq=False)
class Request:
    request_id: str
    status: Status
    num_computed_tokens: int


@dataclass
class KVCacheManager:
    tables: dict[str, tuple[list[int], ...]]
    null_block_id: int = 0
    evicted: set[int] = field(default_factory=set)

    @property
    def block_pool(self) -> Any:
        return SimpleNamespace(null_block=SimpleNamespace(block_id=self.null_block_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.tables[request_id]

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.evicted |= block_ids


class BaseScheduler:
    """What the mixin sits on: vLLM's Scheduler's state, and a `schedule` that records."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        spec = {
            "full_attention": lambda g: FullAttentionSpec(g["block_size"]),
            "sliding_window": lambda g: SlidingWindowSpec(g["block_size"], g["window"]),
            "mamba": lambda g: MambaSpec(g["block_size"], g["mamba_mode"]),
        }
        self.kv_cache_config = SimpleNamespace(
            kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec[g["kind"]](g)) for g in scenario["groups"]]
        )
        self.recompute_kv_load_failures = scenario.get("policy", "recompute") == "recompute"
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        tables = {}
        for r in scenario["requests"]:
            is_async = r["class"] == "async"
            req = Request(r["id"], WAITING_FOR_REMOTE_KVS if is_async else RUNNING, r["num_computed_tokens"])
            self.requests[r["id"]] = req
            (self.waiting if is_async else self.running).append(req)
            tables[r["id"]] = tuple(list(t) for t in r["block_tables"])
        self.kv_cache_manager = KVCacheManager(tables, scenario.get("null_block_id", 0))
        self.failed_recving_kv_req_ids: set[str] = set()
        self.num_scheduled = {
            r["id"]: r.get("num_scheduled_tokens", 0) for r in scenario["requests"] if r["class"] == "sync"
        }
        self.offered: list[list[str]] = []

    def update_from_output(self, scheduler_output: Any, invalid_block_ids: set[int]) -> set[str]:
        """An older vLLM's call: `_handle_invalid_blocks` without the scheduled tokens."""
        return self._handle_invalid_blocks(invalid_block_ids)

    def schedule(self) -> list[str]:
        ids = [r.request_id for r in self.running]
        self.offered.append(ids)
        return ids


class Scheduler(KvschedRecoveryMixin, BaseScheduler):
    def __init__(self, scenario: dict[str, Any]) -> None:
        super().__init__(scenario)
        self.kvsched_mode = scenario.get("mode", "safe")
