"""`kvsched.vllm` on stand-ins of vLLM's scheduler: every repository scenario vLLM can express
(a flat report, the default scheduler block size) applied through `_handle_invalid_blocks`
gives the committed outcome; the single-group vectors of vLLM's own tests that docs/rules.md
reproduces; mode safe's waiting sharers held by `schedule` and handed over when an owner ends."""

from __future__ import annotations

import json
import math

from types import SimpleNamespace

import pytest

import kvsched
from conftest import scenario_files
from kvsched.vllm import CacheGroup, RequestState, plan_recovery
from kvsched.vllm import KvschedRecoveryMixin
from vllm_standins import FINISHED, BaseScheduler, MambaSpec, Scheduler

def expressible(scenario: dict) -> bool:
    """vLLM reports flat block ids and has no scheduler block size of its own (it is the lcm
    of the groups' block sizes)."""
    lcm = math.lcm(*(g["block_size"] for g in scenario["groups"]))
    return "invalid_blocks_by_group" not in scenario and scenario.get("scheduler_block_size", lcm) == lcm


EXPRESSIBLE = [p for p in scenario_files() if expressible(json.loads(p.read_text()))]


def test_most_scenarios_are_expressible_in_vllms_terms():
    assert len(EXPRESSIBLE) >= 30, len(EXPRESSIBLE)


@pytest.mark.parametrize("path", EXPRESSIBLE, ids=lambda p: p.stem)
def test_handle_invalid_blocks_applies_the_committed_outcome(path):
    scenario = json.loads(path.read_text())
    expected = json.loads(path.with_name(path.stem + ".expected.json").read_text())
    s = Scheduler(scenario)
    returned = s._handle_invalid_blocks(set(scenario["invalid_blocks"]), s.num_scheduled)
    for r in expected["requests"]:
        assert s.requests[r["id"]].num_computed_tokens == r["num_computed_tokens"], r["id"]
        assert s.kvsched_held(r["id"]) == bool(r["waits_for"]), r["id"]
    assert returned == set(expected["skip"]) | set(expected["failed"])
    assert s.failed_recving_kv_req_ids == set(expected["failed_recving"])
    assert s.kv_cache_manager.evicted == set(expected["evicted_blocks"])
    # The held sharers are not offered to vLLM's schedule; the rest are, in order.
    s.schedule()
    held = {r["id"] for r in expected["requests"] if r["waits_for"]}
    assert s.offered[-1] == [r.request_id for r in s.running if r.request_id not in held]


# --- vLLM's own single-group vectors (docs/rules.md, "Worked examples") ---------------------

FA16 = [CacheGroup("full_attention", 16)]


