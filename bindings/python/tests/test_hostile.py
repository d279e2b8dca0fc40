"""Hostile input to the package's public functions: values out of range, wrong types and
one-shot iterables, each expected to give a `ValueError` (or a `TypeError` for a wrong type)
naming the argument, never a `PanicException`, a hang or a silently wrong answer."""

from __future__ import annotations

import time

import pytest

import kvsched
from kvsched.tier import KvschedTierManager
from kvsched.vllm import CacheGroup, RequestState, SharerHolds, plan_recovery
from tier_caller import Caller, JobMetadata, key, kv_buffer

N = 8
BS = 64


def make(**kw):
    raw, view = kv_buffer(N, BS)
    tier = KvschedTierManager(None, view, "kvsched", **kw)
    return tier, Caller(tier, view)


# --- kvsched.tier: drain_jobs's timeout -----------------------------------------------------


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, 2**64], ids=["inf", "1e300", "2**64"])
def test_drain_jobs_with_a_huge_timeout_waits_or_names_the_argument(timeout):
    tier, _ = make()
    try:
        # Idle: a timeout meaning "wait as long as it takes" returns at once.
        assert tier.drain_jobs(timeout) is True
    except ValueError as e:  # or refused, naming the argument
        assert str(e).startswith("timeout"), e
    finally:
        tier.shutdown()


def test_drain_jobs_with_a_zero_or_negative_timeout_returns_at_once():
    tier, c = make()
    try:
        assert tier.drain_jobs(0) is True
        assert tier.drain_jobs(-1.0) is True
        assert c.store([key(1)], [0])
    finally:
        tier.shutdown()


# --- kvsched.tier: constructor and jobs -----------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_capacity_that_holds_no_chunk_names_the_argument(store, tmp_path):
    kw = {"path": str(tmp_path / "d")} if store == "disk" else {}
    with pytest.raises(ValueError, match="^capacity_bytes:"):
        tier, c = make(store=store, capacity_bytes=0, **kw)
        tier.shutdown()


@pytest.mark.parametrize("mac", [None, bytes(32)], ids=["checksum", "mac"])
@pytest.mark.parametrize("store", ["memory", "disk"])
def test_the_least_capacity_named_holds_a_block(store, mac, tmp_path):
    import re

    kw = {"path": str(tmp_path / "d")} if store == "disk" else {}
    with pytest.raises(ValueError, match="^capacity_bytes: 1 holds no block") as e:
        make(store=store, capacity_bytes=1, mac_key=mac, **kw)
    least = int(re.search(r"at least (\d+)", str(e.value)).group(1))
    with pytest.raises(ValueError, match="^capacity_bytes:"):
        make(store=store, capacity_bytes=least - 1, mac_key=mac, **kw)
    tier, c = make(store=store, capacity_bytes=least, mac_key=mac, **kw)
    try:
        c.fill(0, b"\x05" * BS)
        assert c.store([key(1)], [0])
        assert c.load([key(1)], [1])
        assert c.slot(1) == b"\x05" * BS
    finally:
        tier.shutdown()


@pytest.mark.parametrize("job", [None, object(), 5], ids=["None", "object", "int"])
def test_a_job_that_is_no_job_metadata_is_a_type_error_naming_it(job):
    tier, _ = make()
    try:
        for submit in (tier.submit_store, tier.submit_load):
            with pytest.raises(TypeError, match="^job_metadata"):
                submit(job)
    finally:
        tier.shutdown()


def test_unordered_slots_are_a_type_error_naming_block_ids():
    tier, c = make(mac_key=bytes(32))
    try:
        keys = [key(i) for i in range(8)]
        job = JobMetadata(1, keys, set(range(8)))
        with pytest.raises(TypeError, match="^block_ids:"):
            tier.submit_store(job)
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    "collection",
    [set, frozenset, dict.fromkeys, lambda xs: dict.fromkeys(xs).keys()],
    ids=["set", "frozenset", "dict", "dict-keys"],
)
def test_keys_given_as_any_collection_pair_with_the_slots_in_its_order(collection):
    # vLLM types a job's keys `Collection[OffloadKey]` (the offloading connector keeps them
    # in sets) and builds `block_ids` by iterating the same collection: each key's block is
    # the slot at its place in that order.
    tier, c = make(mac_key=bytes(32))
    try:
        for i in range(N):
            c.fill(i, bytes([i + 1]) * BS)
        keys = collection([key(i) for i in range(N)])
        slot_of = {key(i): i for i in range(N)}
        job = JobMetadata(1, keys, [slot_of[k] for k in keys])
        tier.submit_store(job)
        assert c.wait(1)
        for i in range(N):
            c.fill(i, bytes(BS))
        for i in range(N):
            assert c.load([key(i)], [i]), i
            assert c.slot(i) == bytes([i + 1]) * BS, f"key {i} holds another slot's block"
    finally:
        tier.shutdown()


