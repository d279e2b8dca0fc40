"""A vLLM secondary tier on kvsched's stores, importable without vLLM.

vLLM's multi-tier KV offloading keeps a CPU (primary) tier and lets out-of-tree tiers plug in
below it: a ``SecondaryTierManager`` loaded by module path, given a memoryview of the primary
tier's host KV buffer, asked to ``lookup`` keys and to ``submit_store`` / ``submit_load`` jobs
between that buffer and its own store, and polled with ``get_finished``. Every method runs in
the scheduler process and must not block.

:class:`KvschedTierManager` is that tier on kvsched's tiers: ``store="memory"`` (in-process,
bounded, LRU), ``"disk"`` (each batch of chunks in one pack file, bounded, crash-safe) or
``"redis"`` (a Redis server or Redis Cluster, ``url="redis://…"``, ``rediss://`` for TLS).
Each block is stored as a chunk of kvsched's chunk format (``docs/kv-format.md``): a header naming the key, an xxh3
checksum and, with ``mac_key`` (32 bytes, shared by every engine on the store), a keyed BLAKE3
MAC. Every load checks them, so a damaged, forged or evicted chunk makes the job fail (vLLM
recomputes the blocks), never delivers wrong KV, and the tier stops answering "present" for a
chunk it failed to load (vLLM #49328): a key whose load failed, for whatever reason (a chunk
failing a check, a value the store no longer holds or holds but cannot hand back, a store call
that failed), is answered ``False`` and never asked of the store again until this tier stores
it again (vLLM recomputes it once and stores it, overwriting the bad value). Copies, checksums
and tier I/O run on kvsched's threads, outside the GIL; the methods only enqueue and drain.

Any thread may call any method at any time, ``shutdown`` included: calls during or after a
shutdown return, jobs submitted then fail at once and ``lookup`` answers ``False``. A tier is used in the process that
created it: after ``os.fork()`` the child has none of its threads, so in the child every store
and load fails at once, ``lookup`` answers ``False``, and ``shutdown`` (or dropping the tier)
does nothing; create the tier after the fork to use it in the child (fork while the parent's
tiers are idle, or use the ``spawn`` start method: a worker inside a store call at the fork
may be waiting on a lock the child inherits a record of).

When vLLM is installed, the class subclasses vLLM's ``SecondaryTierManager`` and returns its
``JobResult``; without vLLM it stands alone with the same methods and a ``JobResult`` of the
same fields.
"""

from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from kvsched import _native
from kvsched._args import unordered

try:  # vLLM's interface when it is installed (it never is in kvsched's own tests)
    from vllm.v1.kv_offload.tiering.base import JobResult as _VllmJobResult
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object
    _VllmJobResult = None

__all__ = ["KvschedTierManager", "JobResult", "offload_key_bytes", "register", "TIER_TYPE"]

#: The tier type :func:`register` registers with vLLM.
TIER_TYPE = "kvsched"

if _VllmJobResult is None:

    @dataclass
    class JobResult:
        """Result of a transfer job, as vLLM's ``JobResult``: its id and whether it succeeded."""

        job_id: int
        success: bool

else:  # pragma: no cover
    JobResult = _VllmJobResult


