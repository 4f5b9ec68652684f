"""Hybrid logical clock: strictly increasing, across restarts and backward clock steps."""
import asyncio

import pytest

from catalog.memory import MemoryCatalog
from rowstore.errors import RowstoreError
from rowstore.hlc import LOGICAL_BITS, HybridClock, ms_of


class FakeTime:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self):
        return self.ms


async def test_increasing_within_a_millisecond_and_close_to_wall_time():
    cat, t = MemoryCatalog(), FakeTime(1_000_000)
    c = HybridClock(cat, "n1", t)
    await c.open()
    got = [await c.now() for _ in range(1000)]
    assert got == sorted(set(got))
    assert ms_of(got[0]) == 1_000_000 and got[-1] - got[0] == 999
    t.ms += 5
    assert ms_of(await c.now()) == 1_000_005


async def test_backward_step_and_restart_stay_monotonic():
    cat, t = MemoryCatalog(), FakeTime(5_000_000)
    c = HybridClock(cat, "n1", t)
    await c.open()
    a = await c.now()
    t.ms -= 60_000  # the clock jumps back a minute
    b = await c.now()
    assert b > a
    # restart with the clock still behind: start above the persisted mark
    c2 = HybridClock(cat, "n1", t)
    await c2.open()
    assert await c2.now() > b
    assert await c2.now() > (5_000_000 << LOGICAL_BITS)


async def test_concurrent_callers_never_share_a_timestamp():
    cat = MemoryCatalog()
    c = HybridClock(cat, "n1")
    await c.open()
    got = await asyncio.gather(*(c.now() for _ in range(2000)))
    assert len(set(got)) == 2000


async def test_observe_moves_forward_and_two_owners_conflict():
    cat, t = MemoryCatalog(), FakeTime(1000)
    c = HybridClock(cat, "n1", t)
    await c.open()
    c.observe((10_000 << LOGICAL_BITS) + 7)
    assert await c.now() == (10_000 << LOGICAL_BITS) + 8
    other = HybridClock(cat, "n1", t)
    await other.open()  # a second process claiming the same node id
    t.ms = 50_000
    with pytest.raises(RowstoreError, match="another node"):
        await c.now()