def test_drain_jobs_without_a_timeout_waits_until_no_job_runs():
    # vLLM's reset_cache calls `drain_jobs()` and needs no transfer touching the primary
    # buffer after it returns: no argument is no limit, not a timeout answering False.
    import inspect

    assert inspect.signature(KvschedTierManager.drain_jobs).parameters["timeout"].default is None
    tier, c = make()
    try:
        for i in range(N):
            c._submit("store", [key(i)], [i])
        assert tier.drain_jobs() is True
        assert tier.drain_jobs(None) is True
    finally:
        tier.shutdown()


def test_after_shutdown_the_primary_tier_can_close_its_buffer():
    # vLLM shuts the secondary tiers down, then the primary, which releases its view and
    # closes the mmap behind it: no export of the tier's may be left.
    import mmap

    mm = mmap.mmap(-1, N * BS)
    view = memoryview(mm).cast("B", (N, BS))
    tier = KvschedTierManager(None, view, "kvsched")
    c = Caller(tier, view)
    assert c.store([key(0)], [0])
    tier.shutdown()
    view.release()
    mm.close()  # a BufferError while an export is held
    # The tier still answers, its jobs failing at once.
    tier.submit_load(JobMetadata(7, [key(0)], [0]))
    assert tier.drain_jobs(5.0)
    assert [(r.job_id, r.success) for r in tier.get_finished()] == [(7, False)]
    assert tier.lookup(key(0)) is False


@pytest.mark.parametrize(
    "unordered",
    [frozenset, dict.fromkeys, lambda xs: dict.fromkeys(xs).keys(),
     lambda xs: dict(enumerate(xs)).values(), lambda xs: dict(enumerate(xs)).items()],
    ids=["frozenset", "dict", "dict-keys", "dict-values", "dict-items"],
)
def test_every_unordered_collection_of_slots_is_refused(unordered):
    tier, c = make()
    try:
        keys = [key(i) for i in range(4)]
        slots = list(range(4))
        job = JobMetadata(1, keys, unordered(slots))
        for submit in (tier.submit_store, tier.submit_load):
            with pytest.raises(TypeError, match="^block_ids:"):
                submit(job)
        # Nothing was enqueued: the same job as lists runs.
        assert c.store(keys, slots)
    finally:
        tier.shutdown()


def test_a_key_that_cannot_be_encoded_names_the_argument():
    tier, _ = make()
    try:
        with pytest.raises(ValueError, match="^key"):
            tier.lookup("\ud800")
    finally:
        tier.shutdown()


_PROBE_FLOOD = """
import resource, socket, sys, threading
from tier_caller import key, kv_buffer
from kvsched.tier import KvschedTierManager

# A server that accepts and never answers: the tier's probes of unknown keys cannot keep up.
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(64)
held = []
threading.Thread(target=lambda: [held.append(ls.accept()) for _ in iter(int, 1)], daemon=True).start()
raw, view = kv_buffer(8, 64)
tier = KvschedTierManager(None, view, "kvsched", store="redis",
                          url=f"redis://127.0.0.1:{ls.getsockname()[1]}")
for i in range(200_000):  # warm-up: the index's sets fill to their bounds
    tier.lookup(key(i))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for i in range(200_000, 2_200_000):
    tier.lookup(key(i))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
tier.shutdown()
print(grown // 1024)
"""


def test_lookups_of_unknown_keys_on_a_store_that_lags_stay_bounded():
    import os
    import pathlib
    import subprocess
    import sys

    here = pathlib.Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, "-c", _PROBE_FLOOD], cwd=here, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(here)})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) < 100, f"{r.stdout.strip()} MB more after 2,000,000 lookups"


@pytest.mark.skipif(not kvsched.HAS_REDIS, reason="this build has no Redis tier")
@pytest.mark.parametrize(
    "url, message",
    [
        ("redis://127.0.0.1:0", "url: seed 1: "),
        ("http://127.0.0.1", "url: the scheme must be redis:// or rediss://"),
        ("redis://127.0.0.1:1?timeout_ms=0", "url: query key timeout_ms: "),
        ("redis://127.0.0.1:1?connect_timeout_ms=0", "url: query key connect_timeout_ms: "),
        ("redis://127.0.0.1:1?ttl_ms=0", "url: query key ttl_ms: "),
        ("redis://127.0.0.1:1?pool=0", "url: query key pool: "),
    ],
)
def test_a_bad_redis_url_names_the_argument_once_and_the_part_typed(url, message):
    with pytest.raises(ValueError) as e:
        make(store="redis", url=url)
    assert str(e.value).startswith(message), e.value
    assert "url: url:" not in str(e.value) and "\n" not in str(e.value), e.value


