"""The simulation's event loop (tests/sim/loop.py): thread-pool jobs run late complete out of
the order they were handed over, never while their process is stopped, never once it is
killed; without ``threads`` they run inline, in order."""
import asyncio
import random

from tests.sim.loop import SimLoop, in_process


def _run(loop: SimLoop, coro):
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_jobs_handed_over_in_one_order_complete_in_another():
    loop = SimLoop((1.0, random.Random(5)))
    done: list[int] = []

    async def job(i: int) -> None:
        await asyncio.to_thread(done.append, i)

    async def main() -> None:
        await asyncio.gather(*(job(i) for i in range(20)))
    _run(loop, main())
    assert sorted(done) == list(range(20)) and done != list(range(20))
    assert loop.late_jobs == 20


def test_without_threads_jobs_run_inline_in_order():
    loop = SimLoop()
    done: list[int] = []

    async def main() -> None:
        await asyncio.gather(*(asyncio.to_thread(done.append, i) for i in range(20)))
    _run(loop, main())
    assert done == list(range(20)) and loop.late_jobs == 0


def test_a_stopped_process_runs_no_job_and_a_killed_one_never_does():
    loop = SimLoop((1.0, random.Random(1)))
    ran: list[str] = []

    async def node(name: str) -> None:
        await asyncio.to_thread(ran.append, name)

    async def main() -> None:
        in_process("a", node("a"))
        in_process("b", node("b"))
        await asyncio.sleep(0)  # both handed their job over and wait for it
        assert loop.late_jobs == 2 and ran == []
        loop.pause("a")
        loop.kill("b")
        await asyncio.sleep(1)  # every job was due long ago
        assert ran == []
        loop.resume("a")
        await asyncio.sleep(0.1)
        assert ran == ["a"]
    _run(loop, main())