def offload_key_bytes(key: Any) -> bytes:
    """The bytes naming an ``OffloadKey``: vLLM's keys are bytes (the block hash and the group
    index); ints and strings are accepted for stand-ins and other engines. A key's type is
    part of its name — a first byte ``b``, ``i`` or ``s``, then the bytes, the integer's
    signed little-endian bytes or the text's UTF-8 — so ``1``, ``"1"`` and ``b"1"`` are three
    keys, and no int or str names the block of a bytes key (on a store shared by engines
    that key their blocks differently, one would otherwise load another's bytes). A ``bool``
    is no int key (``True`` would name block ``1``): a ``TypeError``, as for ``job_id`` and
    ``block_ids``."""
    if isinstance(key, bool):
        raise TypeError("key: expected bytes, int or str, got bool")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return b"b" + bytes(key)
    if isinstance(key, int):
        return b"i" + key.to_bytes((key.bit_length() + 8) // 8 or 1, "little", signed=True)
    if isinstance(key, str):
        try:
            return b"s" + key.encode()
        except UnicodeEncodeError as e:
            raise ValueError(
                f"key: not valid Unicode text (a lone surrogate at character {e.start})"
            ) from None
    raise TypeError(f"key: expected bytes, int or str, got {type(key).__name__}")


def _timeout(value: Any) -> float:
    """``drain_jobs``'s timeout as a float: a ``TypeError`` for what is no real number
    (``bool`` included), a ``ValueError`` for NaN, each naming ``timeout``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"timeout: expected a number of seconds, not {type(value).__name__}")
    try:
        t = float(value)
    except OverflowError:  # an int past a float's range: too large to count
        return float("inf")
    if t != t:
        raise ValueError("timeout: NaN is not a number of seconds")
    return t


def _mac_key(value: Any) -> bytes | None:
    """A MAC key given as 32 bytes or 64 hex digits (config files hold text), or the name of
    an environment variable holding the hex (``env:NAME``)."""
    if value is None:
        return None
    if isinstance(value, str) and value.startswith("env:"):
        name = value[4:]
        try:
            value = os.environ[name]
        except KeyError:
            raise ValueError(f"mac_key: environment variable {name} is not set") from None
        except UnicodeEncodeError as e:  # no environment variable can have this name
            raise ValueError(
                f"mac_key: env:NAME holds no valid variable name (a lone surrogate at "
                f"character {e.start + 4})"
            ) from None
    if isinstance(value, str):
        try:
            value = bytes.fromhex(value)
        except ValueError:
            raise ValueError("mac_key: expected 64 hex digits") from None
    # Only bytes-like values: ``bytes(32)`` of an int is 32 zero bytes, a key anyone can guess.
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"mac_key: expected 32 bytes, 64 hex digits or env:NAME, not {type(value).__name__}"
        )
    return bytes(value)


_U64_MAX = (1 << 64) - 1


def _view(value: Any, num_blocks: Any) -> tuple[memoryview, int]:
    """``primary_kv_view`` as a flat byte view and its number of blocks, each problem a
    ``TypeError`` or ``ValueError`` naming the argument."""
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(
            f"primary_kv_view: expected a buffer (memoryview, bytearray, array, tensor), "
            f"not {type(value).__name__}"
        ) from None
    except (ValueError, BufferError) as e:  # a closed mmap, a released memoryview
        raise ValueError(f"primary_kv_view: cannot be read: {e}") from None
    if not view.c_contiguous:
        raise ValueError(f"primary_kv_view: must be C-contiguous (shape {view.shape})")
    if view.nbytes == 0:
        raise ValueError(f"primary_kv_view: is empty (shape {view.shape})")
    if num_blocks is None:
        if view.ndim < 2:
            raise ValueError("num_blocks: required for a 1-D primary_kv_view")
        num_blocks = view.shape[0]
    num_blocks = _uint("num_blocks", num_blocks)
    if view.ndim >= 2 and num_blocks != view.shape[0]:
        raise ValueError(
            f"num_blocks: {num_blocks} contradicts the primary_kv_view's first dimension "
            f"({view.shape[0]} blocks)"
        )
    flat = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    return flat, num_blocks


def _utf8(field: str, value: str) -> str:
    """``value`` if it is valid Unicode text (UTF-8 can encode it), else a ``ValueError``
    naming ``field``: a lone surrogate (``"\\udcff"``, what ``os.fsdecode`` makes of a byte
    that is no UTF-8) is no text the native side can take."""
    try:
        value.encode()
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{field}: not valid Unicode text (a lone surrogate at character {e.start})"
        ) from None
    return value


def _text(field: str, value: Any) -> str | None:
    """An optional ``str`` argument of valid Unicode text: a ``TypeError`` naming ``field`` for
    anything else, a ``ValueError`` for a ``str`` holding a lone surrogate."""
    if value is None:
        return value
    if isinstance(value, str):
        return _utf8(field, value)
    raise TypeError(f"{field}: expected a str, not {type(value).__name__}")


def _tier_type(value: Any) -> str:
    """The ``tier_type`` argument: a non-empty ``str`` (the name vLLM registered the class
    under), a ``TypeError`` or ``ValueError`` naming it for anything else."""
    if not isinstance(value, str):
        raise TypeError(f"tier_type: expected a str, not {type(value).__name__}")
    if not value:
        raise ValueError("tier_type: must be a non-empty str")
    return str.__str__(value)


def _store(value: Any) -> str:
    """The ``store`` argument: a ``str``, a ``TypeError`` naming it for anything else (a
    ``ValueError`` for a lone surrogate: no store's name)."""
    if isinstance(value, str):
        return _utf8("store", value)
    raise TypeError(
        f'store: expected "memory", "disk" or "redis", not {type(value).__name__}'
    )


def _path(value: Any) -> str | None:
    """The disk tier's directory: a ``str``, ``bytes`` or path-like object, as ``os.fsdecode``
    gives it (the native side encodes it back with ``os.fsencode``'s rules, so a name that is
    no UTF-8, such as ``b"kv-\\xff"``, names that very directory). A ``str`` the file system's
    encoding cannot encode (a lone surrogate such as ``"\\ud800"``) names no file: a
    ``ValueError`` naming ``path``."""
    if value is None:
        return None
    try:
        path = os.fsdecode(os.fspath(value))
    except TypeError:
        raise TypeError(
            f"path: expected a str, bytes or os.PathLike, not {type(value).__name__}"
        ) from None
    try:
        os.fsencode(path)
    except UnicodeEncodeError as e:
        raise ValueError(
            f"path: not a file name (character {e.start} cannot be encoded as "
            f"{sys.getfilesystemencoding()})"
        ) from None
    return path


def _seq(field: str, value: Any) -> list[Any]:
    """A job's ``keys`` or ``block_ids`` as a list (a numpy or torch array through
    ``tolist``), a ``TypeError`` naming ``field`` for what is no sequence. An unordered
    collection (a set, a dict or a dict's view) is refused: keys are paired with slots by
    position, and a set's order is its hash order, so a store would save a block under
    another block's key."""
    # Bytes in any form are one key's bytes, not a sequence: a memoryview's ``tolist`` would
    # make each byte a key (or a block id).
    if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray, memoryview, str)):
        value = value.tolist()
    if (
        isinstance(value, (bytes, bytearray, memoryview, str))
        or unordered(value)
        or not isinstance(value, Iterable)
    ):
        raise TypeError(f"{field}: expected a sequence, not {type(value).__name__}")
    return list(value)