def test_an_empty_job_and_duplicate_slots_finish_and_report_once():
    tier, c = make()
    try:
        tier.submit_store(JobMetadata(1, [], []))
        assert c.wait(1, 5.0) is True
        tier.submit_load(JobMetadata(2, [], []))
        assert c.wait(2, 5.0) is True
        c.fill(0, b"\x07" * BS)
        assert c.store([key(1), key(1)], [0, 0])
        assert c.load([key(1), key(1)], [3, 3])
        assert c.slot(3) == b"\x07" * BS
    finally:
        tier.shutdown()


def test_a_redis_url_with_nothing_behind_it_fails_jobs_fast():
    tier, c = make(store="redis", url="redis://127.0.0.1:1")
    try:
        t0 = time.monotonic()
        assert c.store([key(1)], [0]) is False
        assert c.load([key(2)], [1]) is False
        assert c.lookup(key(3)) is False
        assert time.monotonic() - t0 < 5.0
    finally:
        tier.shutdown()


# --- kvsched.vllm.plan_recovery -------------------------------------------------------------

# A full-attention and a 16-token sliding-window group: r1 owns block 2 (rolls back to 0),
# r2 keeps its 32 pre-step tokens and waits for r1 to rewrite block 2 (tokens 16-32).
GROUPS = [CacheGroup("full_attention", 16), CacheGroup("sliding_window", 16, window=16)]


def _requests(tables):
    return [
        RequestState("r1", False, tables, 48, 16),
        RequestState("r2", False, [[1, 2, 9], [0, 2, 9]], 48, 16),
    ]


def test_the_waits_of_a_sharer_name_where_the_owner_rewrites_the_block():
    plan = plan_recovery(_requests([[1, 2, 3], [0, 2, 3]]), GROUPS, {2})
    assert plan.num_computed_tokens == {"r1": 0, "r2": 32}
    assert [(w.block, w.owner, w.ready_at) for w in plan.waits["r2"]] == [(2, "r1", 32)]


def test_with_one_pool_per_group_a_wait_ends_where_the_owner_rewrites_the_sharers_group():
    """One pool per group: id 5 is r1's block at tokens 32-48 in group 0, and another block,
    r0's, at 0-16 in group 1. r2 reads group 0's: it waits until r1 is back at 48, not 16 (the
    end of the id's first entry in any group, which released r2 before r1 had recomputed)."""
    groups = [CacheGroup("full_attention", 16), CacheGroup("full_attention", 16)]
    reqs = [
        RequestState("r0", True, [[1, 2, 3], [5, 6, 7]], 48),
        RequestState("r1", True, [[8, 9, 5], [5, 6, 7]], 48),
        RequestState("r2", True, [[8, 9, 5], [10, 11, 12]], 48),
    ]
    plan = plan_recovery(reqs, groups, [5])
    assert plan.num_computed_tokens == {"r0": 0, "r1": 32, "r2": 48}
    assert [(w.block, w.owner, w.ready_at) for w in plan.waits["r1"]] == [(5, "r0", 16)]
    assert [(w.block, w.owner, w.ready_at) for w in plan.waits["r2"]] == [(5, "r1", 48)]
    holds = SharerHolds()
    holds.add(plan)
    at = {"r0": 0, "r1": 32, "r2": 48}
    assert holds.refresh(at.get) == {} and holds.held("r2")
    at.update(r0=16)
    assert holds.refresh(at.get) == {} and not holds.held("r1") and holds.held("r2")
    at.update(r1=48)
    assert holds.refresh(at.get) == {} and not holds.held("r2")
    # A sharer holding the id in both groups waits for both of the owner's entries.
    reqs[2] = RequestState("r2", True, [[8, 9, 5], [5, 11, 12]], 48)
    plan = plan_recovery(reqs, groups, [5])
    owners = sorted((w.owner, w.ready_at) for w in plan.waits["r2"])
    assert ("r0", 16) in owners and ("r1", 48) in owners, owners


@pytest.mark.parametrize(
    "tables",
    [
        lambda: iter([[1, 2, 3], [0, 2, 3]]),
        lambda: [iter([1, 2, 3]), iter([0, 2, 3])],
        lambda: ([1, 2, 3] if g == 0 else [0, 2, 3] for g in range(2)),
    ],
    ids=["iterator-of-tables", "iterator-tables", "generator"],
)
def test_one_shot_block_ids_still_give_the_sharer_its_wait(tables):
    plan = plan_recovery(_requests(tables()), GROUPS, {2})
    assert plan.num_computed_tokens == {"r1": 0, "r2": 32}
    assert [(w.block, w.owner, w.ready_at) for w in plan.waits["r2"]] == [(2, "r1", 32)]
    holds = SharerHolds()
    holds.add(plan)
    # r1 has recomputed nothing yet: r2 must stay held.
    holds.refresh(lambda rid: {"r1": 0, "r2": 32}[rid])
    assert holds.held("r2")


