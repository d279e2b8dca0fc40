"""The tier against a model of what it must do (hypothesis): random sequences of stores, loads,
damage and removals on the memory and disk tiers. A load succeeds exactly when every key is
held intact, then delivers the bytes stored under each key; a failed load leaves the slots of
bad chunks untouched; after a key's load failed, `lookup` never answers "present" for it until
it is stored again."""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.tier import KvschedTierManager, offload_key_bytes
from tier_caller import Caller, key, kv_buffer

BS, N, KEYS = 64, 6, 4

ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, KEYS - 1), st.integers(0, N - 1)),
        st.tuples(st.just("load"), st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=3, unique=True)),
        st.tuples(st.just("damage"), st.integers(0, KEYS - 1), st.integers(0, 48 + 32 + BS - 1)),
        st.tuples(st.just("remove"), st.integers(0, KEYS - 1)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["memory", "disk"]), ops)
def test_tier_follows_the_model(store, program):
    with tempfile.TemporaryDirectory() as d:
        _, view = kv_buffer(N, BS)
        kw = {"path": os.path.join(d, "t")} if store == "disk" else {}
        tier = KvschedTierManager(None, view, "kvsched", store=store, mac_key=bytes(32), threads=2, **kw)
        c = Caller(tier, view)
        held: dict[int, bytes] = {}  # key -> bytes stored, while intact
        broken: set[int] = set()  # damaged or removed behind the tier's back
        removed: set[int] = set()  # of those, removed (the store no longer holds them)
        failed: set[int] = set()  # a load of it failed since it was last stored
        for n, op in enumerate(program):
            if op[0] == "store":
                _, k, slot = op
                c.fill(slot, os.urandom(BS))
                data = c.slot(slot)
                was_known = k in held or k in broken
                assert c.store([key(k)], [slot])
                # Written, but for a key the tier holds already and has not failed, which is
                # skipped; the memory store is asked whether it still holds the key (it evicts
                # behind the index's back), so a key removed from it is written again.
                if not was_known or k in failed or (store == "memory" and k in removed):
                    held[k] = data
                    broken.discard(k)
                    removed.discard(k)
                    failed.discard(k)
            elif op[0] == "load":
                ks = op[1]
                slots = list(range(len(ks)))
                sentinel = bytes([n % 256]) * BS
                for s in slots:
                    c.fill(s, sentinel)
                ok = c.load([key(k) for k in ks], slots)
                expect_ok = all(k in held and k not in broken for k in ks)
                assert ok == expect_ok, (ks, held.keys(), broken)
                for k, s in zip(ks, slots):
                    if k in held and k not in broken:
                        if ok:
                            assert c.slot(s) == held[k]
                    else:
                        assert c.slot(s) == sentinel  # never wrong KV
                if not ok:
                    failed |= {k for k in ks if k not in held or k in broken}
            elif op[0] == "damage":
                _, k, at = op
                if k in held and k not in broken and tier._native.damage(offload_key_bytes(key(k)), at):
                    broken.add(k)
            else:
                _, k = op
                if k in held and k not in broken and tier._native.remove(offload_key_bytes(key(k))):
                    broken.add(k)
                    removed.add(k)
            for k in failed:
                assert c.lookup(key(k)) is False
        tier.shutdown()
