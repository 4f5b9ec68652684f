"""Background loops of the node's parts (jobs, the placement controller): stopped the same way."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel background loops and wait for them (their last errors were logged by them)."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    tasks.clear()


async def watched(step: Awaitable[T], what: str, slow_s: float, log: logging.Logger) -> T:
    """Await ``step`` as a task of its own and, while it runs past ``slow_s``, log where it
    waits (its chain of awaits) every ``slow_s``: a loop step stuck behind what it should fix
    says where, instead of going silent. Cancelling the caller cancels the step."""
    task = asyncio.ensure_future(step)
    t0 = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=slow_s)
            if done:
                return task.result()
            log.warning("event=step_slow step=%s seconds=%.1f waiting_in=%s", what, time.monotonic() - t0,
                        waiting_in(task))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)


def waiting_in(task: asyncio.Future[Any]) -> str:
    """Where a task's coroutine waits: ``function (file:line)`` down its chain of awaits."""
    out: list[str] = []
    coro: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    while coro is not None and len(out) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            out.append(repr(coro)[:80])
            break
        out.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(out) or "-"