# --- the READMEs' Python examples, as a newcomer runs them ----------------------------------


def _readme_examples():
    """Each ```python block of the READMEs that calls the rules, with its `expr  # value`
    lines: what a reader is told the example returns."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[3]
    out = []
    for readme in (root / "README.md", root / "bindings" / "python" / "README.md"):
        text = readme.read_text()
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            if "vllm." in block or ("recover(" not in block and "plan_recovery(" not in block):
                continue
            name = readme.relative_to(root).as_posix().replace("/", "-")
            out.append(pytest.param(block, id=f"{name}-{i}"))
    return out


def _expected(comment: str, got: object) -> bool:
    shown = repr(got)
    return comment == shown or comment.split(":")[0].strip() == shown


@pytest.mark.parametrize("block", _readme_examples())
def test_a_readme_example_returns_what_it_says(block):
    import re

    scope: dict = {}
    lines: list[str] = []
    checked = 0
    for line in block.splitlines():
        m = re.match(r"^(.*?\S)\s+#\s+(.+)$", line)
        lines.append(m.group(1) if m else line)
        source = "\n".join(lines)
        try:
            expr = compile(source, "<README>", "eval") if m else None
        except SyntaxError:
            expr = None
        if expr is not None:
            got = eval(expr, scope)  # noqa: S307 - the README's own example
            assert _expected(m.group(2).strip(), got), f"{source}: {got!r}, README says {m.group(2)}"
            checked += 1
            lines = []
            continue
        try:
            code = compile(source, "<README>", "exec")
        except SyntaxError:
            continue
        exec(code, scope)  # noqa: S102 - the README's own example
        lines = []
    assert checked, "no `expr  # value` line in the example"


def test_requests_given_as_a_set_are_refused_naming_the_field():
    import kvsched.vllm as v

    reqs = {RequestState(f"r{i}", False, ((1, 2, 3 + i),), 48, 16) for i in range(4)}
    groups = [CacheGroup("full_attention", 16)]
    # scenario_of, given the same set, refuses it:
    with pytest.raises(ValueError, match="^requests: expected a list, not set"):
        v.scenario_of(reqs, groups, [2])
    with pytest.raises(ValueError, match="^requests:"):
        plan_recovery(reqs, groups, {2})
    with pytest.raises(ValueError, match="^requests: expected a list, not frozenset"):
        plan_recovery(frozenset(reqs), groups, {2})
    with pytest.raises(ValueError, match="^requests: expected a list, not dict"):
        plan_recovery({r.request_id: r for r in reqs}, groups, {2})


# --- kvsched.tier: keys of different types, slots named twice, timeouts, touch, store -------


def test_keys_of_different_types_never_name_one_block():
    """An int, a str and a bytes key with the same bytes are three keys: a block stored under
    one is not present, nor loaded, under another (on a shared store, an engine keying by
    ints would otherwise load another's bytes-keyed block)."""
    from kvsched.tier import offload_key_bytes

    assert len({offload_key_bytes(0x6B31), offload_key_bytes(b"1k"), offload_key_bytes("1k")}) == 3
    assert len({offload_key_bytes(1), offload_key_bytes("1"), offload_key_bytes(b"1")}) == 3
    assert offload_key_bytes(0) != offload_key_bytes(b"\x00")
    tier, c = make()
    try:
        assert c.store([0x6B31], [5])
        assert tier.lookup(0x6B31) is True
        for other in (b"1k", "1k"):
            assert tier.lookup(other) is False, other
            assert not c.load([other], [7]), other
    finally:
        tier.shutdown()


def test_a_load_naming_one_slot_for_two_keys_names_block_ids():
    tier, c = make()
    try:
        assert c.store([key(10), key(11)], [1, 2])
        with pytest.raises(ValueError, match=r"^block_ids: slot 3 appears twice in a load, for two keys"):
            tier.submit_load(JobMetadata(9, [key(10), key(11)], [3, 3]))
        assert tier.get_finished() == []
        # A store may save one slot under two keys, a load may fill two slots from one key,
        # or one slot twice from one key.
        assert c.store([key(12), key(13)], [1, 1])
        assert c.load([key(10), key(10)], [5, 6])
        assert c.load([key(11), key(11)], [4, 4])
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    "timeout, error",
    [(float("nan"), ValueError), ("1", TypeError), (True, TypeError)],
    ids=["nan", "str", "bool"],
)
def test_a_timeout_that_is_no_number_of_seconds_names_the_argument(timeout, error):
    tier, c = make()
    try:
        assert c.store([key(1)], [0])
        with pytest.raises(error, match="^timeout: "):
            tier.drain_jobs(timeout)
        assert tier.drain_jobs(2**2000) is True  # too large for a float: no limit
    finally:
        tier.shutdown()


