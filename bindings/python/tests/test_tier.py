"""`kvsched.tier.KvschedTierManager` through a stand-in of vLLM's caller: round trips on the
memory, disk, Redis and Redis Cluster tiers, damage at rest, forgery by a writer without the MAC key,
eviction, a failed load after a positive lookup (vLLM #49328), a store shared by two engines,
and bad arguments."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from array import array

import pytest

import kvsched
from kvsched.tier import KvschedTierManager, offload_key_bytes
from tier_caller import Caller, key, kv_buffer, random_block

BS = 256  # bytes per block
N = 8  # blocks in the primary buffer
MAC = bytes(range(32))
HEADER = 48  # chunk header; then the 32-byte MAC when keyed, then the payload


def make(store="memory", mac_key=MAC, n=N, bs=BS, **kw):
    raw, view = kv_buffer(n, bs)
    tier = KvschedTierManager(None, view, "kvsched", store=store, mac_key=mac_key, **kw)
    return tier, Caller(tier, view)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("redis")
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (CI installs it)")
        pytest.skip("redis-server not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _wait_port(port, [proc])
    yield f"redis://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def _free_port_pair() -> int:
    """A port p with p and its cluster bus port p + 10000 both free."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p > 55000:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 10000))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair")


@pytest.fixture(scope="module")
def redis_cluster_url(tmp_path_factory):
    """Three cluster nodes made into one Redis Cluster (redis-cli --cluster create)."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if exe is None or cli is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server / redis-cli not installed (CI installs them)")
        pytest.skip("redis-server / redis-cli not installed")
    ports, procs = [], []
    try:
        for i in range(3):
            port = _free_port_pair()
            d = tmp_path / f"node{i}"
            d.mkdir()
            procs.append(subprocess.Popen(
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                 "--dir", str(d)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
            ports.append(port)
        for port in ports:
            _wait_port(port, procs)
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        deadline = time.monotonic() + 30
        # Every node agrees: state ok and all 16384 slots assigned, as each node sees it.
        while not all(
            b"cluster_state:ok" in out and b"cluster_slots_ok:16384" in out
            for out in (
                subprocess.run([cli, "-p", str(p), "cluster", "info"], capture_output=True,
                               timeout=10).stdout
                for p in ports
            )
        ):
            assert time.monotonic() < deadline, "the cluster never reached cluster_state:ok"
            time.sleep(0.1)
        yield "redis://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def _wait_port(port, procs):
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, (
                "redis-server did not start"
            )
            time.sleep(0.05)


@pytest.fixture(params=["memory", "disk", "redis", "redis-cluster"])
def tier_args(request, tmp_path):
    return _args(request, tmp_path)


@pytest.fixture(params=["disk", "redis", "redis-cluster"])
def shared_tier_args(request, tmp_path):
    """The stores several engines can share (a memory tier is private to its process)."""
    return _args(request, tmp_path)


def _args(request, tmp_path):
    # The servers serve the whole module: each test's keys live under a tag of its own.
    tag = int.from_bytes(os.urandom(8), "little")
    if request.param == "redis":
        return {"store": "redis", "url": request.getfixturevalue("redis_url"), "tag": tag}
    if request.param == "redis-cluster":
        return {"store": "redis", "url": request.getfixturevalue("redis_cluster_url"), "tag": tag}
    if request.param == "disk":
        return {"store": "disk", "path": str(tmp_path / "chunks")}
    return {"store": "memory"}


def test_round_trip(tier_args):
    tier, c = make(**tier_args)
    blocks = [random_block(BS) for _ in range(4)]
    for i, b in enumerate(blocks):
        c.fill(i, b)
    keys = [key(i) for i in range(4)]
    assert c.store(keys, [0, 1, 2, 3])
    assert all(c.lookup(k) for k in keys)
    assert c.lookup(key(99)) is False
    # Loaded into other slots, in another order: each slot gets its own key's bytes.
    assert c.load([keys[2], keys[0]], [7, 5])
    assert c.slot(7) == blocks[2] and c.slot(5) == blocks[0]
    st = tier.stats()
    assert st["stored_blocks"] == 4 and st["loaded_blocks"] == 2 and st["failed_loads"] == 0
    # A store of keys already held writes nothing and succeeds.
    assert c.store(keys[:2], [4, 6])
    assert tier.stats()["stored_blocks"] == 4
    tier.shutdown()
    tier.shutdown()


def test_non_byte_views_are_blocks_of_their_first_dimension():
    floats = array("f", [float(i) for i in range(N * 16)])
    view = memoryview(floats).cast("B").cast("f", [N, 16])
    tier = KvschedTierManager(None, view, "kvsched")
    assert tier.block_bytes == 64
    c = Caller(tier, view)
    assert c.store([key(1)], [3])
    view_b = memoryview(floats).cast("B")
    view_b[3 * 64 : 4 * 64] = bytes(64)
    assert c.load([key(1)], [3])
    assert list(floats[48:64]) == [float(i) for i in range(48, 64)]


@pytest.mark.parametrize("where", [2, HEADER - 1, HEADER + 5, HEADER + 32 + 100])
def test_damage_at_rest_fails_the_load_and_the_tier_stops_promising_the_block(tier_args, where):
    tier, c = make(**tier_args)
    good = random_block(BS)
    c.fill(0, good)
    assert c.store([key(1), key(2)], [0, 0])
    assert tier._native.damage(offload_key_bytes(key(1)), where)
    sentinel = b"\x5a" * BS
    c.fill(4, sentinel)
    c.fill(5, sentinel)
    assert c.lookup(key(1)) is True  # the tier cannot know yet
    assert not c.load([key(1), key(2)], [4, 5])
    # Never wrong KV: the damaged block's slot is untouched (the good one may be written).
    assert c.slot(4) == sentinel
    assert tier.stats()["bad_chunks"] == 1
    # vLLM #49328: no more "present" for the chunk it failed to load, however often asked.
    for _ in range(3):
        assert c.lookup(key(1)) is False
    assert c.lookup(key(2)) is True
    # Storing it again heals it.
    assert c.store([key(1)], [0])
    assert c.lookup(key(1)) is True
    assert c.load([key(1)], [4]) and c.slot(4) == good


def test_forgery_without_the_mac_key_is_refused(shared_tier_args):
    shared = shared_tier_args
    honest, hc = make(**shared)
    real = random_block(BS)
    hc.fill(0, real)
    assert hc.store([key(1)], [0])
    # A writer without the key (it can compute the checksum, not the MAC) overwrites the chunk.
    forger, fc = make(mac_key=None, probe=False, **shared)
    fake = b"\x66" * BS
    fc.fill(0, fake)
    assert fc.store([key(1)], [0])
    # A writer with another key writes one too.
    other, oc = make(mac_key=bytes(32), probe=False, **shared)
    oc.fill(0, fake)
    assert oc.store([key(2)], [0])
    # An honest engine that reads the store now (a disk store's pack written later holds
    # the newest value of a key: an engine opening the directory reads the forged ones)
    # refuses both.
    reader, rc = make(**shared)
    rc.fill(3, bytes(BS))
    assert not rc.load([key(1)], [3])
    assert rc.slot(3) == bytes(BS)
    assert rc.lookup(key(1)) is False
    assert not rc.load([key(2)], [3])
    assert rc.slot(3) == bytes(BS)
    # Without a MAC key the forged chunk passes the checksum: the MAC is what stops it.
    trusting, tc = make(mac_key=None, **shared)
    assert tc.lookup(key(1)) is True
    assert tc.load([key(1)], [2]) and tc.slot(2) == fake


def test_eviction_by_capacity_answers_absent_and_fails_a_load():
    # Room for three chunks of 256 + 80 bytes.
    tier, c = make(capacity_bytes=3 * (BS + HEADER + 32) + 10)
    for i in range(5):
        c.fill(i, random_block(BS))
        assert c.store([key(i)], [i])
    # The oldest were evicted behind the index's back: the memory store, asked at once,
    # says so...
    assert c.lookup(key(0)) is False
    # ...and a load of it anyway fails, counted missing, and is not promised after.
    assert not c.load([key(0)], [7])
    st = tier.stats()
    assert st["missing_chunks"] == 1 and st["failed_loads"] == 1
    assert c.lookup(key(0)) is False
    assert c.load([key(4)], [7]) and c.slot(7) == c.slot(4)


def test_a_chunk_removed_behind_the_tiers_back(tier_args):
    tier, c = make(**tier_args)
    assert c.store([key(1), key(2)], [0, 1])
    assert tier._native.remove(offload_key_bytes(key(2)))
    assert not c.load([key(1), key(2)], [3, 4])
    assert c.lookup(key(2)) is False
    assert c.lookup(key(1)) is True


def _never_promised_again(c, k, rounds=4, pause=0.25):
    """After a failed load of `k`: however often asked, `k` is not promised again. Each lookup
    comes `pause` seconds after the last, past a Redis node's backoff after the failed call
    (50 ms), so a probe would reach the store and find the key it still holds."""
    for _ in range(rounds):
        time.sleep(pause)
        assert c.lookup(k) is False


def _redis(url, *args):
    host, port = url.removeprefix("redis://").split(":")
    return subprocess.run(["redis-cli", "-h", host, "-p", port, *args], check=True,
                          capture_output=True, text=True, timeout=10).stdout


@pytest.mark.parametrize("damage", ["append", "wrong-type"])
def test_a_value_the_store_holds_but_cannot_hand_back_is_not_promised_again(redis_url, damage):
    # vLLM #49328: GET of a value past the chunk bound (APPEND: read past, failing its
    # checks) or of a list (WRONGTYPE: not held), while EXISTS still says the key is held.
    tag = int.from_bytes(os.urandom(8), "little")
    tier, c = make(store="redis", url=redis_url, tag=tag)
    other, oc = make(store="redis", url=redis_url, tag=tag)  # an engine that never stored it
    block = random_block(BS)
    c.fill(0, block)
    before = set(_redis(redis_url, "--scan").split())
    assert c.store([key(1)], [0])
    (name,) = set(_redis(redis_url, "--scan").split()) - before
    if damage == "append":
        _redis(redis_url, "APPEND", name, "x")
    else:
        _redis(redis_url, "DEL", name)
        _redis(redis_url, "RPUSH", name, "x")
    # Neither can know yet: one stored it, the other's probe finds it.
    assert c.lookup(key(1)) is True and oc.lookup(key(1)) is True
    c.fill(3, random_block(BS))
    assert c.store([key(3)], [3])
    for t, tc in ((tier, c), (other, oc)):
        assert not tc.load([key(1)], [1])
        # The connection and the node stay up: a healthy key loads at once.
        assert tc.load([key(3)], [4]) and tc.slot(4) == c.slot(3)
        _never_promised_again(tc, key(1))
        st = t.stats()
        # Counted as the store answered: a value past the bound, read past, fails its
        # checks; a GET of a non-string value, which the Redis tier answers as "not
        # held", is missing.
        counter = "bad_chunks" if damage == "append" else "missing_chunks"
        assert st[counter] == 1 and st["missing_chunks"] + st["bad_chunks"] == 1, st
        assert st["failed_keys"] == 1 and st["failed_loads"] == 1, st
        assert st["unreadable_chunks"] == 0, st
    # The engine recomputes the block and stores it again: the bad value is overwritten.
    assert c.store([key(1)], [0])
    assert c.lookup(key(1)) is True
    assert c.load([key(1)], [2]) and c.slot(2) == block


@pytest.mark.parametrize("replace", ["directory", "fifo", "symlink", "sparse"])
def test_a_pack_the_disk_tier_refuses_to_read_is_not_promised_again(tmp_path, replace):
    # The disk tier's read refuses a pack that is no regular file of a pack's size (and
    # answers "not held"), while its index, and so a probe, still says the key is held.
    path = tmp_path / "chunks"
    tier, c = make(store="disk", path=str(path))
    block = random_block(BS)
    c.fill(0, block)
    assert c.store([key(1)], [0])
    other, oc = make(store="disk", path=str(path))  # indexes the pack when it opens
    (pack,) = path.glob("*.pack")
    if replace == "sparse":
        os.truncate(pack, 1 << 40)
    else:
        pack.unlink()
        {"directory": os.mkdir, "fifo": os.mkfifo,
         "symlink": lambda p: os.symlink("/dev/zero", p)}[replace](pack)
    assert c.lookup(key(1)) is True and oc.lookup(key(1)) is True
    for t, tc in ((tier, c), (other, oc)):
        assert not tc.load([key(1)], [1])
        _never_promised_again(tc, key(1), pause=0.01)
        st = t.stats()
        assert st["missing_chunks"] == 1 and st["failed_keys"] == 1, st
        assert st["failed_loads"] == 1, st
    assert c.store([key(1)], [0])
    assert c.lookup(key(1)) is True
    assert c.load([key(1)], [2]) and c.slot(2) == block


def test_a_reader_without_the_mac_key_is_promised_a_keyed_chunk_at_most_once(shared_tier_args):
    # A keyed chunk is longer than a reader without the key takes a chunk to be: Redis's GET
    # reads it past (over the value bound) and the load fails it, while EXISTS finds it held.
    # (A disk tier opened without the key does not index such a pack: it never promises the
    # chunk at all.)
    writer, wc = make(**shared_tier_args)
    wc.fill(0, random_block(BS))
    assert wc.store([key(1)], [0])
    reader, rc = make(mac_key=None, **shared_tier_args)
    if rc.lookup(key(1)):
        assert shared_tier_args["store"] == "redis"
        assert not rc.load([key(1)], [1])
    _never_promised_again(rc, key(1))
    assert reader.stats()["failed_keys"] == (shared_tier_args["store"] == "redis")


def test_engines_sharing_a_store_find_each_others_chunks(shared_tier_args):
    a, ac = make(**shared_tier_args)
    b, bc = make(**shared_tier_args)
    block = random_block(BS)
    ac.fill(0, block)
    assert ac.store([key(9)], [0])
    # B never stored it: the first lookup asks the store (None: retry), then answers.
    assert b.lookup(key(9), None) is None
    assert bc.lookup(key(9)) is True
    assert bc.load([key(9)], [6]) and bc.slot(6) == block
    assert bc.lookup(key(10)) is False
    assert b.stats()["probes"] >= 2


def test_different_tags_never_share_keys(tmp_path):
    shared = {"store": "disk", "path": str(tmp_path / "shared")}
    a, ac = make(tag=1, **shared)
    b, bc = make(tag=2, **shared)
    assert ac.store([key(1)], [0])
    assert bc.lookup(key(1)) is False


def test_jobs_after_shutdown_fail_at_once():
    tier, c = make()
    assert c.store([key(1)], [0])
    tier.shutdown()
    assert not c.load([key(1)], [1])
    assert not c.store([key(2)], [1])


def test_lookups_and_submits_do_not_wait_for_a_slow_store(redis_url):
    tier, c = make(store="redis", url=redis_url)
    keys = [key(i) for i in range(N)]
    jobs = [c._submit("store", [k], [i]) for i, k in enumerate(keys)]
    assert all(c.wait(j) for j in jobs)
    assert tier.drain_jobs(10.0)


BAD = [
    ({"mac_key": b"short"}, "mac_key"),
    ({"mac_key": "zz"}, "mac_key"),
    ({"threads": 0}, "threads"),
    ({"threads": -1}, "threads"),
    ({"threads": 10**30}, "threads"),
    ({"capacity_bytes": -1}, "capacity_bytes"),
    ({"capacity_bytes": 2**64}, "capacity_bytes"),
    ({"tag": -1}, "tag"),
    ({"tag": 2**64}, "tag"),
    ({"store": "tape"}, "store"),
    ({"store": "disk"}, "path"),
    ({"store": "redis"}, "url"),
    ({"store": "redis", "url": "http://x"}, "url"),
    ({"store": "memory", "path": "/tmp"}, "path"),
    ({"store": "memory", "url": "redis://127.0.0.1:1"}, "url"),
    ({"store": "disk", "path": "/tmp", "url": "redis://127.0.0.1:1"}, "url"),
]


@pytest.mark.parametrize("kw,field", BAD, ids=[f for _, f in BAD])
def test_bad_arguments_are_value_errors_naming_the_field(kw, field):
    _, view = kv_buffer(N, BS)
    with pytest.raises(ValueError) as e:
        KvschedTierManager(None, view, "kvsched", **kw)
    assert str(e.value).startswith(f"{field}:"), e.value


def test_bad_buffers_and_jobs():
    with pytest.raises(ValueError, match="^primary_kv_view:"):
        KvschedTierManager(None, memoryview(bytes(N * BS)).cast("B", [N, BS]), "kvsched")
    with pytest.raises(ValueError, match="^num_blocks:"):
        KvschedTierManager(None, memoryview(bytearray(100)), "kvsched", num_blocks=3)
    with pytest.raises(ValueError, match="^num_blocks:"):
        KvschedTierManager(None, memoryview(bytearray(100)), "kvsched")
    tier, c = make()
    from tier_caller import JobMetadata

    with pytest.raises(ValueError, match=r"^block_ids\[1\]: 8 is not below"):
        tier.submit_load(JobMetadata(1, [key(1), key(2)], [0, N]))
    with pytest.raises(ValueError, match="^block_ids: 1 block ids for 2 keys"):
        tier.submit_store(JobMetadata(1, [key(1), key(2)], [0]))
    with pytest.raises(TypeError):
        tier.lookup(1.5)
    # Ids are whole numbers in range, each named: not a float taken for its floor, not a
    # negative or oversized int surfacing as an unnamed OverflowError.
    with pytest.raises(TypeError, match=r"^block_ids\[0\]:"):
        tier.submit_store(JobMetadata(1, [key(1)], [1.7]))
    with pytest.raises(TypeError, match=r"^block_ids\[0\]:"):
        tier.submit_store(JobMetadata(1, [key(1)], ["1"]))
    with pytest.raises(ValueError, match=r"^block_ids\[1\]:"):
        tier.submit_load(JobMetadata(1, [key(1), key(2)], [0, -1]))
    with pytest.raises(ValueError, match="^job_id:"):
        tier.submit_load(JobMetadata(-1, [key(1)], [0]))
    with pytest.raises(ValueError, match="^job_id:"):
        tier.submit_store(JobMetadata(2**64, [key(1)], [0]))
    with pytest.raises(ValueError, match="^num_blocks:"):
        KvschedTierManager(None, memoryview(bytearray(100)), "kvsched", num_blocks=-1)


BAD_VIEWS = [
    # (view, num_blocks, exception, field)
    (memoryview(bytearray(2 * N * BS))[::2], N, ValueError, "primary_kv_view"),
    (memoryview(bytearray(0)), N, ValueError, "primary_kv_view"),
    (memoryview(bytearray(8)).cast("B", [8, 1])[:0], None, ValueError, "primary_kv_view"),
    ([0] * N, N, TypeError, "primary_kv_view"),
    (kv_buffer(N, BS)[1], 2 * N, ValueError, "num_blocks"),
    (kv_buffer(N, BS)[1], 1, ValueError, "num_blocks"),
]


@pytest.mark.parametrize("view,num_blocks,exc,field", BAD_VIEWS,
                         ids=["strided", "empty", "empty-2d", "list", "more-blocks", "one-block"])
def test_bad_views_name_the_argument(view, num_blocks, exc, field):
    with pytest.raises(exc, match=f"^{field}:"):
        KvschedTierManager(None, view, "kvsched", num_blocks=num_blocks)


def test_a_2d_view_that_is_not_c_contiguous_names_the_argument():
    np = pytest.importorskip("numpy")
    for a in (np.asfortranarray(np.zeros((N, BS), np.uint8)), np.zeros((N, 2 * BS), np.uint8)[:, ::2]):
        with pytest.raises(ValueError, match="^primary_kv_view: must be C-contiguous"):
            KvschedTierManager(None, memoryview(a), "kvsched")


@pytest.mark.parametrize("kw,exc,field", [
    ({"store": "disk", "path": 5}, TypeError, "path"),
    ({"store": 5}, TypeError, "store"),
    ({"store": "redis", "url": b"redis://x"}, TypeError, "url"),
    ({"probe": "yes"}, TypeError, "probe"),
])
def test_arguments_of_the_wrong_type_name_the_argument(kw, exc, field):
    _, view = kv_buffer(N, BS)
    with pytest.raises(exc, match=f"^{field}:"):
        KvschedTierManager(None, view, "kvsched", **kw)


def test_a_bytes_path_is_a_path(tmp_path):
    tier, c = make(store="disk", path=str(tmp_path / "b").encode())
    assert c.store([key(1)], [0]) and (tmp_path / "b").is_dir()


@pytest.mark.parametrize("keys,block_ids,field", [
    ([key(1)], None, "block_ids"),
    ([key(1)], 5, "block_ids"),
    (None, [0], "keys"),
    (b"k1", [0], "keys"),
    (bytearray(b"k1"), [0, 1], "keys"),
    # One key's bytes in a memoryview, not two keys 107 and 49 (its `tolist`).
    (memoryview(b"k1"), [0, 1], "keys"),
    ([key(1)], memoryview(b"\x00"), "block_ids"),
])
def test_jobs_without_sequences_name_the_field(keys, block_ids, field):
    from tier_caller import JobMetadata

    tier, _ = make()
    for submit in (tier.submit_store, tier.submit_load):
        with pytest.raises(TypeError, match=f"^{field}:"):
            submit(JobMetadata(1, keys, block_ids))


@pytest.mark.parametrize("bad", [32, True, [0] * 32, 3.5])
def test_a_mac_key_that_is_no_bytes_or_text_is_a_type_error(bad):
    # bytes(32) is 32 zero bytes: an int taken for a key would be one anyone can guess.
    _, view = kv_buffer(N, BS)
    with pytest.raises(TypeError, match="^mac_key:"):
        KvschedTierManager(None, view, "kvsched", mac_key=bad)


def test_importable_without_vllm():
    import sys

    import kvsched.tier
    import kvsched.vllm

    assert "vllm" not in sys.modules
    assert kvsched.tier.JobResult(1, True).success
