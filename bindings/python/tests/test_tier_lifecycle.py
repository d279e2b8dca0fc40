"""The tier's life cycle: `shutdown` while other threads call it, use after `os.fork()`, and
dropping a tier whose store is stuck on a server that never answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

from kvsched.tier import KvschedTierManager
from tier_caller import Caller, JobMetadata, key, kv_buffer

BS = 64 << 10
N = 256
MAC = bytes(range(32))


def _busy_tier(threads: int = 4) -> tuple[KvschedTierManager, Caller]:
    """A tier with 128 blocks stored and a few hundred loads of them queued, so that a
    shutdown has running jobs to wait for."""
    _, view = kv_buffer(N, BS)
    tier = KvschedTierManager(None, view, "kvsched", mac_key=MAC, threads=threads)
    c = Caller(tier, view)
    keys = [key(i) for i in range(128)]
    assert c.store(keys, list(range(128)))
    for j in range(400):
        tier.submit_load(JobMetadata(10_000 + j, keys, list(range(128, 256))))
    return tier, c


def test_shutdown_while_other_threads_call_the_tier():
    tier, _ = _busy_tier()
    errors: dict[str, str] = {}
    go, done = threading.Event(), threading.Event()
    calls = {
        "lookup": lambda: tier.lookup(key(1)),
        "get_finished": tier.get_finished,
        "submit_load": lambda: tier.submit_load(JobMetadata(1 << 40, [key(1)], [200])),
        "submit_store": lambda: tier.submit_store(JobMetadata(1 << 41, [key(7)], [201])),
        "stats": tier.stats,
        "drain_jobs": lambda: tier.drain_jobs(0.01),
    }

    def call(name, f):
        go.wait()
        while not done.is_set():
            try:
                f()
            except Exception as e:  # noqa: BLE001 - any exception is the failure
                errors.setdefault(name, repr(e))
                return

    threads = [threading.Thread(target=call, args=kv) for kv in calls.items()]
    for t in threads:
        t.start()
    go.set()
    time.sleep(0.02)
    tier.shutdown()
    time.sleep(0.05)  # the callers keep calling the stopped tier
    done.set()
    for t in threads:
        t.join(timeout=60)
    assert errors == {}
    # Stopped for good: a job submitted now fails at once.
    tier.get_finished()
    tier.submit_load(JobMetadata(5, [key(1)], [0]))
    assert [(r.job_id, r.success) for r in tier.get_finished()] == [(5, False)]


def test_shutdown_while_a_thread_waits_in_drain_jobs_stops_the_tier():
    tier, _ = _busy_tier(threads=1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(tier.drain_jobs(60.0)))
    waiter.start()
    time.sleep(0.05)
    tier.shutdown()  # raised "Already borrowed" and left the tier running
    waiter.join(timeout=60)
    assert got == [True]
    tier.get_finished()
    tier.submit_store(JobMetadata(999, [key(5000)], [0]))
    assert [(r.job_id, r.success) for r in tier.get_finished()] == [(999, False)]


def test_shutdown_reports_every_job_once_queued_ones_failed():
    """Jobs still queued at a shutdown never run: each is reported failed, as a job submitted
    after it is, so a caller waiting on its job ids sees every one resolve."""
    tier, _ = _busy_tier(threads=1)
    tier.shutdown()
    results = [(r.job_id, r.success) for r in tier.get_finished()]
    ids = [j for j, _ in results]
    assert sorted(ids) == list(range(10_000, 10_400)), (len(ids), len(set(ids)))
    assert any(not ok for _, ok in results), "nothing was queued at the shutdown: tests nothing"
    assert tier.get_finished() == []


_FORK = """
import os, sys, time
from kvsched.tier import KvschedTierManager, JobResult
raw = bytearray(8 * 256)
view = memoryview(raw).cast("B", [8, 256])
class Job:
    def __init__(self, job_id, keys, block_ids):
        self.job_id, self.keys, self.block_ids = job_id, keys, block_ids
t = KvschedTierManager(None, view, "kvsched", mac_key=bytes(range(32)))
t.submit_store(Job(1, [b"k1"], [0]))
assert t.drain_jobs(30)
assert [(r.job_id, r.success) for r in t.get_finished()] == [(1, True)]
assert t.lookup(b"k1") is True
pid = os.fork()
if pid == 0:
    out = {}
    out["lookup"] = t.lookup(b"k1")
    t.submit_load(Job(2, [b"k1"], [1]))
    t.submit_store(Job(3, [b"k2"], [2]))
    out["finished"] = [(r.job_id, r.success) for r in t.get_finished()]
    out["drain"] = t.drain_jobs(1.0)
    if MODE == "shutdown":
        t.shutdown()
        t.shutdown()
        t.submit_load(Job(4, [b"k1"], [1]))
        out["after"] = [(r.job_id, r.success) for r in t.get_finished()]
    print("child", out, flush=True)
    sys.exit(0)  # the tier still alive: dropped at the child's exit