@pytest.mark.parametrize("keys", [None, "abc", b"ab", 7], ids=["None", "str", "bytes", "int"])
def test_touch_of_what_is_no_collection_of_keys_names_keys(keys):
    tier, _ = make()
    try:
        with pytest.raises(TypeError, match="^keys: "):
            tier.touch(keys)
        assert tier.touch([key(1), key(2)]) is None
    finally:
        tier.shutdown()


def test_a_store_that_is_no_str_names_store():
    raw, view = kv_buffer(N, BS)
    with pytest.raises(TypeError, match="^store: "):
        KvschedTierManager(None, view, "kvsched", store=None)


def test_lookup_after_shutdown_is_a_miss():
    tier, c = make()
    assert c.store([key(1)], [0])
    assert tier.lookup(key(1)) is True
    tier.shutdown()
    assert tier.lookup(key(1)) is False  # a load of it would fail at once


def test_recover_with_an_explain_that_is_no_bool_names_explain():
    with pytest.raises(TypeError, match="^explain: "):
        kvsched.recover({}, explain="yes")


@pytest.mark.parametrize(
    "answer, error",
    [(float("nan"), TypeError), ("x", TypeError), (-1, ValueError), (2.0, TypeError)],
    ids=["nan", "str", "negative", "float"],
)
def test_sharer_holds_refresh_refuses_a_callback_answer_that_is_no_token_count(answer, error):
    """A refresh whose callback answers NaN (or a str, a float, a negative count) for the owner
    names the callback and the request, and leaves every wait as it was: NaN compared as
    "not below ready_at" and released the sharer though its owner had recomputed nothing."""
    reqs = [
        RequestState("o", False, [[1, 2, 3]], 48, 16),
        RequestState("s", False, [[1, 2, 7]], 48, 16),
        RequestState("s2", False, [[1, 2, 7]], 48, 16),
    ]
    plan = plan_recovery(reqs, [CacheGroup("full_attention", 16)], {2})
    holds = SharerHolds()
    holds.add(plan)
    before = holds.waiting()
    assert before, plan
    with pytest.raises(error, match=r"^computed\('o'\): "):
        holds.refresh(lambda r: answer if r == "o" else 32)
    assert holds.waiting() == before


def test_request_ids_of_a_str_subclass_that_lies_are_taken_as_their_characters():
    class Liar(str):
        def __eq__(self, other):
            return False

        def __hash__(self):
            return id(self)

        def __str__(self):
            return "somebody else"

    def plan(make):
        reqs = [
            RequestState(make("o"), False, [[1, 2, 3]], 48, 16),
            RequestState(make("s"), False, [[1, 2, 7]], 48, 16),
        ]
        return plan_recovery(reqs, [CacheGroup("full_attention", 16)], {2})

    lied, plain = plan(Liar), plan(str)
    assert plain.waits["s"][0].owner == "o", plain
    assert (lied.num_computed_tokens, lied.waits) == (plain.num_computed_tokens, plain.waits)


# --- kvsched.vllm: invalid block ids named where they stand --------------------------------


def _one_request_plan(ids, by_group=None):
    reqs = [RequestState("r", False, [[1, 2, 9]], 48, 16)]
    return plan_recovery(
        reqs, [CacheGroup("full_attention", 16)], ids, invalid_block_ids_by_group=by_group
    )


@pytest.mark.parametrize(
    "ids, by_group, field",
    [
        ([9, 2.5], None, "invalid_blocks[1]"),
        ([2, 2.0], None, "invalid_blocks[1]"),
        ([2.0], None, "invalid_blocks[0]"),
        ([1, True], None, "invalid_blocks[1]"),
        ([True, 1], None, "invalid_blocks[0]"),
        ([9, -1], None, "invalid_blocks[1]"),
        ([9, 2**64], None, "invalid_blocks[1]"),
        ([], [[9, -1]], "invalid_blocks_by_group[0][1]"),
        ([], [[9, 2, 2.0]], "invalid_blocks_by_group[0][2]"),
    ],
    ids=["float", "float-dup", "float-alone", "bool-after", "bool-first", "negative",
         "too-big", "by-group-negative", "by-group-float-dup"],
)
def test_invalid_block_ids_are_checked_where_they_stand_before_sorting(ids, by_group, field):
    """Each id is checked at its own index before the ids are sorted and de-duplicated: the
    error names that index, and whether an id is refused never depends on what precedes it
    (``[2, 2.0]`` and ``[1, True]`` were taken as ``[2]`` and ``[1]``)."""
    with pytest.raises(kvsched.ScenarioError) as e:
        _one_request_plan(ids, by_group)
    assert e.value.field == field, str(e.value)
    assert "\n" not in str(e.value)
    # Good ids are still sorted and de-duplicated, in any order.
    assert _one_request_plan([9, 2, 9]).evict_blocks == _one_request_plan([2, 9]).evict_blocks


