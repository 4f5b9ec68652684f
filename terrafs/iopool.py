"""Worker threads for blocking device writes and syncs, apart from asyncio's default executor.

An fdatasync holds its thread ~1 ms while using no CPU. In the default executor
(``min(32, cores + 4)`` threads: 6 on a 2-core machine) the flushes of a table's
partitions queued behind each other and behind CPU work such as encoding, so a
multi-partition commit waited for flushes one executor slot at a time. Device
I/O gets its own, wider pool; CPU work stays in the default one.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
IO_THREADS = 32
_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:  # created on first use: importing terrafs starts no threads
        _pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="terrafs-io")
    return _pool


async def run_io(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)`` in an I/O thread (for writes and syncs; reads stay in the default pool)."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args))