_, status = os.waitpid(pid, 0)
print("parent", os.waitstatus_to_exitcode(status), flush=True)
t.submit_load(Job(5, [b"k1"], [1]))
assert t.drain_jobs(30)
print("parent-load", [(r.job_id, r.success) for r in t.get_finished()], flush=True)
"""


def _run_fork(mode: str) -> str:
    script = f"MODE = {mode!r}\n" + _FORK
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Panic" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    return r.stdout


def test_a_forked_child_fails_every_job_at_once_and_exits_cleanly():
    for mode in ("shutdown", "exit"):
        out = _run_fork(mode)
        child = next(line for line in out.splitlines() if line.startswith("child "))
        assert "'lookup': False" in child, out
        assert "'finished': [(2, False), (3, False)]" in child, out
        assert "'drain': True" in child, out
        if mode == "shutdown":
            assert "'after': [(4, False)]" in child, out
        assert "parent 0" in out, out
        # The parent's tier is untouched by the child.
        assert "parent-load [(5, True)]" in out, out


def _silent_server() -> tuple[socket.socket, list[socket.socket]]:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, held


def test_dropping_a_tier_with_a_stuck_store_lets_other_threads_run():
    from kvsched import _native

    if not getattr(_native, "HAS_REDIS", True):
        import pytest

        pytest.skip("a build without the Redis tier")
    srv, held = _silent_server()
    try:
        _, view = kv_buffer(8, 256)
        url = f"redis://127.0.0.1:{srv.getsockname()[1]}?timeout_ms=3000"
        tier = KvschedTierManager(None, view, "kvsched", store="redis", url=url)
        tier.submit_store(JobMetadata(1, [key(1)], [0]))
        time.sleep(0.3)  # the store is now waiting for an answer that never comes
        ticks = [0]
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.001)

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.1)
        t0, k0 = time.monotonic(), ticks[0]
        del tier  # waits for the store's put, which only its call timeout ends
        elapsed, ran = time.monotonic() - t0, ticks[0] - k0
        stop.set()
        ticker.join()
        # The drop waited for the stuck put (that is what this test is about), bounded by the
        # store's call timeout (a generous bound for a loaded machine), and with the GIL
        # released meanwhile: the ticker ran (holding the GIL, it did not tick once).
        assert 1.0 < elapsed < 60, elapsed
        assert ran >= 10, (elapsed, ran)
    finally:
        srv.close()
        for s in held:
            s.close()


def test_a_signal_interrupts_drain_jobs_while_a_store_hangs():
    """Ctrl-C during ``drain_jobs`` on a store that never answers raises at once (within the
    wait's signal checks), not when the store's call timeout ends the job."""
    import os
    import signal

    import pytest

    from kvsched import _native

    if not getattr(_native, "HAS_REDIS", True):
        pytest.skip("a build without the Redis tier")
    srv, held = _silent_server()
    tier = None
    # Python's own SIGINT handler, whatever the disposition this process inherited (a shell
    # starts background jobs with SIGINT ignored, and Python then installs none).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _, view = kv_buffer(8, 256)
        url = f"redis://127.0.0.1:{srv.getsockname()[1]}?timeout_ms=20000"
        tier = KvschedTierManager(None, view, "kvsched", store="redis", url=url)
        tier.submit_store(JobMetadata(1, [key(1)], [0]))
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            tier.drain_jobs(float("inf"))
        elapsed = time.monotonic() - t0
        # Raised soon after the signal at 0.3 s; the store's timeout is 20 s.
        assert elapsed < 5, elapsed
        # The job went on: it is still running, and the tier answers as before.
        assert tier.drain_jobs(0) is False
    finally:
        signal.signal(signal.SIGINT, previous)
        if tier is not None:
            tier.shutdown()
        srv.close()
        for s in held:
            s.close()


_FORK_NEW_TIER = """
import os, sys, time
from kvsched.tier import KvschedTierManager
class Job:
    def __init__(self, job_id, keys, block_ids):
        self.job_id, self.keys, self.block_ids = job_id, keys, block_ids
def tier(threads):
    view = memoryview(bytearray(8 * 4096)).cast("B", [8, 4096])
    return KvschedTierManager(None, view, "kvsched", threads=threads)
parent = tier(32)  # idle: its workers wait for jobs
time.sleep(0.2)
pids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        t = tier(32)  # the child's own tier, as the docs say
        for i in range(20):
            t.submit_store(Job(i, [b"k%d" % i], [i % 8]))
            t.lookup(b"k%d" % i)
        ok = t.drain_jobs(10) and all(r.success for r in t.get_finished())
        t.shutdown()
        os._exit(0 if ok else 3)
    pids.append(pid)
deadline = time.time() + 20
codes = {}
while len(codes) < len(pids) and time.time() < deadline:
    for pid in pids:
        if pid not in codes:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
    time.sleep(0.01)
for pid in pids:
    if pid not in codes:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        codes[pid] = "hung"
print("children", sorted(codes.values(), key=str), flush=True)
parent.shutdown()
"""


def test_a_tier_made_in_a_forked_child_runs_while_the_parents_tier_idles():
    # The parent's idle workers wait at the fork. Waiting on a lock that lists its waiters in
    # a process-wide table (parking_lot's) left the parent's threads listed in the child, on
    # stacks it reuses: the child's own tier then crashed (SIGSEGV) or hung at its first wait.
    r = subprocess.run(
        [sys.executable, "-c", _FORK_NEW_TIER], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "children [0, 0, 0, 0, 0, 0]" in r.stdout, r.stdout + r.stderr
