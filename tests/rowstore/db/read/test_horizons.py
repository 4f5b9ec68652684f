"""The retention horizon and the purge horizon (RFC 0003, "Retention"): a caller's ``as_of``
below ``now - retention`` is refused; a T another node chose (its read of the present) is
refused only below the purge horizon, which trails by ``purge_lag_ms`` — so with
``retention = 0s`` a read of the present across nodes is never refused as purged, and the
versions it needs are still there however merges and GC run meanwhile."""
import pytest

from rowstore.errors import HistoryPurgedError
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


async def _world():
    w = TablesWorld(2, retention_ms=0)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    return w, db


async def test_a_present_read_chosen_elsewhere_is_not_refused_with_retention_zero():
    w, db = await _world()
    await db.upsert("m", rows(range(20), v=1.0))
    T = db.timeline.closed  # another node's read of the present
    w.clock.advance(0.05)  # the request arrives 50 ms later
    got, _ = await db.query("m", as_of=T, trusted=True)
    assert got.num_rows == 20
    with pytest.raises(HistoryPurgedError):  # the same T from a caller: before the retention horizon
        await db.query("m", as_of=T)


async def test_the_versions_such_a_read_needs_outlive_merges_and_gc():
    w, db = await _world()
    await db.upsert("m", rows(range(20), v=1.0))
    T = db.timeline.closed
    await db.upsert("m", rows(range(20), v=2.0))  # supersedes every row just after T
    w.clock.advance(0.5)
    await db.seal()
    await db.checkpoint()
    await db.collect_garbage()
    got, _ = await db.query("m", as_of=T, trusted=True)
    assert got.column("v").to_pylist() == [1.0] * 20


async def test_past_the_purge_lag_a_trusted_read_is_refused_and_the_versions_go():
    w, db = await _world()
    await db.upsert("m", rows(range(20), v=1.0))
    T = db.timeline.closed
    await db.upsert("m", rows(range(20), v=2.0))
    w.clock.advance(db.cfg.purge_lag_ms / 1000 + 1)
    with pytest.raises(HistoryPurgedError):
        await db.query("m", as_of=T, trusted=True)
    await db.seal()
    await db.checkpoint()
    out = await db.collect_garbage()
    assert out["segments_collected"] >= 1  # the old versions are garbage now
    got, _ = await db.query("m")
    assert got.column("v").to_pylist() == [2.0] * 20
