"""A stand-in of vLLM's caller of a secondary tier (its TieringOffloadingManager), without
vLLM: a primary host KV buffer of `num_blocks` slots, job ids, and the calls vLLM makes —
`lookup` before promising a block, `submit_store` / `submit_load` with a `JobMetadata`, and
`get_finished` polled until the job reports."""

from __future__ import annotations

import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobMetadata:
    """vLLM's JobMetadata: job id, keys, primary-tier slots, promotion or not, request."""

    job_id: int
    keys: list[bytes]
    block_ids: Any
    is_promotion: bool = False
    req_context: Any = None


@dataclass
class Caller:
    tier: Any
    buffer: memoryview
    next_job: int = 1
    results: dict[int, bool] = field(default_factory=dict)

    def _submit(self, op: str, keys: list[bytes], slots: list[int]) -> int:
        job = self.next_job
        self.next_job += 1
        meta = JobMetadata(job, keys, array("q", slots), is_promotion=(op == "load"))
        t0 = time.perf_counter()
        getattr(self.tier, f"submit_{op}")(meta)
        # Non-blocking: the call enqueues only (generous bound for a loaded 2-core machine).
        assert time.perf_counter() - t0 < 0.5
        return job

    def wait(self, job: int, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while job not in self.results:
            for r in self.tier.get_finished():
                self.results[r.job_id] = r.success
            if job in self.results:
                break
            assert time.monotonic() < deadline, f"job {job} never finished"
            time.sleep(0.002)
        return self.results.pop(job)

    def store(self, keys: list[bytes], slots: list[int]) -> bool:
        return self.wait(self._submit("store", keys, slots))

    def load(self, keys: list[bytes], slots: list[int]) -> bool:
        return self.wait(self._submit("load", keys, slots))

    def lookup(self, key: bytes, timeout: float = 20.0) -> bool:
        """vLLM's lookup loop: `None` means retry later."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.tier.lookup(key, None)
            if r is not None:
                return r
            assert time.monotonic() < deadline, "lookup never settled"
            time.sleep(0.002)

    def _span(self, i: int) -> tuple[memoryview, slice]:
        flat = self.buffer.cast("B")
        bs = flat.nbytes // self.buffer.shape[0]
        return flat, slice(i * bs, (i + 1) * bs)

    def slot(self, i: int) -> bytes:
        flat, span = self._span(i)
        return bytes(flat[span])

    def fill(self, i: int, data: bytes) -> None:
        flat, span = self._span(i)
        flat[span] = data


def kv_buffer(num_blocks: int, block_bytes: int) -> tuple[bytearray, memoryview]:
    """A host KV buffer shaped like vLLM's view, (num_blocks, block_bytes) of bytes."""
    raw = bytearray(num_blocks * block_bytes)
    return raw, memoryview(raw).cast("B", [num_blocks, block_bytes])


def key(i: int) -> bytes:
    """An OffloadKey's shape: a 32-byte block hash and a 4-byte group index."""
    return i.to_bytes(32, "little") + (0).to_bytes(4, "little")


def random_block(n: int) -> bytes:
    return os.urandom(n)