def three_requests(is_async: bool, invalid_idx: list[int]):
    """R1, R2, R3 with 99 loaded blocks each (ids 100r + i); async: P = 1584; sync: 16
    tokens scheduled and a 100th entry for them."""
    scheduled = 0 if is_async else 16
    reqs = [
        RequestState(
            f"R{r}", is_async, [[100 * r + i for i in range(99 + (0 if is_async else 1))]],
            1584 + scheduled, scheduled,
        )
        for r in (1, 2, 3)
    ]
    return reqs, [200 + i for i in invalid_idx]


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize(
    "idx,to,tokens", [([0, 98], 0, 1584), ([50, 98], 800, 784), ([98], 1568, 16)]
)
def test_vllm_vectors_99_loaded_blocks(is_async, idx, to, tokens):
    reqs, invalid = three_requests(is_async, idx)
    plan = plan_recovery(reqs, FA16, invalid, mode="vllm")
    assert plan.num_computed_tokens == {"R2": to}
    assert plan.affected_tokens == {"R2": tokens}
    assert (plan.failed_recving, plan.skip) == (({"R2"}, set()) if is_async else (set(), {"R2"}))
    assert plan.evict_blocks == []
    failed = plan_recovery(reqs, FA16, invalid, mode="vllm", policy="fail")
    assert failed.failed == {"R2"} and failed.num_computed_tokens == {"R2": to}
    if not is_async:
        # Under fail the sync request's entries from the boundary on are evicted.
        assert failed.evict_blocks == [200 + i for i in range(to // 16, 100)]


@pytest.mark.parametrize("s2", [1, 16])
@pytest.mark.parametrize(
    "invalid,r1_to,r1_tokens", [([0, 49], 0, 1584), ([25, 49], 400, 1184), ([49], 784, 800)]
)
def test_vllm_vectors_shared_prefix_sync(invalid, r1_to, r1_tokens, s2):
    c = list(range(1000, 1099))
    r1 = RequestState("R1", False, [c + [2000]], 1600, 16)
    r2 = RequestState("R2", False, [c[:50] + [3000]], 800 + s2, s2)
    ids = [c[i] for i in invalid]
    for mode in ("vllm", "safe"):
        plan = plan_recovery([r1, r2], FA16, ids, mode=mode)
        assert plan.num_computed_tokens == {"R1": r1_to, "R2": 800}
        assert plan.affected_tokens == {"R1": r1_tokens, "R2": s2}
        assert plan.skip == {"R1", "R2"}
        if mode == "vllm":
            assert plan.waits == {}
        else:
            # R2 waits for R1 on each reported block, until R1 has recomputed past it.
            assert [(w.block, w.owner, w.ready_at) for w in plan.waits["R2"]] == [
                (c[i], "R1", 16 * (i + 1)) for i in invalid
            ]


# --- mode safe's sharers across steps -----------------------------------------------------


def shared_prefix_scheduler(c=None):
    c = c if c is not None else list(range(1000, 1099))
    return Scheduler({
        "mode": "safe",
        "groups": [{"kind": "full_attention", "block_size": 16}],
        "requests": [
            {"id": "R1", "class": "sync", "num_computed_tokens": 1600, "num_scheduled_tokens": 16,
             "block_tables": [c + [2000]]},
            {"id": "R2", "class": "sync", "num_computed_tokens": 816, "num_scheduled_tokens": 16,
             "block_tables": [c[:50] + [3000]]},
        ],
        "invalid_blocks": [],
    }), c


def test_a_sharer_is_held_until_its_owner_recomputed_the_block():
    s, c = shared_prefix_scheduler()
    s._handle_invalid_blocks({c[25]}, s.num_scheduled)
    assert s.requests["R1"].num_computed_tokens == 400
    assert s.schedule() == ["R1"]
    s.requests["R1"].num_computed_tokens = 415  # mid-block: not rewritten yet
    assert s.schedule() == ["R1"]
    s.requests["R1"].num_computed_tokens = 416  # block 25 (tokens 400..416) rewritten
    assert s.schedule() == ["R1", "R2"]
    assert not s.kvsched_held("R2")
    assert [r.request_id for r in s.running] == ["R1", "R2"]


def test_an_owner_that_ends_first_hands_the_block_to_the_waiter():
    s, c = shared_prefix_scheduler()
    s._handle_invalid_blocks({c[25], c[40]}, s.num_scheduled)
    assert s.requests["R2"].num_computed_tokens == 800 and s.kvsched_held("R2")
    # R1 recomputed past block 25 but not 40, then finished.
    s.requests["R1"].num_computed_tokens = 500
    s.requests["R1"].status = FINISHED
    s.running.remove(s.requests["R1"])
    offered = s.schedule()
    # R2 now owns block 40: it rolled back to its boundary at or below 640 and runs.
    assert s.requests["R2"].num_computed_tokens == 640
    assert offered == ["R2"] and not s.kvsched_held("R2")


@pytest.mark.parametrize("ids", ["ascending", "descending"])
@pytest.mark.parametrize("owner_at,r2_at", [(300, 400), (500, 640), (700, 800)])
def test_an_owner_that_ends_first_hands_over_only_what_it_left_unwritten(ids, owner_at, r2_at):
    # Blocks 25 (tokens 400..416) and 40 (640..656) reported; R1 owns both and ends at
    # `owner_at`. R2 becomes the owner of every block R1 left unwritten and rolls back to the
    # earliest: whatever the order of the ids (a plan per block let the last one applied win).
    c = list(range(1000, 1099)) if ids == "ascending" else list(range(3000, 2901, -1))
    s, c = shared_prefix_scheduler(c)
    s._handle_invalid_blocks({c[25], c[40]}, s.num_scheduled)
    s.requests["R1"].num_computed_tokens = owner_at
    s.requests["R1"].status = FINISHED
    s.running.remove(s.requests["R1"])
    offered = s.schedule()
    assert s.requests["R2"].num_computed_tokens == r2_at
    assert offered == ["R2"] and not s.kvsched_held("R2")


class FreeingBase(BaseScheduler):
    """vLLM's `update_from_output` finishing R1 and freeing it (gone from `requests`)."""

    def update_from_output(self, scheduler_output, invalid_block_ids):
        r1 = self.requests.pop("R1")
        r1.status = FINISHED
        self.running.remove(r1)
        return set()


class FreeingScheduler(KvschedRecoveryMixin, FreeingBase):
    kvsched_mode = "safe"


def test_an_owner_that_rewrote_a_block_in_the_step_it_ends_hands_nothing_over():
    # The step that takes R1 past block 40 also finishes it, and vLLM frees it inside
    # `update_from_output`: the waits it satisfied are dropped before that, so R2 keeps its
    # place instead of rolling back for blocks already rewritten.
    base, c = shared_prefix_scheduler()
    s = FreeingScheduler.__new__(FreeingScheduler)
    s.__dict__.update(base.__dict__)
    s._handle_invalid_blocks({c[25], c[40]}, s.num_scheduled)
    s.requests["R1"].num_computed_tokens = 700  # vLLM counts the step's tokens at schedule
    s.update_from_output(SimpleNamespace(num_scheduled_tokens={}), set())
    assert s.schedule() == ["R2"]
    assert s.requests["R2"].num_computed_tokens == 800, "rolled back for rewritten blocks"
    assert not s.kvsched_held("R2")


class AdmittingBase(BaseScheduler):
    """vLLM's `schedule` admitting what stands in `waiting` (its load landed)."""

    admitted: list

    def schedule(self):
        self.admitted.extend(r.request_id for r in self.waiting)
        return super().schedule()


class AdmittingScheduler(KvschedRecoveryMixin, AdmittingBase):
    kvsched_mode = "safe"


def test_a_held_sharer_in_the_waiting_queue_is_not_admitted():
    # docs/rules.md's shared hybrid block: R1 and R2 are async, their loads share block 12
    # (group 1). R1 owns it; R2 waits. Both loads land, so vLLM would admit both from
    # `waiting`; R2 must stay out (and in the queue) until R1 has rewritten block 12.
    s = AdmittingScheduler({
        "mode": "safe",
        "groups": [{"kind": "full_attention", "block_size": 16}] * 2,
        "requests": [
            {"id": "R1", "class": "async", "num_computed_tokens": 48,
             "block_tables": [[1, 2, 3], [11, 12, 13]]},
            {"id": "R2", "class": "async", "num_computed_tokens": 48,
             "block_tables": [[21, 22, 23], [31, 12, 33]]},
        ],
        "invalid_blocks": [],
    })
    s.admitted = []
    s._handle_invalid_blocks({12}, {})
    assert s.kvsched_held("R2") and not s.kvsched_held("R1")
    s.schedule()
    assert s.admitted == ["R1"], "a held sharer was admitted from waiting"
    assert [r.request_id for r in s.waiting] == ["R1", "R2"], "the queue is as it was"
    s.requests["R1"].num_computed_tokens = 32  # block 12 (tokens 16..32) rewritten
    s.admitted.clear()
    s.schedule()
    assert s.admitted == ["R1", "R2"]


def test_vllms_default_mamba_cache_mode_names_no_mode_of_the_rules():
    from kvsched.vllm import groups_from_kv_cache_config

    cfg = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=MambaSpec(16, "none"))])
    assert groups_from_kv_cache_config(cfg, "all") == [CacheGroup("mamba", 16, mamba_mode="all")]
    cfg.kv_cache_groups[0].kv_cache_spec = MambaSpec(16, "align")
    assert groups_from_kv_cache_config(cfg, "all")[0].mamba_mode == "align"
    cfg.kv_cache_groups[0].kv_cache_spec = MambaSpec(16.5, "align")
    with pytest.raises(kvsched.ScenarioError) as e:
        groups_from_kv_cache_config(cfg)
    assert e.value.field == "kv_cache_groups[0].block_size"


