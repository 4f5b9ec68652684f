"""node/tasks.py: a loop step that runs long says where it waits (``watched``), and is
cancelled with its loop."""
import asyncio
import logging

from node.tasks import watched


async def test_a_slow_step_logs_where_it_waits_and_returns_its_result(caplog):
    caplog.set_level(logging.WARNING, "t")
    gate = asyncio.Event()

    async def held_by_a_lock() -> int:
        await gate.wait()
        return 7

    async def step() -> int:
        return await held_by_a_lock()
    asyncio.get_running_loop().call_later(0.25, gate.set)
    assert await watched(step(), "tick", 0.1, logging.getLogger("t")) == 7
    slow = [m for m in caplog.messages if "event=step_slow step=tick" in m]
    assert slow and "step (" in slow[0] and "held_by_a_lock (" in slow[0] and "wait (" in slow[0], slow


async def test_cancelling_the_loop_cancels_the_step():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def step() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
    outer = asyncio.ensure_future(watched(step(), "tick", 0.05, logging.getLogger("t")))
    await started.wait()
    outer.cancel()
    await asyncio.gather(outer, return_exceptions=True)
    assert outer.cancelled() and cancelled.is_set()
