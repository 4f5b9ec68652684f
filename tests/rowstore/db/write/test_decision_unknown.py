"""A node-local group's decision (``txn/X``) meets a catalog this node cannot reach for a while:
it waits for the catalog, and commits — it does not fail with the shares left prepared in their
segments, neither committed nor rolled back, where the next batch takes the localids a reader
of the file gives to committed rows (the simulation with per-node catalog faults found index
entries past a segment's end, and acknowledged rows lost: RFC 0010, "per-node catalog faults")."""
from catalog.abc import Put
from catalog.errors import CatalogTimeoutError, CatalogUnavailableError
from rowstore.db.write.two_phase import TXN_PREFIX
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


async def test_a_decision_the_catalog_cannot_take_yet_waits_and_commits():
    w = TablesWorld(partitions=4)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    txn, faults = w.cat.txn, [CatalogUnavailableError("no quorum"), CatalogTimeoutError("applied, answer lost")]

    async def decisions_fail(checks=(), ops=(), *, request_id=None):
        if faults and any(isinstance(o, Put) and o.key.startswith(TXN_PREFIX) for o in ops):
            f = faults.pop(0)
            if isinstance(f, CatalogTimeoutError):
                await txn(checks, ops, request_id=request_id)  # it landed; the answer did not
            raise f
        return await txn(checks, ops, request_id=request_id)
    w.cat.txn = decisions_fail
    first = rows(range(0, 40), v=1.0)  # every partition: one multi-partition group
    assert (await db.upsert("t", first)).commit_ts > 0 and not faults
    await db.upsert("t", rows(range(40, 80), v=2.0))
    await db.seal()
    await db.offload()  # readers of the files: a share left prepared would shift the next batch's rows
    for i in (0, 39, 40, 79):
        assert (await db.get("t", i))["v"] == (1.0 if i < 40 else 2.0)
    await db.close()
    db = await w.start()  # and from the objects and the logs after a restart
    got, _ = await db.query("t", limit=None)
    assert sorted(got.column("id").to_pylist()) == list(range(80))
    await db.close()
