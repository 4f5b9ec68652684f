"""Background loops of the node's parts (jobs, the placement controller): stopped the same way."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel background loops and wait for them (their last errors were logged by them)."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    tasks.clear()