# --- kvsched.recover_json: explain -----------------------------------------------------------


@pytest.mark.parametrize("explain", [2, "yes", None], ids=["int", "str", "None"])
def test_recover_json_with_an_explain_that_is_no_bool_names_explain(explain):
    text = '{"groups":[{"kind":"full_attention","block_size":16}],"requests":[],"invalid_blocks":[]}'
    with pytest.raises(TypeError, match=rf"^explain: expected a bool, not {type(explain).__name__}$"):
        kvsched.recover_json(text, explain=explain)
    with pytest.raises(TypeError, match=rf"^explain: expected a bool, not {type(explain).__name__}$"):
        kvsched.recover({}, explain=explain)


# --- kvsched.vllm: groups_from_kv_cache_config -----------------------------------------------


def _config(*specs):
    from types import SimpleNamespace

    return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=s) for s in specs])


@pytest.mark.parametrize(
    "spec, mamba_mode, field",
    [
        (("full", -16), "align", "kv_cache_groups[1].block_size"),
        (("full", 0), "align", "kv_cache_groups[1].block_size"),
        (("full", 2**64), "align", "kv_cache_groups[1].block_size"),
        (("full", 16.0), "align", "kv_cache_groups[1].block_size"),
        (("window", 16, -5), "align", "kv_cache_groups[1].sliding_window"),
        (("window", 16, 0), "align", "kv_cache_groups[1].sliding_window"),
        (("window", 16, 2.5), "align", "kv_cache_groups[1].sliding_window"),
        (("window", -16, 32), "align", "kv_cache_groups[1].block_size"),
        (("mamba", 16, "none"), "bogus", "mamba_mode"),
        (("mamba", 16, "none"), None, "mamba_mode"),
        (("mamba", 0, "align"), "align", "kv_cache_groups[1].block_size"),
        (("full", 16), "bogus", "mamba_mode"),
    ],
    ids=["negative", "zero", "too-big", "float", "window-negative", "window-zero",
         "window-float", "window-block-negative", "mamba-mode-bogus", "mamba-mode-None",
         "mamba-zero", "mamba-mode-no-mamba-group"],
)
def test_groups_from_kv_cache_config_refuses_what_the_rules_refuse(spec, mamba_mode, field):
    """What the scenario parser would refuse (a block size or window of 0 or less, a Mamba
    mode that is neither "align" nor "all") is refused at the call, naming the field:
    CacheGroup(block_size=-16), window=-5 and mamba_mode="None" came back as groups."""
    from kvsched.vllm import groups_from_kv_cache_config
    from vllm_standins import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    make_spec = {"full": FullAttentionSpec, "window": SlidingWindowSpec, "mamba": MambaSpec}
    cfg = _config(FullAttentionSpec(16), make_spec[spec[0]](*spec[1:]))
    with pytest.raises(kvsched.ScenarioError) as e:
        groups_from_kv_cache_config(cfg, mamba_mode)
    assert e.value.field == field, str(e.value)
    assert "\n" not in str(e.value)


def test_groups_from_kv_cache_config_of_no_config_is_a_type_error_naming_it():
    from types import SimpleNamespace

    from kvsched.vllm import groups_from_kv_cache_config

    for cfg, field in [
        (None, "kv_cache_config"),
        (SimpleNamespace(), "kv_cache_config"),
        (SimpleNamespace(kv_cache_groups="ab"), "kv_cache_config"),
        (SimpleNamespace(kv_cache_groups=[SimpleNamespace()]), "kv_cache_groups[0].kv_cache_spec"),
    ]:
        with pytest.raises(TypeError, match=rf"^{field.replace('[', '.').replace(']', '.')}"):
            groups_from_kv_cache_config(cfg)
    with pytest.raises(kvsched.ScenarioError) as e:
        groups_from_kv_cache_config(_config(SimpleNamespace()))
    assert e.value.field == "kv_cache_groups[0].block_size"


