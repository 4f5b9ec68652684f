"""Block cache for sealed files: a small in-memory LRU over a larger one on the volatile device.

Memory holds decoded block bytes (the hot path of a cached read touches no
thread and no disk). The volatile device holds block records exactly as
stored in the object — still checksummed and, with a key, still encrypted —
so the cache disk never holds plaintext and a damaged cache entry is caught
by the block checksum and refetched. The volatile cache starts empty at open, in
a directory of its own: its contents are re-creatable and nothing on it is trusted
across restarts (what earlier runs left is deleted in the background).
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import logging
from collections import OrderedDict, deque
from itertools import compress
from typing import Generic, TypeVar

from terrafs.abc import BlockDevice
from terrafs.errors import NotFoundError

log = logging.getLogger("terrafs.cache")
CACHE_DIR = "cache"
SWEEP_BATCH = 4096  # old cache files deleted per worker-thread hop
Key = tuple[str, int]  # (object key, or an active file's name; block index)
V = TypeVar("V")


class _LRU(Generic[V]):
    """Byte-bounded LRU map of (value, size) pairs."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._d: OrderedDict[Key, tuple[V, int]] = OrderedDict()

    def get(self, key: Key) -> tuple[V, int] | None:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def get_many(self, keys: list[Key]) -> list[tuple[V, int] | None]:
        """``get`` of each key (iterating in C: a multi-row read asks for a block per row)."""
        vals = list(map(self._d.get, keys))
        deque(map(self._d.move_to_end, compress(keys, vals)), maxlen=0)
        return vals

    def put(self, key: Key, value: V, size: int) -> list[tuple[Key, V]]:
        """Insert; return the (key, value) pairs evicted to make room."""
        old = self._d.pop(key, None)
        if old is not None:
            self.used -= old[1]
        if size > self.capacity:
            return []
        self._d[key] = (value, size)
        self.used += size
        evicted = []
        while self.used > self.capacity:
            k, (v, s) = self._d.popitem(last=False)
            self.used -= s
            evicted.append((k, v))
        return evicted

    def pop(self, key: Key) -> None:
        old = self._d.pop(key, None)
        if old is not None:
            self.used -= old[1]

    def __len__(self) -> int:
        return len(self._d)


WRITE_BATCH = 64  # disk-tier records written per worker-thread hop
PENDING_BYTES = 32 << 20  # disk-tier records waiting for the writer, at most; beyond, not cached


