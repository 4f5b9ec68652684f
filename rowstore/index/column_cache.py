"""Column-index runs built in memory, kept least recently used first out within a byte budget
(a node's ``index.column_cache_bytes``): a partition names its runs when it opens and builds
one only when a read needs it, so a node's memory is bounded by its caches, not by its history
(docs/rfcs/0014-columnar-segments.md, "What is left").

Keyed by the run's object key, which names one file for ever (an inode is reused once its file
is deleted; its object key is not), so an entry left behind by a partition that moved away can
never answer for another file.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

DEFAULT_BYTES = 256 << 20


class RunCache:
    """Built runs by object key; ``budget`` bytes at most (one run larger than it is kept
    alone until the next one comes)."""

    def __init__(self, budget: int = DEFAULT_BYTES):
        self.budget = budget
        self._runs: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (run, bytes)
        self._loading: dict[str, asyncio.Future[Any]] = {}
        self.bytes = 0
        self.stats = {"hits": 0, "misses": 0, "evicted": 0}

    def peek(self, key: str) -> Any | None:
        got = self._runs.get(key)
        if got is None:
            return None
        self._runs.move_to_end(key)
        return got[0]

    async def get(self, key: str, build: Callable[[], Awaitable[tuple[Any, int]]]) -> Any:
        """The run of ``key``, built by ``build()`` (the run and its size in bytes) when it is
        not here; concurrent misses of one key build it once."""
        got = self.peek(key)
        if got is not None:
            self.stats["hits"] += 1
            return got
        fut = self._loading.get(key)
        if fut is not None:
            return await asyncio.shield(fut)
        self.stats["misses"] += 1
        fut = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        try:
            run, size = await build()
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: the waiters (if any) raise it
            raise
        finally:
            self._loading.pop(key, None)
        self.put(key, run, size)
        fut.set_result(run)
        return run

    def put(self, key: str, run: Any, size: int) -> None:
        old = self._runs.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._runs[key] = (run, size)
        self.bytes += size
        while self.bytes > self.budget and len(self._runs) > 1:
            _, (_, n) = self._runs.popitem(last=False)
            self.bytes -= n
            self.stats["evicted"] += 1

    def drop(self, key: str) -> None:
        old = self._runs.pop(key, None)
        if old is not None:
            self.bytes -= old[1]

    def __len__(self) -> int:
        return len(self._runs)


def nbytes(obj: Any, depth: int = 3) -> int:
    """About the memory a built structure holds: its arrays and bitmaps, a level or two down."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (pa.Array, pa.ChunkedArray)):
        return int(obj.nbytes)
    if isinstance(obj, BitMap64):
        return len(obj.serialize())
    if depth == 0:
        return 0
    if isinstance(obj, dict):
        return sum(nbytes(v, depth - 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v, depth - 1) for v in obj)
    if hasattr(obj, "__dict__"):
        return sum(nbytes(v, depth - 1) for v in vars(obj).values())
    return 0
