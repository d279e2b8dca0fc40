"""`kvsched.vllm`'s mixin over several steps of a simulated vLLM scheduler (`vllm_sim`): what
vLLM does around `_handle_invalid_blocks` — freeing a failed async loader's blocks when its
load lands, scheduling one step ahead (`AsyncScheduler`), bounding `running`, finished
statuses the mixin has no name for, chunked local attention's null blocks."""

from __future__ import annotations

import pytest

from kvsched.vllm import RequestState, groups_from_kv_cache_config, plan_recovery
from vllm_sim import ChunkedLocalAttentionSpec, FullAttentionSpec, Request, RequestStatus, Sim

from types import SimpleNamespace


def test_an_owner_whose_blocks_vllm_freed_hands_the_block_to_its_sharer():
    # R (sync) loaded 64 tokens this step, block b1 among them; A (async, its load in
    # flight) shares b1 from the prefix cache. b1's load failed: A owns it and rolls back to
    # 0, R waits for A to rewrite it (tokens 0..16). When A's load lands, vLLM frees a
    # failed loader at 0 tokens and gives it new blocks: A never rewrites b1. R must take
    # b1 over (and recompute it), never be released to read it.
    s = Sim()
    m = s.kv_cache_manager
    table = s.add(Request("R", 112, num_computed_tokens=80), 7)
    b1 = table[0]
    s.add(Request("A", 64, RequestStatus.WAITING_FOR_REMOTE_KVS, 48), 4, shared=[b1])
    m.content[b1] = "garbage"
    s.update_from_output(SimpleNamespace(num_scheduled_tokens={"R": 16}), {b1})
    assert s.requests["A"].num_computed_tokens == 0 and s.kvsched_held("R")
    s.finished_recving_kv_req_ids.add("A")
    for _ in range(6):
        s.update_from_output(s.schedule())
    assert b1 not in m.tables["A"], "the simulation frees A's blocks"
    assert s.garbage_reads == [], "a sharer read a block nobody rewrote"
    assert m.content[b1] == "ok", "b1 was never recomputed"
    assert not s.kvsched_held("R")


def test_under_async_scheduling_the_pre_step_length_leaves_out_the_step_scheduled_ahead():
    # O and S running, S on O's first two blocks. Step N: O 64 -> 80, S 32 -> 48. vLLM's
    # AsyncScheduler schedules step N+1 (O -> 96, S -> 64) before it hands step N's output,
    # reporting O's block 1, to `update_from_output`. S's hits are all old: it returns to its
    # pre-step length 32, not 48 (its tokens 32..48 attended to block 1), and waits for O.
    s = Sim()
    table = s.add(Request("O", 200, num_computed_tokens=64), 8)
    s.add(Request("S", 200, num_computed_tokens=32), 8, shared=table[:2])
    out_n = s.schedule()
    s.schedule()
    assert (s.requests["O"].num_computed_tokens, s.requests["S"].num_computed_tokens) == (96, 64)
    skip = s.update_from_output(out_n, {table[1]})
    assert s.requests["O"].num_computed_tokens == 16
    assert s.requests["S"].num_computed_tokens == 32
    assert skip == {"O", "S"}
    assert s.kvsched_held("S")


def test_under_the_synchronous_scheduler_nothing_is_ahead():
    s = Sim()
    table = s.add(Request("O", 200, num_computed_tokens=64), 8)
    s.add(Request("S", 200, num_computed_tokens=32), 8, shared=table[:2])
    s.update_from_output(s.schedule(), {table[1]})
    assert s.requests["O"].num_computed_tokens == 16
    assert s.requests["S"].num_computed_tokens == 32


def test_held_sharers_count_against_vllms_bound_on_running_requests():
    # max_num_seqs 2: O and S running, W waiting. S held out of `running` while vLLM's
    # `schedule` runs must not free its seat for W: once S is back, `running` would hold 3
    # and vLLM's next `schedule` would fail its assertion.
    s = Sim()
    s.max_num_running_reqs = 2
    table = s.add(Request("O", 400, num_computed_tokens=80), 25)
    s.add(Request("S", 400, num_computed_tokens=64), 25, shared=table[:3])
    s.add(Request("W", 64, RequestStatus.WAITING), 4)
    s.update_from_output(SimpleNamespace(num_scheduled_tokens={"O": 16, "S": 16}), {table[1]})
    assert s.kvsched_held("S")
    for _ in range(4):
        s.update_from_output(s.schedule())
        assert len(s.running) <= 2
    assert not s.kvsched_held("S")
    assert s.max_num_running_reqs == 2


@pytest.mark.parametrize(
    "status", [RequestStatus.FINISHED_REPETITION, RequestStatus.FINISHED_STOPPED], ids=lambda s: s.name
)
def test_an_owner_finished_with_any_finished_status_hands_the_block_over(status):
    # vLLM's rule: every status past PREEMPTED is finished, FINISHED_REPETITION included.
    # An owner finished before rewriting the block (its blocks kept a while, as a connector
    # delaying the free does) hands it to its sharer at once.
    s = Sim()
    table = s.add(Request("O", 128, num_computed_tokens=80), 8)
    s.add(Request("S", 128, num_computed_tokens=64), 8, shared=table[:3])
    s.update_from_output(SimpleNamespace(num_scheduled_tokens={"O": 16, "S": 16}), {table[1]})
    assert s.kvsched_held("S") and s.requests["S"].num_computed_tokens == 48
    o = s.requests["O"]
    o.status = status
    s.running.remove(o)
    out = s.schedule()
    assert not s.kvsched_held("S")
    assert out.num_scheduled_tokens == {"S": 16}
    assert s.requests["S"].num_computed_tokens == 32  # took block 1 over: from 16


def test_chunked_local_attention_is_a_window_of_its_chunk_and_its_null_blocks_are_legal():
    # Llama 4's chunked local attention layers: vLLM's ChunkedLocalAttentionSpec (no
    # `sliding_window`) puts the null block in the entries before the current chunk. Taken
    # for full attention, the rules refused that state (a ScenarioError inside
    # update_from_output); as a window of the chunk size it is legal, and resuming needs
    # no state the chunk's nulls lost.
    config = SimpleNamespace(kv_cache_groups=[
        SimpleNamespace(kv_cache_spec=FullAttentionSpec(16)),
        SimpleNamespace(kv_cache_spec=ChunkedLocalAttentionSpec(16, attention_chunk_size=32)),
    ])
    groups = groups_from_kv_cache_config(config)
    assert [(g.kind, g.window) for g in groups] == [("full_attention", None), ("sliding_window", 32)]
    r = RequestState("r", False, [[1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 15, 16, 17]], 112, 16)
    for mode in ("safe", "vllm"):
        plan = plan_recovery([r], groups, {5}, mode=mode)
        assert plan.skip == {"r"}
    # Mode safe: the chunk state before the hit at 64 is null: from 0.
    assert plan_recovery([r], groups, {5}).num_computed_tokens == {"r": 0}
    # A hit in the current chunk resumes at its start, the tokens the chunk needs being real.
    r2 = RequestState("r", False, [[1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 14, 15, 16, 17]], 112, 16)
    assert plan_recovery([r2], groups, {6}).num_computed_tokens == {"r": 80}