class BlockCache:
    """Two-level cache keyed by ``(object key, block index)``."""

    def __init__(self, memory_bytes: int = 64 << 20, volatile: BlockDevice | None = None,
                 volatile_bytes: int = 1 << 30):
        self._mem: _LRU[bytes] = _LRU(memory_bytes)
        self._dev = volatile
        self._disk: _LRU[bool] = _LRU(volatile_bytes)  # what the device holds
        self._writes: set[asyncio.Task[None]] = set()
        self._pending: list[tuple[Key, bytes]] = []  # (key, record) waiting for the writer task
        self._pending_bytes = 0
        self._writer: asyncio.Task[None] | None = None
        self._gen = "0"  # this run's directory on the volatile device (``open``)
        self._sweeper: asyncio.Task[None] | None = None  # deleting what earlier runs left
        self.stats = {"mem_hits": 0, "disk_hits": 0, "misses": 0, "disk_bad": 0, "disk_skipped": 0}

    async def open(self, generation: str | None = None) -> None:
        """Start the volatile tier empty, under a directory of its own (``cache/<generation>/``,
        a name no earlier run used): nothing an earlier run left is trusted across restarts,
        and it is deleted in the background (``_sweep``) while the node serves. Deleting a full
        tier at open, tens of thousands of files whose pages were still being written back,
        took 3–19 s of a restart at 30–50M rows."""
        if self._dev is None:
            return
        self._gen = generation or secrets.token_hex(8)
        self._sweeper = asyncio.ensure_future(self._sweep(self._dev, f"{CACHE_DIR}/{self._gen}/"))

    async def _sweep(self, dev: BlockDevice, mine: str) -> None:
        """Delete every cache file not under ``mine``, ``SWEEP_BATCH`` per worker-thread hop."""
        try:
            old = [n for n in await dev.list(CACHE_DIR + "/") if not n.startswith(mine)]
            for i in range(0, len(old), SWEEP_BATCH):
                await dev.delete_files(old[i : i + SWEEP_BATCH])
            if old:
                log.info("event=cache_swept files=%d", len(old))
        except Exception as e:  # noqa: BLE001 - what is left is swept at the next open
            log.warning("event=cache_sweep_failed error=%r", e)

    async def close(self) -> None:
        """Stop sweeping (the next open sweeps what is left) and finish the pending writes."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.drain()

    def get_mem(self, key: Key) -> bytes | None:
        hit = self._mem.get(key)
        if hit is not None:
            self.stats["mem_hits"] += 1
            return hit[0]
        return None

    def get_mem_many(self, keys: list[Key]) -> dict[Key, bytes]:
        """``get_mem`` of many keys: {key: block} of those held."""
        got = {k: v[0] for k, v in zip(keys, self._mem.get_many(keys)) if v is not None}
        self.stats["mem_hits"] += len(got)
        return got

    def put_mem(self, key: Key, data: bytes) -> None:
        self._mem.put(key, data, len(data) + 64)

    def _name(self, key: Key) -> str:
        obj, idx = key
        return f"{CACHE_DIR}/{self._gen}/{hashlib.sha1(obj.encode()).hexdigest()[:20]}/{idx:08x}"

    async def get_disk(self, key: Key) -> bytes | None:
        """Stored record bytes from the volatile device, or None."""
        if self._dev is None or self._disk.get(key) is None:
            return None
        try:
            data = await self._dev.read_file(self._name(key))
        except NotFoundError:
            self._disk.pop(key)
            return None
        self.stats["disk_hits"] += 1
        return data

    async def get_disk_many(self, keys: list[Key]) -> dict[Key, bytes]:
        """``get_disk`` of many keys with one device call: {key: stored record} of those held."""
        held = [k for k in keys if self._disk.get(k) is not None] if self._dev is not None else []
        if not held:
            return {}
        assert self._dev is not None  # held is empty without a device
        got: dict[Key, bytes] = {}
        for key, data in zip(held, await self._dev.read_files([self._name(k) for k in held])):
            if data is None:
                self._disk.pop(key)
            else:
                got[key] = data
        self.stats["disk_hits"] += len(got)
        return got

    def put_disk(self, key: Key, record: bytes) -> None:
        """Write a stored record to the volatile device in the background: records queue up
        and one task writes them in batches (a full scan of a cold object fetches thousands
        of blocks; a task and five thread hops each filled the worker pool that requests use).
        A read faster than the device leaves the records past ``PENDING_BYTES`` uncached: what
        waits is memory, and a cache must not hold a whole cold scan in it."""
        if self._dev is None:
            return
        if self._pending_bytes + len(record) > PENDING_BYTES:
            self.stats["disk_skipped"] += 1
            return
        self._pending.append((key, record))
        self._pending_bytes += len(record)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_pending())
            self._writes.add(self._writer)
            self._writer.add_done_callback(self._writes.discard)

    async def _write_pending(self) -> None:
        dev = self._dev
        try:
            assert dev is not None  # put_disk starts the writer only with a device
            while self._pending:
                batch, self._pending = self._pending[:WRITE_BATCH], self._pending[WRITE_BATCH:]
                self._pending_bytes -= sum(len(r) for _, r in batch)
                try:
                    await dev.write_files([(self._name(k), r) for k, r in batch])
                except Exception as e:  # noqa: BLE001 - a cache write failure only costs a refetch
                    log.warning("event=cache_write_failed blocks=%d first=%s error=%r", len(batch), batch[0][0], e)
                    continue
                for key, record in batch:
                    for k, _ in self._disk.put(key, True, len(record)):
                        await self._evict(dev, k)
        finally:
            self._writer = None

    async def _evict(self, dev: BlockDevice, key: Key) -> None:
        try:
            await dev.delete(self._name(key))
        except NotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - a stale file of a volatile cache costs only space
            log.warning("event=cache_evict_failed key=%s error=%r", key, e)

    def drop(self, key: Key) -> None:
        """Forget a damaged entry so the next read refetches it."""
        self.stats["disk_bad"] += 1
        self._disk.pop(key)
        self._mem.pop(key)

    def forget_object(self, obj: str) -> None:
        """Drop in-memory entries of a deleted object (disk entries age out)."""
        for k in [k for k in self._mem._d if k[0] == obj]:
            self._mem.pop(k)

    async def drain(self) -> None:
        """Wait for background cache writes (tests, shutdown)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def hit_ratio(self) -> float:
        s = self.stats
        total = s["mem_hits"] + s["disk_hits"] + s["misses"]
        return (s["mem_hits"] + s["disk_hits"]) / total if total else 0.0