def _keys(value: Any) -> list[Any]:
    """A job's ``keys`` as a list: vLLM types them ``Collection[OffloadKey]``, so besides a
    sequence any collection is taken — a set, a frozenset, a dict's keys — in its iteration
    order, which is the order vLLM pairs them with ``block_ids`` in (it builds the slots by
    iterating the same collection, in the same process, unchanged meanwhile). ``block_ids``
    stay a sequence or array: slots given unordered pair with nothing. One key's bytes (a
    ``bytes``, ``str``) or what is no collection is a ``TypeError`` naming ``keys``."""
    if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray, memoryview, str)):
        value = value.tolist()
    if isinstance(value, (bytes, bytearray, memoryview, str)) or not isinstance(value, Iterable):
        raise TypeError(f"keys: expected a collection of keys, not {type(value).__name__}")
    return list(value)


def _uint(field: str, value: Any, most: int = _U64_MAX) -> int:
    """``value`` as a whole number in ``0..=most``: a ``TypeError`` for anything but an integer
    (``bool`` and floats included: 1.7 is no block id), a ``ValueError`` out of range, each
    naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{field}: expected a whole number, not {type(value).__name__}")
    v = int(value)
    if not 0 <= v <= most:
        raise ValueError(f"{field}: {v} is outside 0..={most}")
    return v


class KvschedTierManager(_Base):  # type: ignore[misc,valid-type]
    """vLLM's ``SecondaryTierManager`` on a kvsched tier.

    Args:
        offloading_spec: vLLM's offloading configuration (kept, not read); vLLM versions
            that pass ``vllm_config=`` instead are served the same.
        primary_kv_view: memoryview of the primary tier's host KV buffer (writable,
            C-contiguous, not empty); its first dimension is the number of blocks (a 1-D
            buffer needs ``num_blocks``).
        tier_type: the tier type vLLM registered this class under: a non-empty ``str``
            (``"kvsched"`` by default).
        store: ``"memory"``, ``"disk"`` or ``"redis"``.
        capacity_bytes: bound of a memory or disk tier (default 1 GiB; at least one block as
            a chunk, a disk tier's in its pack file: a smaller one is a ``ValueError``).
        path: the disk tier's directory (``str``, ``bytes`` or path-like; a name that is no
            UTF-8, such as ``b"/kv-\\xff"``, is that directory; a ``str`` with a character
            the file system cannot encode, a lone surrogate, is a ``ValueError``).
        url: the Redis tier's URL (``redis://host:port``, ``rediss://``, a cluster's seeds as
            ``redis://h1:p1,h2:p2`` or ``?cluster=yes``; see ``docs/kv.md``): valid Unicode
            text, a ``str`` with a lone surrogate being a ``ValueError``.
        mac_key: 32 bytes, 64 hex digits, or ``env:NAME``; every engine on a shared store must
            use the same one. Without it chunks are checked by checksum only.
        threads: the tier's worker threads, 1 to 256.
        tag: a layout tag hashed into every key: engines with different models or layouts on
            one store must use different tags.
        probe: ask the store about keys this tier did not write (default: for disk and Redis,
            which other engines may share); such a lookup answers ``None`` (retry) once. At
            most 1024 probes are queued or running: while that many are, a lookup of an
            unknown key answers ``False`` (a miss) and starts none, so the memory of lookups
            faster than the store answers stays bounded.
        num_blocks: the number of blocks of a 1-D ``primary_kv_view`` (of a view of more
            dimensions it must equal the first).

    Each key set of the tier's index (keys known present, failed, absent) holds at most as
    many keys as ``capacity_bytes`` holds chunks (at least 1024; the absent set at most 65536),
    the oldest dropped first: a
    dropped key is asked of the store again (shared stores) or answered ``False`` (memory).
    A store job hands the store its chunks in batches of about 4 MiB, and a load job asks for
    them in batches of at most 4 MiB (at least one chunk), so the memory of either beyond the
    buffer is bounded whatever its length.
    """

    def __init__(
        self,
        offloading_spec: Any = None,
        primary_kv_view: memoryview | None = None,
        tier_type: str = TIER_TYPE,
        *,
        vllm_config: Any = None,
        store: str = "memory",
        capacity_bytes: int = 1 << 30,
        path: str | None = None,
        url: str | None = None,
        mac_key: Any = None,
        threads: int = 4,
        tag: int = 0,
        probe: bool | None = None,
        num_blocks: int | None = None,
    ) -> None:
        if primary_kv_view is None:
            raise ValueError("primary_kv_view: required")
        tier_type = _tier_type(tier_type)
        if _Base is not object:  # pragma: no cover - with vLLM installed
            try:  # vLLM versions differ in what the base takes
                super().__init__(offloading_spec, primary_kv_view, tier_type)
            except TypeError:
                pass
        self._offloading_spec = offloading_spec if offloading_spec is not None else vllm_config
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        flat, num_blocks = _view(primary_kv_view, num_blocks)
        capacity_bytes = _uint("capacity_bytes", capacity_bytes)
        threads = _uint("threads", threads)
        if not 1 <= threads <= 256:
            raise ValueError(f"threads: must be 1 to 256, got {threads}")
        tag = _uint("tag", tag)
        if probe is not None and not isinstance(probe, bool):
            raise TypeError(f"probe: expected a bool or None, not {type(probe).__name__}")
        self._native = _native.NativeTier(
            flat,
            num_blocks,
            _store(store),
            capacity_bytes=capacity_bytes,
            path=_path(path),
            url=_text("url", url),
            mac_key=_mac_key(mac_key),
            threads=threads,
            tag=tag,
            probe=probe,
        )

    # --- vLLM's SecondaryTierManager ------------------------------------------------------

    def lookup(self, key: Any, req_context: Any = None) -> bool | None:
        """``True`` present and ready, ``False`` not here, ``None`` being transferred (or being
        asked of a shared store): retry later. A memory tier answers from what its store holds
        now; a disk or Redis tier from what it stored, loaded or probed, so a chunk another
        engine deleted or the store evicted is promised until a load of it fails (the job
        fails, never lands wrong KV), then answered ``False``. An unknown key while 1024 probes are in flight
        is ``False``: a lookup is a hint, never a wait. A ``str`` key that is no valid Unicode
        text (a lone surrogate) is a ``ValueError`` naming ``key``."""
        return self._native.lookup(offload_key_bytes(key))

    def submit_store(self, job_metadata: Any) -> None:
        """Enqueues a store of the job's primary-tier slots; keys already stored are skipped."""
        job_id, keys, blocks = self._job(job_metadata)
        self._native.submit_store(job_id, keys, blocks)

    def submit_load(self, job_metadata: Any) -> None:
        """Enqueues a load into the job's primary-tier slots; the job fails unless every chunk
        is present and passes its checks. A slot named twice for two keys is a ``ValueError``
        naming ``block_ids`` (both keys' bytes cannot land in it)."""
        job_id, keys, blocks = self._job(job_metadata)
        if len(set(blocks)) != len(blocks):
            into: dict[int, bytes] = {}
            for k, b in zip(keys, blocks):
                if into.setdefault(b, k) != k:
                    raise ValueError(
                        f"block_ids: slot {b} appears twice in a load, for two keys (each "
                        "slot takes one key's bytes)"
                    )
        self._native.submit_load(job_id, keys, blocks)

    def get_finished(self) -> Iterable[JobResult]:
        """The jobs (stores and loads) finished since the last call."""
        return [JobResult(job_id=j, success=ok) for j, ok in self._native.get_finished()]

    # Newer vLLM spells it this way.
    get_finished_jobs = get_finished

    @staticmethod
    def get_tier_type() -> str:
        """The tier type :func:`register` registers this class under (vLLM versions that
        declare it abstract ask the class)."""
        return TIER_TYPE

    def touch(self, keys: Collection[Any], req_context: Any = None) -> None:
        """Recency for eviction: kvsched's tiers track their own (LRU on reads), so the keys
        are not read; what is no collection of keys is a ``TypeError`` naming ``keys``."""
        if isinstance(keys, (str, bytes, bytearray, memoryview)) or not isinstance(keys, Iterable):
            raise TypeError(f"keys: expected a collection of keys, not {type(keys).__name__}")
        return None

    def request_finished(self, req_context: Any) -> None:
        return None

    def drain_jobs(self, timeout: float | None = None) -> bool:
        """Waits (GIL released) until no job is queued or running, at most ``timeout`` seconds
        (``None``, the default, or one too large to count, such as ``float("inf")``: without
        limit; 0 or less: not at all); whether that happened. vLLM's ``reset_cache`` calls it
        with no argument and needs it to return only once no transfer touches the primary
        buffer: without a timeout it returns ``True``, then, every time (a job's wait is
        bounded by the store's call timeout, Redis's ``timeout_ms``). Signals are handled while it waits: a ``KeyboardInterrupt``
        (or what a signal handler raises) interrupts it within about 50 ms, the jobs going on.
        A timeout that is no number is a ``TypeError``, NaN a ``ValueError``, each naming
        ``timeout``."""
        return self._native.wait_idle(float("inf") if timeout is None else _timeout(timeout))

    def shutdown(self) -> None:
        """Stops the tier's threads and waits for them (GIL released): queued jobs fail
        without running (``get_finished`` reports them, as every job), running loads and
        probes cancelled, a running store stops at its next batch
        of about 4 MiB (a batch already handed to the store is bounded by the store's call
        timeout: Redis's ``timeout_ms``, 2 s by default; memory and disk puts do not wait on a
        network). Idempotent; calls from other threads meanwhile and after return normally,
        their jobs failing at once. Dropping the tier does the same. In a forked child it joins
        nothing.

        Once the threads are joined the tier lets go of ``primary_kv_view`` (its export of the
        buffer and its own views), so the primary tier may release its view and close the
        memory behind it (vLLM shuts the secondary tiers down first, then the primary, which
        closes its ``mmap``)."""
        self._native.shutdown()
        self._primary_kv_view = None

    # --- kvsched's own -------------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        return self._native.block_bytes

    def stats(self) -> dict[str, int]:
        """Blocks stored and loaded, failed stores and loads; the chunks loads could not
        deliver, by why: ``missing_chunks`` (not held), ``bad_chunks`` (failing a check),
        ``unreadable_chunks`` (asked in a store call that failed as a whole); probes; the keys
        the index holds as present, failed and absent."""
        return self._native.stats()

    def _job(self, job_metadata: Any) -> tuple[int, list[bytes], list[int]]:
        try:
            job_id, raw_keys, raw_ids = (
                job_metadata.job_id,
                job_metadata.keys,
                job_metadata.block_ids,
            )
        except AttributeError:
            raise TypeError(
                "job_metadata: expected a JobMetadata (job_id, keys, block_ids), not "
                f"{type(job_metadata).__name__}"
            ) from None
        job_id = _uint("job_id", job_id)
        keys = [offload_key_bytes(k) for k in _keys(raw_keys)]
        ids = _seq("block_ids", raw_ids)
        blocks = [_uint(f"block_ids[{i}]", b) for i, b in enumerate(ids)]
        return job_id, keys, blocks


def register() -> None:
    """Registers :class:`KvschedTierManager` with vLLM's secondary-tier factory as tier type
    ``"kvsched"`` (a no-op without vLLM, or when already registered). The package declares it
    as a vLLM general plugin (entry point ``vllm.general_plugins``), so an installed kvsched is
    registered in every vLLM process; a tier entry ``{"type": "kvsched", ...}`` then selects
    it, its other keys being this class's keyword arguments."""
    try:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    except ImportError:
        return
    try:  # pragma: no cover - with vLLM installed
        SecondaryTierFactory.register_tier(TIER_TYPE, __name__, "KvschedTierManager")
    except ValueError:  # pragma: no cover
        pass