def test_the_one_argument_signature_takes_the_scheduled_tokens_from_the_output():
    s, c = shared_prefix_scheduler()
    out = SimpleNamespace(num_scheduled_tokens=dict(s.num_scheduled))
    assert s.update_from_output(out, {c[25]}) == {"R1", "R2"}
    assert s.requests["R1"].num_computed_tokens == 400
    assert s.requests["R2"].num_computed_tokens == 800  # P = 816 - 16


@pytest.mark.parametrize("invalid_idx,to", [(0, 0), (50, 800), (98, 1568)])
def test_the_one_argument_signature_finds_a_loader_vllm_has_not_counted_yet(invalid_idx, to):
    # An older vLLM sets an async loader's `num_computed_tokens` only once its load lands:
    # until then it is 0, and the loader is taken at the tokens its table covers (99 blocks
    # of 16), as that vLLM scans it — at 0, a failed load would go unnoticed.
    scenario = {
        "groups": [{"kind": "full_attention", "block_size": 16}],
        "requests": [
            {"id": "R1", "class": "async", "num_computed_tokens": 0,
             "block_tables": [[100 + i for i in range(99)]]},
        ],
    }
    s = Scheduler(scenario)
    s.update_from_output(SimpleNamespace(num_scheduled_tokens={}), {100 + invalid_idx})
    assert s.failed_recving_kv_req_ids == {"R1"}
    assert s.requests["R1"].num_computed_tokens == to
    # Once in `failed_recving`, its computed length is vLLM's own.
    s.update_from_output(SimpleNamespace(num_scheduled_tokens={}), {100 + 98})
    assert s.requests["R1"].num_computed_tokens == to


