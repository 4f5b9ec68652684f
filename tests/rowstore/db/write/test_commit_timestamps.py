"""Commit timestamps of local writes: every one a batch takes either ends or is held by the
batch's outcome — never left in flight, which would hold ``closed`` below it."""
from __future__ import annotations

import asyncio

from rowstore.errors import UnavailableError
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows



async def test_a_clock_failing_midway_through_a_batchs_timestamps_leaves_none_in_flight():
    """Coalesced requests take one timestamp each; the clock's mark fails to persist (the
    catalog) after the first. The batch fails whole and no timestamp stays in flight — before,
    the first did, ``closed`` stayed below it and no commit here was acknowledged again."""
    w = TablesWorld(partitions=1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(10)))
    clock, real = db.committer.timeline.clock, db.committer.timeline.clock.now
    calls = 0

    async def fails_second():
        nonlocal calls
        calls += 1
        if calls == 2:
            raise UnavailableError("the catalog did not answer")
        return await real()
    _, pieces, _ = await db.committer.split(d, rows(range(100, 104)).to_batches()[0], None)
    clock.now = fails_second
    (got,) = await db.write_pieces(d, pieces, [[2, 2]])
    clock.now = real
    assert isinstance(got, UnavailableError) and calls == 2
    assert db.committer.timeline.in_flight == 0
    res = await asyncio.wait_for(db.upsert("m", rows(range(20, 25))), 10)  # closed moves on
    assert await db.get("m", 20) is not None and await db.get("m", 100) is None
    assert res.commit_ts > 0
    await db.close()
