"""Reads without a node: a read plan's segments read straight from object storage equal the
node's own answer at the same timestamp; the tail; the change feed; read leases."""
import pyarrow as pa
import pytest

from rowstore.errors import ConflictError, QueryError
from rowstore.reads.external import read_segment, schemas_lookup
from rowstore.reads.plan import ReadPlan
from rowstore.reads.predicates import parse_bbox, parse_where
from tests.rowstore.tables_world import rows
from tests.rowstore.db.test_database import make


async def plan_rows(db, plan: ReadPlan, where=None, bbox=None) -> pa.Table:
    target = plan.schema
    schemas = schemas_lookup(list(plan.versions))
    terms, box = parse_where(target, where), parse_bbox(target, bbox)
    out = []
    for s in plan.sealed:
        async for b in read_segment(plan.objects, s, schemas, target, terms, box, store=db.fs.objects):
            out.append(b)
    for p in plan.tail:
        out.extend((await db.tail(plan.table, p, plan.as_of, where, bbox)).to_batches())
    t = pa.Table.from_batches(out, schema=target.arrow()) if out else target.arrow().empty_table()
    return t.sort_by([(k, "ascending") for k in target.pk.names]) if t.num_rows else t


async def test_plan_equals_query_now_and_in_the_past():
    w, db = await make(partitions=3)
    r1 = await db.upsert("m", rows(range(0, 300)))
    await db.seal()
    await db.offload()
    await db.upsert("m", rows(range(100, 200), v=5.0))  # updates of offloaded rows, in the tail
    await db.delete("m", [1, 2, 150])
    await db.alter_table("m", lambda s: s.add_column("extra", "int32"))
    await db.upsert("m", pa.table({"id": pa.array([7, 400], pa.int64()), "extra": pa.array([1, 2], pa.int32())}))
    for T in (None, r1.commit_ts):
        for where, bbox in ((None, None), ([["v", "=", 5.0]], None),
                            (None, {"column": "loc", "xmin": 0, "ymin": 0, "xmax": 50, "ymax": 50})):
            plan = await db.read_plan("m", T, where=where, bbox=bbox)
            got = await plan_rows(db, plan, where, bbox)
            want, _ = await db.query("m", where=where, bbox=bbox, as_of=plan.as_of, limit=None)
            assert got.to_pylist() == want.to_pylist(), (T, where, bbox)
    plan = await db.read_plan("m", sealed_only=True)
    assert plan.tail == () and plan.sealed
    assert ReadPlan.from_json(plan.to_json()) == plan  # the JSON the bridge gets reads back the same


async def test_change_feed_in_commit_order():
    w, db = await make(partitions=2)
    r1 = await db.upsert("m", rows([1, 2, 3]))
    r2 = await db.delete("m", [2])
    await db.seal()
    await db.offload()
    r3 = await db.upsert("m", rows([2, 4], v=9.0))
    t, upto = await db.changes("m", r1.commit_ts - 1, r3.commit_ts)
    got = list(zip(t.column("id").to_pylist(), t.column("op").to_pylist(), t.column("commit_ts").to_pylist()))
    assert got == [(1, "upsert", r1.commit_ts), (2, "upsert", r1.commit_ts), (3, "upsert", r1.commit_ts),
                   (2, "delete", r2.commit_ts), (2, "upsert", r3.commit_ts), (4, "upsert", r3.commit_ts)]
    t, _ = await db.changes("m", r2.commit_ts, r3.commit_ts)
    assert t.column("id").to_pylist() == [2, 4]
    t, _ = await db.changes("m", r3.commit_ts, r3.commit_ts)
    assert t.num_rows == 0
    with pytest.raises(QueryError):
        await db.changes("m", -1)


async def test_leases():
    import asyncio
    w, db = await make(partitions=2)
    await db.upsert("m", rows(range(10)))
    plan = await db.read_plan("m")
    segs = {r.segid for _, r in await db.segment_records("m")}
    assert set(await db.leased_segments()) == segs
    await db.renew_lease(plan.lease, 30)
    await db.release_lease(plan.lease)
    assert await db.leased_segments() == set()
    short = await db.acquire_lease(sorted(segs), 0.001)
    await asyncio.sleep(0.01)
    assert await db.leased_segments() == set()  # expired: protects nothing
    with pytest.raises(ConflictError):
        await db.renew_lease(short, 10)  # the collector may already have acted on it


async def test_plans_of_one_request_id_share_one_lease():
    """A client that lost a plan's answer asks again with the same request id: the repeat gets
    the first plan's lease — extended, covering both plans' segments — and no second lease."""
    import json

    w, db = await make(partitions=2)
    await db.upsert("m", rows(range(10)))
    first = await db.read_plan("m", lease_s=5, request_id="plan-1")
    await db.seal()
    await db.upsert("m", rows(range(10, 20)))  # new segments the repeat's plan names too
    again = await db.read_plan("m", lease_s=60, request_id="plan-1")
    assert again.lease == first.lease
    (entry,) = await db.catalog.scan("lease/")
    d = json.loads(entry.value)
    assert set(d["segids"]) == {r.segid for _, r in await db.segment_records("m")}
    assert d["expires_ms"] >= db.clock.now_ms() + 50_000  # extended to the repeat's lease_s
    other = await db.read_plan("m", request_id="plan-2")
    assert other.lease != first.lease and len(await db.catalog.scan("lease/")) == 2
    await db.release_lease(first.lease)
    taken = await db.read_plan("m", request_id="plan-1")  # released meanwhile: taken anew
    assert taken.lease == first.lease and len(await db.catalog.scan("lease/")) == 2
