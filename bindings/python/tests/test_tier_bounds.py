"""The tier's memory stays bounded: its index over ever new keys, whatever the store evicts or
nobody asks again, and a store or load job's transient memory, whatever the job's length."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvsched.tier import KvschedTierManager
from tier_caller import Caller, JobMetadata, key, kv_buffer

BS = 64
N = 64
MAC = bytes(range(32))
MIN_CAP = 1024  # the index's floor per key set


def test_the_present_set_stays_bounded_as_the_store_evicts():
    # Room for about 450 chunks of 64 + 80 bytes: the index keeps at most MIN_CAP keys.
    _, view = kv_buffer(N, BS)
    tier = KvschedTierManager(None, view, "kvsched", mac_key=MAC, capacity_bytes=64 << 10)
    c = Caller(tier, view)
    total = 0
    for j in range(80):
        tier.submit_store(JobMetadata(j, [key(total + i) for i in range(N)], list(range(N))))
        total += N
        if j % 16 == 15:
            assert tier.drain_jobs(60)
            assert tier.stats()["present_keys"] <= MIN_CAP
    assert tier.drain_jobs(60)
    assert all(r.success for r in tier.get_finished())
    st = tier.stats()
    assert st["stored_blocks"] == total and st["present_keys"] <= MIN_CAP, st
    # The newest keys are still answered present and load; the oldest, dropped from the
    # index (and long evicted), are answered absent, not promised.
    assert c.lookup(key(total - 1)) is True
    assert c.load([key(total - 1)], [0])
    assert c.lookup(key(0)) is False


def test_a_memory_tier_answers_what_its_store_holds():
    # Room for 10 chunks of 64 + 80 bytes (the store evicts the least recently read), while
    # the index keeps up to MIN_CAP keys in the order they were stored: only the store knows
    # which chunks are still there.
    _, view = kv_buffer(8, BS)
    tier = KvschedTierManager(None, view, "kvsched", mac_key=MAC, capacity_bytes=10 * 144)
    c = Caller(tier, view)
    for i in range(10):
        assert c.store([key(i)], [0])
    # A read makes key 0 the most recently used: the next stores evict keys 1 and 2.
    assert c.load([key(0)], [1])
    for i in (10, 11):
        assert c.store([key(i)], [0])
    held = [i for i in range(12) if c.lookup(key(i))]
    assert held == [0] + list(range(3, 12)), held
    # Every key answered present loads; an evicted key, stored again, is written again (not
    # skipped as already present) and loads.
    for i in held:
        assert c.load([key(i)], [1]), i
    assert c.store([key(1)], [0]) and c.lookup(key(1)) is True and c.load([key(1)], [1])
    # Many more keys than the store holds: never more answered present than it holds.
    for i in range(100, 140):
        assert c.store([key(i)], [0])
    assert sum(c.lookup(key(i)) for i in range(140)) == 10


def test_the_absent_set_stays_bounded_over_keys_asked_once(tmp_path):
    _, view = kv_buffer(8, BS)
    tier = KvschedTierManager(None, view, "kvsched", store="disk", path=str(tmp_path / "d"),
                              capacity_bytes=64 << 10)
    for i in range(3 * MIN_CAP):
        assert tier.lookup(key(i)) is None  # probed: asked of the shared store
        if i % 256 == 255:
            assert tier.drain_jobs(60)
    assert tier.drain_jobs(60)
    st = tier.stats()
    assert st["probes"] == 3 * MIN_CAP and st["absent_keys"] <= MIN_CAP, st
    # The newest answer is kept (once); a key whose answer was dropped is probed again.
    assert tier.lookup(key(3 * MIN_CAP - 1)) is False
    assert tier.lookup(key(0)) is None


_BIG_JOB = """
import resource, sys
from kvsched.tier import KvschedTierManager
BS, N, K = 1 << 20, 64, 384
raw = bytearray(N * BS)
view = memoryview(raw).cast("B", [N, BS])
for i in range(N):  # touch every page: the buffer is part of the baseline
    raw[i * BS:(i + 1) * BS] = bytes([i]) * BS
class Job:
    def __init__(self, job_id, keys, block_ids):
        self.job_id, self.keys, self.block_ids = job_id, keys, block_ids
t = KvschedTierManager(None, view, "kvsched", mac_key=bytes(range(32)),
                       capacity_bytes=64 << 20, threads=1)
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmHWM"))
before = hwm()
t.submit_store(Job(1, [i.to_bytes(8, "little") for i in range(K)], [i % N for i in range(K)]))
assert t.drain_jobs(300)
ok = [r.success for r in t.get_finished()]
print(ok, hwm() - before)
"""


def test_a_long_store_jobs_memory_is_bounded():
    # 384 blocks of 1 MiB in one job, into a 64 MiB memory store: encoded all at once, the
    # job held 384 MiB beyond the buffer; in batches, the store's 64 MiB and a few MiB more.
    r = subprocess.run([sys.executable, "-c", _BIG_JOB], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    ok, growth = r.stdout.split("] ")
    assert ok == "[True", r.stdout
    assert int(growth) < 200, f"peak memory grew by {growth} MiB during the job"


_LONG_LOAD = """
import sys, tempfile
from kvsched.tier import KvschedTierManager
BS, K = 1 << 20, 192
raw = bytearray(4 * BS)
view = memoryview(raw).cast("B", [4, BS])
raw[:BS] = bytes(range(256)) * (BS // 256)
raw[BS:2 * BS] = bytes(range(255, -1, -1)) * (BS // 256)
class Job:
    def __init__(self, job_id, keys, block_ids):
        self.job_id, self.keys, self.block_ids = job_id, keys, block_ids
store = sys.argv[1]
kw = {"path": tempfile.mkdtemp()} if store == "disk" else {}
t = KvschedTierManager(None, view, "kvsched", store=store, mac_key=bytes(range(32)),
                       capacity_bytes=64 << 20, threads=1, **kw)
t.submit_store(Job(1, [b"A", b"B"], [0, 1]))
assert t.drain_jobs(300)
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmHWM"))
before = hwm()
t.submit_load(Job(2, [b"A", b"B"] * K, [2, 3] * K))
assert t.drain_jobs(300)
ok = [r.success for r in t.get_finished()]
print(ok, raw[2 * BS:] == raw[:2 * BS], hwm() - before)
"""


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_long_load_jobs_memory_is_bounded(store):
    # Two keys loaded 192 times each into two slots of 1 MiB: fetched in one call, the job
    # held 384 MiB of values beyond the buffer; in batches of at most 4 MiB (three chunks), a
    # few MiB, each slot still getting its own key's bytes across the batches.
    r = subprocess.run([sys.executable, "-c", _LONG_LOAD, store], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ok, landed, growth = r.stdout.strip().rsplit(" ", 2)
    assert ok == "[True, True]" and landed == "True", r.stdout
    assert int(growth) < 200, f"peak memory grew by {growth} MiB during the load"