def test_groups_from_kv_cache_config_takes_good_specs():
    from kvsched.vllm import groups_from_kv_cache_config
    from vllm_standins import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    cfg = _config(FullAttentionSpec(16), SlidingWindowSpec(32, 64), MambaSpec(16, "none"))
    assert groups_from_kv_cache_config(cfg, "all") == [
        CacheGroup("full_attention", 16),
        CacheGroup("sliding_window", 32, window=64),
        CacheGroup("mamba", 16, mamba_mode="all"),
    ]


# --- kvsched.vllm: SharerHolds arguments -----------------------------------------------------


def _holds():
    reqs = [
        RequestState("o", False, [[1, 2, 3]], 48, 16),
        RequestState("s", False, [[1, 2, 7]], 48, 16),
    ]
    holds = SharerHolds()
    holds.add(plan_recovery(reqs, [CacheGroup("full_attention", 16)], {2}))
    return holds


def _state(rid):
    return RequestState(rid, False, [[1, 2, 7]], 48, 0)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda h: h.add(None), TypeError, r"^plan: expected a RecoveryPlan, not NoneType$"),
        (lambda h: h.add({"s": []}), TypeError, r"^plan: expected a RecoveryPlan, not dict$"),
        (lambda h: h.held([]), TypeError, r"^request_id: expected a str, not list$"),
        (lambda h: h.held(None), TypeError, r"^request_id: expected a str, not NoneType$"),
        (lambda h: h.forget([]), TypeError, r"^request_id: expected a str, not list$"),
        (lambda h: h.refresh(None), TypeError, r"^computed: expected a callable, not NoneType$"),
        (lambda h: h.refresh(lambda r: 0, 5), TypeError,
         r"^last: expected a callable or None, not int$"),
        (lambda h: h.refresh(lambda r: 0, None, 5), TypeError,
         r"^holding: expected a callable or None, not int$"),
        (lambda h: h.refresh(lambda r: 0, None, lambda o, b: 1), TypeError,
         r"^holding\('o', 2\): expected a bool, not 1$"),
        (lambda h: h.replan([2], _state, [CacheGroup("full_attention", 16)]), TypeError,
         r"^orphaned: expected a mapping of block ids to waiters \(as refresh returns\), not list$"),
        (lambda h: h.replan({2: "s"}, _state, [CacheGroup("full_attention", 16)]), TypeError,
         r"^orphaned\[2\]: expected a list of request ids, not str$"),
        (lambda h: h.replan({2: [5]}, _state, [CacheGroup("full_attention", 16)]), TypeError,
         r"^orphaned\[2\]\[0\]: expected a str, not int$"),
        (lambda h: h.replan({2.5: ["s"]}, _state, [CacheGroup("full_attention", 16)]), TypeError,
         r"^orphaned: a block id must be a whole number, not float$"),
        (lambda h: h.replan({10**5000: "s"}, _state, [CacheGroup("full_attention", 16)]),
         ValueError, r"^orphaned: block id <int too long to show> is outside 0\.\.=18446744073709551615$"),
        (lambda h: h.replan({2: ["s"]}, None, [CacheGroup("full_attention", 16)]), TypeError,
         r"^state: expected a callable, not NoneType$"),
        (lambda h: h.replan({2: ["s"]}, lambda r: None, [CacheGroup("full_attention", 16)]),
         TypeError, r"^state\('s'\): expected a RequestState, not NoneType$"),
    ],
    ids=["add-None", "add-dict", "held-list", "held-None", "forget-list", "refresh-None",
         "refresh-last-int", "refresh-holding-int", "refresh-holding-answers-int", "replan-list", "replan-str-waiters", "replan-int-waiter",
         "replan-float-block", "replan-huge-block", "replan-state-None", "replan-state-answers-None"],
)
def test_sharer_holds_methods_name_an_argument_of_the_wrong_type(call, error, message):
    """Each method checks its arguments and names the one that is wrong: add(None) leaked an
    AttributeError, held([]) an unhashable-type TypeError, replan([2], ...) an AttributeError,
    refresh(None) "'NoneType' object is not callable". The waits are left as they were."""
    holds = _holds()
    before = holds.waiting()
    assert before
    with pytest.raises(error, match=message):
        call(holds)
    assert holds.waiting() == before


# --- kvsched.tier: bool keys, tier_type ------------------------------------------------------


