"""The one place a database starts background work (rolls, merges, decisions, group
applies): every task is tracked, a failure is logged, and closing waits for all of them."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("rowstore.database")
T = TypeVar("T")


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._done)
        return t

    def _done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("event=background_failed error=%r", t.exception())

    def cancel_all(self) -> None:
        """Cancel every task (a test's power loss: the process's pending work dies with it)."""
        for t in list(self._tasks):
            t.cancel()

    async def drain(self) -> None:
        """Wait for every task started so far (their failures were logged already)."""
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