def test_plan_errors_name_the_field():
    with pytest.raises(kvsched.ScenarioError) as e:
        plan_recovery([RequestState("a", False, [[1], [2]], 16)], FA16, [1])
    assert e.value.field == "requests[0].block_tables"
    with pytest.raises(ValueError) as e:
        plan_recovery([], FA16, [1], mode="fast")
    assert str(e.value).startswith("mode:")


@pytest.mark.parametrize("call,field", [
    (lambda: plan_recovery([], FA16, None), "invalid_blocks"),
    (lambda: plan_recovery([], FA16, [1, "x"]), "invalid_blocks[1]"),
    (lambda: plan_recovery([], FA16, [1, None]), "invalid_blocks[1]"),
    (lambda: plan_recovery([], FA16, [1], invalid_block_ids_by_group=[None]), "invalid_blocks_by_group[0]"),
    (lambda: plan_recovery([], None, [1]), "groups"),
    (lambda: plan_recovery([], {"a": 1}, [1]), "groups"),
    (lambda: plan_recovery([], [{"kind": "full_attention"}], [1]), "groups[0]"),
    (lambda: plan_recovery([{"request_id": "a"}], FA16, [1]), "requests[0]"),
    (lambda: plan_recovery([RequestState("a", False, None, 16)], FA16, [1]), "requests[0].block_tables"),
    (lambda: plan_recovery([RequestState("a", False, [7], 16)], FA16, [1]), "requests[0].block_tables[0]"),
    (lambda: plan_recovery([RequestState("a", False, [{1: 2}], 16)], FA16, [1]), "requests[0].block_tables[0]"),
    (lambda: plan_recovery([RequestState("a", None, [[1]], 16)], FA16, [1]), "requests[0].is_async"),
])
def test_bad_arguments_name_their_field(call, field):
    with pytest.raises(kvsched.ScenarioError) as e:
        call()
    assert e.value.field == field, e.value


def align_sharers() -> AdmittingScheduler:
    # R1 and R2 async, sharing group 1's block 12: a Mamba `align` state, the one after 32
    # tokens (entry 1). R1 owns it; R2 waits.
    s = AdmittingScheduler({
        "mode": "safe",
        "groups": [{"kind": "full_attention", "block_size": 16},
                   {"kind": "mamba", "block_size": 16, "mamba_mode": "align"}],
        "requests": [
            {"id": "R1", "class": "async", "num_computed_tokens": 48,
             "block_tables": [[1, 2, 3], [0, 12, 13]]},
            {"id": "R2", "class": "async", "num_computed_tokens": 48,
             "block_tables": [[21, 22, 23], [0, 12, 33]]},
        ],
        "invalid_blocks": [],
    })
    s.admitted = []
    s._handle_invalid_blocks({12}, {})
    assert s.kvsched_held("R2") and not s.kvsched_held("R1")
    waits = s._kvsched_holds().waiting()["R2"]
    assert [(w.block, w.ready_at, w.exact) for w in waits] == [(12, 32, True)]
    return s


def test_an_align_state_is_rewritten_only_by_a_step_ending_at_it():
    s = align_sharers()
    s.requests["R1"].num_computed_tokens = 32  # a step ended at 32: the state is written
    s.schedule()
    assert not s.kvsched_held("R2") and s.admitted == ["R1", "R2"]


def test_an_owner_past_an_align_state_it_never_ended_a_step_at_hands_it_over():
    # R1's recompute ran [0, 48) in one step: the state after 32 tokens was never written.
    # R2 must not resume from it: it takes the block over and rolls back below it.
    s = align_sharers()
    s.requests["R1"].num_computed_tokens = 48
    s.schedule()
    assert s.requests["R2"].num_computed_tokens < 32
    assert not s.kvsched_held("R2")