@pytest.mark.parametrize("k", [True, False], ids=["True", "False"])
def test_a_bool_key_is_a_type_error_naming_key(k):
    """A key's type is part of its name: True is no int key 1 (job_id and block_ids refuse
    bools the same way)."""
    from kvsched.tier import offload_key_bytes

    with pytest.raises(TypeError, match=r"^key: expected bytes, int or str, got bool$"):
        offload_key_bytes(k)
    tier, c = make()
    try:
        assert c.store([int(k)], [1])
        with pytest.raises(TypeError, match=r"^key: "):
            tier.lookup(k)
        with pytest.raises(TypeError, match=r"^key: "):
            tier.submit_load(JobMetadata(9, [k], [2]))
        assert tier.get_finished() == []
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    "tier_type, error, message",
    [
        (5, TypeError, r"^tier_type: expected a str, not int$"),
        (None, TypeError, r"^tier_type: expected a str, not NoneType$"),
        (b"kvsched", TypeError, r"^tier_type: expected a str, not bytes$"),
        ("", ValueError, r"^tier_type: must be a non-empty str$"),
    ],
    ids=["int", "None", "bytes", "empty"],
)
def test_a_tier_type_that_is_no_tier_type_names_tier_type(tier_type, error, message):
    raw, view = kv_buffer(N, BS)
    with pytest.raises(error, match=message):
        KvschedTierManager(None, view, tier_type)
    tier = KvschedTierManager(None, view, "my-tier")
    try:
        assert tier.tier_type == "my-tier"
    finally:
        tier.shutdown()


# --- kvsched.tier: buffers no longer readable, text and paths that are no UTF-8 -------------


def _closed_mmap():
    import mmap

    m = mmap.mmap(-1, N * BS)
    m.close()
    return m


def _released_view():
    v = memoryview(bytearray(N * BS))
    v.release()
    return v


@pytest.mark.parametrize("buffer", [_closed_mmap, _released_view], ids=["mmap", "memoryview"])
def test_a_closed_or_released_buffer_names_primary_kv_view(buffer):
    with pytest.raises(ValueError, match="^primary_kv_view: "):
        KvschedTierManager(None, buffer(), "kvsched", num_blocks=N)


@pytest.mark.parametrize("as_", ["bytes", "str", "pathlike"])
def test_a_path_that_is_no_utf8_names_that_directory(tmp_path, as_):
    import os
    import pathlib

    raw = os.fsencode(tmp_path) + b"/kv-\xff"
    path = {"bytes": raw, "str": os.fsdecode(raw), "pathlike": pathlib.Path(os.fsdecode(raw))}
    tier, c = make(store="disk", path=path[as_])
    c.fill(0, b"\x07" * BS)
    assert c.store([key(1)], [0])
    assert os.path.isdir(raw) and any(n.endswith(b".pack") for n in os.listdir(raw))
    # Another engine naming it another way finds the same chunks.
    other, oc = make(store="disk", path=raw)
    assert oc.lookup(key(1)) is True
    assert oc.load([key(1)], [3]) and oc.slot(3) == b"\x07" * BS


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"store": "disk", "path": "/tmp/kv-\ud800"}, "path"),
        ({"store": "redis", "url": "redis://h\udcff:1"}, "url"),
        ({"store": "redis", "url": "redis://127.0.0.1:1/\ud800"}, "url"),
        ({"store": "\udcff"}, "store"),
        ({"mac_key": "env:\ud800"}, "mac_key"),
    ],
    ids=["path", "url-host", "url-tail", "store", "mac_key-env"],
)
def test_text_that_is_no_valid_unicode_names_the_argument(kw, field):
    raw, view = kv_buffer(N, BS)
    with pytest.raises(ValueError, match=f"^{field}: "):
        KvschedTierManager(None, view, "kvsched", **kw)


@pytest.mark.parametrize("depth", [200, 5000], ids=["past-the-parser", "past-json-dumps"])
def test_nesting_past_the_parsers_limit_gives_the_commands_message(depth):
    # docs/replay.md: nesting deeper than 128 is malformed JSON, named at the innermost value
    # being read. recover(dict) says what recover_json (and the command) says of its text,
    # whether or not json.dumps itself can write that deep.
    deep: list = []
    for _ in range(depth):
        deep = [deep]
    scenario = {"mode": "safe", "groups": deep, "requests": [], "invalid_blocks": []}
    text = ('{"mode": "safe", "groups": ' + "[" * (depth + 1) + "]" * (depth + 1)
            + ', "requests": [], "invalid_blocks": []}')
    with pytest.raises(kvsched.ScenarioError) as from_dict:
        kvsched.recover(scenario)
    with pytest.raises(kvsched.ScenarioError) as from_text:
        kvsched.recover_json(text)
    assert str(from_dict.value) == str(from_text.value)
    assert (from_dict.value.field, from_dict.value.problem) == (
        from_text.value.field, from_text.value.problem)


def test_the_tier_names_its_tier_type_as_vllm_asks_the_class():
    # vLLM versions that declare `get_tier_type` abstract (a static method) cannot create a
    # tier class without it.
    assert KvschedTierManager.get_tier_type() == "kvsched"
