"""Copy-forward garbage collection (docs/rfcs/0009-gc.md): liveness, copies with new rowids,
both indexes repointed, retire/grace/lease/delete, dropped tables, crashes at every step."""
import numpy as np
import pyarrow as pa
import pytest

from rowstore.db.background.gc import GcConfig
from rowstore.segments.store import SegState
from terrafs.failpoints import FailPointCrash, armed
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows

BOX = {"column": "loc", "xmin": 20, "ymin": 10, "xmax": 70, "ymax": 60}


async def make(partitions=2, cluster_by=None, grace_s=0.0, min_garbage=0.5, **cfg):
    # no history kept at all: every superseded version is garbage at once
    w = TablesWorld(partitions, retention_ms=0, purge_lag_ms=0,
                    gc=GcConfig(min_garbage=min_garbage, grace_s=grace_s), **cfg)
    db = await w.start()
    await db.create_table("m", SCHEMA, indexes=["loc", "name"], cluster_by=cluster_by)
    return w, db


async def churn(db, model: dict, rounds=3, n=400, seed=0):
    """Rows 0..n, then rounds that overwrite and delete random keys; each round sealed and
    offloaded. ``model``: key -> v."""
    rng = np.random.default_rng(seed)
    t = rows(range(n), seed=seed)
    await db.upsert("m", t)
    model.update(zip(range(n), t.column("v").to_pylist()))
    await db.seal()
    for r in range(rounds):
        keys = np.sort(rng.choice(n, n * 6 // 10, replace=False))
        t = rows(keys, seed=seed + r + 1)
        await db.upsert("m", t)
        model.update(zip(keys.tolist(), t.column("v").to_pylist()))
        gone = np.sort(rng.choice(n, n // 20, replace=False)).tolist()
        await db.delete("m", gone)
        for k in gone:
            model.pop(k, None)
        await db.seal()
    await db.offload()


async def check(db, model: dict):
    """get, scan, query with the column index, and index == scan."""
    t, _ = await db.read_all("m")
    assert t.column("id").to_pylist() == sorted(model)
    assert dict(zip(t.column("id").to_pylist(), t.column("v").to_pylist())) == model
    for k in list(model)[:25]:
        assert (await db.get("m", k))["v"] == model[k]
    q, _ = await db.query("m", bbox=BOX, limit=None)
    loc = t.column("loc").combine_chunks()
    x, y = loc.field("x").to_numpy(), loc.field("y").to_numpy()
    inside = (x >= 20) & (x <= 70) & (y >= 10) & (y <= 60)
    assert q.column("id").to_pylist() == np.asarray(t.column("id"))[inside].tolist()
    q2, _ = await db.query("m", where=[["name", "=", "name-3"]], limit=None)
    assert q2.column("id").to_pylist() == [k for k in sorted(model) if k % 13 == 3]


async def states(db) -> dict:
    out = {}
    for r in await db.store.list():
        out.setdefault(r.state, []).append(r)
    return out


async def test_pass_copies_live_rows_retires_and_deletes_victims():
    w, db = await make()
    model = {}
    await churn(db, model)
    before = await states(db)
    res = await db.collect_garbage()
    assert res["job"] == "gc" and res["segments_collected"] > 0 and res["rows_copied"] > 0
    assert res["bytes_reclaimed"] > 0 and sorted(res["deleted"]) == sorted(res["retired"])
    after = await states(db)
    assert not after.get(SegState.RETIRED)
    live = sum(r.rows for r in after[SegState.OFFLOADED])
    assert live < sum(r.rows for r in before[SegState.OFFLOADED])
    await check(db, model)
    for r in after[SegState.OFFLOADED]:
        assert r.live_rows <= r.rows and r.live_bytes <= r.bytes
    # nothing points at a deleted segment: every rowid of every run names a live segment
    segs = {r.segid for r in await db.store.list()}
    for p in db.tables.partitions():
        for _, run in p.index.runs:
            ids = (await run.all()).rowids
            ids = ids[ids != np.uint64(2**64 - 1)]
            assert set((ids >> np.uint64(32)).tolist()) <= segs
    # restart: same answers; a second pass finds less
    w.crash()
    db = await w.start()
    await check(db, model)
    res2 = await db.collect_garbage()
    assert res2["rows_copied"] <= res["rows_copied"]
    await check(db, model)


async def test_dry_run_lists_victims_and_changes_nothing():
    w, db = await make()
    model = {}
    await churn(db, model)
    before = [(r.segid, r.state, r.live_rows) for r in await db.store.list()]
    res = await db.collect_garbage(dry_run=True)
    assert res["dry_run"] and res["victims"] and all(v["garbage_ratio"] >= 0.5 for v in res["victims"])
    assert [(r.segid, r.state, r.live_rows) for r in await db.store.list()] == before


async def test_grace_and_leases_hold_retired_segments():
    w, db = await make(grace_s=3600)
    model = {}
    await churn(db, model)
    res = await db.collect_garbage()
    assert res["retired"] and not res["deleted"]
    retired = [r.segid for r in await db.store.list() if r.state == SegState.RETIRED]
    assert sorted(retired) == sorted(res["retired"])
    await check(db, model)  # a retired segment is still readable
    from rowstore.segments.fsck import check_segments

    assert await check_segments(db.fs) == []  # retired segments are checked too
    db.gc.cfg = GcConfig(grace_s=0)
    lease = await db.acquire_lease(retired[:1], 60)
    res = await db.collect_garbage()
    assert sorted(res["deleted"]) == sorted(retired[1:])
    await db.release_lease(lease)
    res = await db.collect_garbage()
    assert res["deleted"] == retired[:1]
    await check(db, model)


async def test_time_travel_above_the_horizon_survives_a_pass():
    w, db = await make()
    db.reader.retention_ms = 3_600_000  # keep an hour of history
    await db.upsert("m", rows(range(100), v=1.0))
    await db.seal()
    r2 = await db.upsert("m", rows(range(100), v=2.0))
    await db.seal()
    await db.delete("m", list(range(50)))
    await db.seal()
    await db.offload()
    res = await db.collect_garbage()
    assert res["rows_copied"] == 0  # above the horizon nothing is garbage, deletions included
    assert sum(r.deletions for r in await db.store.list()) == 50  # counted at offload (2 partitions)
    t, _ = await db.changes("m", 0)
    assert sorted(t.column("op").to_pylist()) == ["delete"] * 50 + ["upsert"] * 200  # the feed is whole
    t, _ = await db.read_all("m", as_of=r2.commit_ts)
    assert t.column("v").to_pylist() == [2.0] * 100
    db.reader.retention_ms = db.reader.purge_lag_ms = 0
    res = await db.collect_garbage()
    assert res["segments_collected"] >= 2
    t, _ = await db.read_all("m")
    assert t.column("id").to_pylist() == list(range(50, 100)) and set(t.column("v").to_pylist()) == {2.0}


async def test_concurrent_upserts_and_deletes_of_relocated_keys():
    import asyncio

    w, db = await make()
    model = {}
    await churn(db, model, rounds=2)

    async def writer():
        for i in range(20):
            keys = list(range(i * 7 % 300, i * 7 % 300 + 15))
            t = rows(keys, v=1000.0 + i)
            await db.upsert("m", t)
            model.update(zip(keys, t.column("v").to_pylist()))
            if i % 3 == 0:
                await db.delete("m", keys[:3])
                for k in keys[:3]:
                    model.pop(k, None)
            await asyncio.sleep(0)

    await asyncio.gather(writer(), db.collect_garbage())
    await check(db, model)
    await db.seal()
    await db.offload()
    await db.collect_garbage()
    await check(db, model)


async def test_dropped_table_is_reclaimed():
    w, db = await make()
    model = {}
    await churn(db, model, rounds=1)
    await db.checkpoint()
    tid = (await db.describe("m")).table_id
    assert await db.catalog.scan(f"rs/wm/{tid}/")
    await db.drop_table("m")
    res = await db.collect_garbage()
    assert res["deleted"]
    assert not [r for r in await db.store.list() if r.table == tid]
    assert not await db.catalog.scan(f"idx/{tid}/")
    assert not await db.catalog.scan(f"rs/wm/{tid}/")  # nor what its partitions had offloaded
    await no_leaks(db)  # its runs' files deleted with the manifests that named them


@pytest.mark.parametrize("point", ["gc.after_copy", "gc.after_publish", "gc.after_index_checkpoint",
                                   "gc.after_retire", "gc.after_delete"])
async def test_crash_at_every_step_loses_nothing_and_leaks_nothing(point):
    w, db = await make()
    model = {}
    await churn(db, model)
    for rnd in range(2):
        db = await _crash_in_a_pass(w, db, point, model)
        await churn(db, model, rounds=1, seed=10 + rnd)
    await db.collect_garbage()
    await check(db, model)
    await no_leaks(db)


async def no_leaks(db):
    """Every file row is named by a segment row, a manifest, or a pending column run; every
    segment and run file exists; no gc/pending row is left after a restart."""
    files = {r.inode for r in await db.fs.list()}
    named = set()
    for r in await db.store.list():
        named.add(r.inode)
    for e in await db.catalog.scan("idx/"):
        if e.key.endswith("/manifest"):
            from rowstore.index.key_manifest import Manifest

            m = Manifest.from_bytes(e.value)
            named |= {r["inode"] for r in m.runs} | {i for r in m.runs for i in r.get("cols", {}).values()}
            named |= set(m.garbage)
    assert not await db.catalog.scan("gc/pending/")
    assert named <= files, f"named but missing: {named - files}"
    assert files <= named, f"leaked: {files - named}"
    objects = {k.key for k in await db.fs.objects.list("files/")}
    assert len(objects) == len([r for r in await db.fs.list() if r.location])


@pytest.mark.parametrize("col", ["loc", "ts"])
async def test_clustered_rewrite_records_ranges_and_queries_skip_segments(col):
    from rowstore.reads.predicates import parse_bbox, parse_where
    from rowstore.reads.zones import misses

    w, db = await make(cluster_by=col, seal_bytes=8 << 10, min_garbage=0.9)
    model = {}
    await churn(db, model, rounds=2, n=600)
    res = await db.collect_garbage()  # unclustered segments are victims whatever their garbage
    assert res["segments_collected"] > 0
    d = await db.describe("m")
    assert d.cluster_column.name == col
    copies = [r for r in await db.store.list() if r.state == SegState.OFFLOADED and r.copy]
    assert len(copies) > 2 and all(r.cluster for r in copies)
    for r in copies:  # the footer holds the same range
        seg = await db.store.sealed(r.segid)
        assert tuple(seg.footer.cluster) == tuple(r.cluster)
    from rowstore.segments.fsck import check_segments

    assert await check_segments(db.fs) == []
    await check(db, model)
    if col == "loc":
        box = parse_bbox(d.schema, {"column": "loc", "xmin": 1, "ymin": 1, "xmax": 3, "ymax": 3})
        skipped = [r for r in copies if misses(r.cluster, [], box)]
        q, _ = await db.query("m", bbox={"column": "loc", "xmin": 1, "ymin": 1, "xmax": 3, "ymax": 3}, limit=None)
    else:
        terms = parse_where(d.schema, [["ts", ">=", 100_000_000], ["ts", "<", 120_000_000]])
        skipped = [r for r in copies if misses(r.cluster, terms, None)]
        q, _ = await db.query("m", where=[["ts", ">=", 100_000_000], ["ts", "<", 120_000_000]], limit=None)
        assert q.column("id").to_pylist() == [k for k in sorted(model) if 100 <= k < 120]
        # ts has no column index: without the ranges every copy would be in the plan
        plan = await db.read_plan("m", where=[["ts", ">=", 100_000_000], ["ts", "<", 120_000_000]])
        assert plan.sealed and not {r.segid for r in skipped} & set(plan.sealed_segids)
        await db.release_lease(plan.lease)
    assert skipped, "a small window misses most clustered segments"
    t, _ = await db.read_all("m")
    assert q.num_rows <= t.num_rows
    # a second pass does not rewrite clustered copies without garbage
    res2 = await db.collect_garbage()
    assert res2["segments_collected"] <= 2  # at most the segments written since (the newest is kept)
    await check(db, model)


async def test_cluster_by_validation():
    from rowstore.errors import SchemaError

    w = TablesWorld(1)
    db = await w.start()
    with pytest.raises(SchemaError):
        await db.create_table("x", SCHEMA, cluster_by="nope")
    with pytest.raises(SchemaError):
        await db.create_table("x", SCHEMA, cluster_by="name")
    assert not await db.list_tables()
    d = await db.create_table("x", SCHEMA, cluster_by="id")
    assert d.cluster_by is None  # the primary key is the default order


@pytest.mark.slow
async def test_on_s3_with_encryption_crashes_and_leaks_nothing(s3_bucket_uri):
    """The same pass on S3 (a moto_server process) with at-rest encryption: a crash after the
    copies are written and one after the publish, restarts, and every object accounted for."""
    import os

    from terrafs.crypto import KeyEncryptionKey
    from terrafs.uri import open_object_store

    store = open_object_store(s3_bucket_uri)
    await store.open_store()
    kek = KeyEncryptionKey(os.urandom(32))
    w = TablesWorld(2, objects=store, kek=kek, retention_ms=0, purge_lag_ms=0, gc=GcConfig(grace_s=0.0))
    db = await w.start()
    await db.create_table("m", SCHEMA, indexes=["loc", "name"], cluster_by="loc")
    model = {}
    await churn(db, model, rounds=2, n=300)
    for point in ("gc.after_copy", "gc.after_publish"):
        db = await _crash_in_a_pass(w, db, point, model)
    res = await db.collect_garbage()
    await check(db, model)
    await no_leaks(db)
    recs = await db.store.list()
    assert any(r.copy and r.cluster for r in recs) and not [r for r in recs if r.state == SegState.RETIRED]
    assert res["job"] == "gc"
    for info in await store.list("files/"):
        assert b"name-3" not in await store.get(info.key)  # no row value in plaintext
    await store.close()


async def test_an_idle_partition_is_not_reread_until_garbage_can_appear():
    w, db = await make()
    db.reader.retention_ms = 3_600_000  # an hour of history: superseded versions stay live for now
    model = {}
    await churn(db, model, rounds=1)
    calls = []
    for p in db.tables.partitions():
        real = p.index.gc_view

        async def counting(H, with_memtable=False, real=real):
            calls.append(H)
            return await real(H, with_memtable)

        p.index.gc_view = counting
    await db.collect_garbage()
    first = len(calls)
    assert first == len(db.tables.partitions())
    await db.collect_garbage()
    assert len(calls) == first  # nothing changed, the horizon is an hour below the next garbage
    db.reader.retention_ms = db.reader.purge_lag_ms = 0  # the horizon passes every superseding version: look again
    res = await db.collect_garbage()
    assert len(calls) == 2 * first and res["segments_collected"] > 0
    await check(db, model)


async def test_max_bytes_per_run_limits_a_pass():
    w, db = await make(min_garbage=0.01)
    model = {}
    await churn(db, model, rounds=3)
    one = min(r.bytes for r in await db.store.list() if r.state == SegState.OFFLOADED)
    db.gc.cfg = GcConfig(min_garbage=0.01, grace_s=0.0, max_bytes_per_run=1)
    res = await db.collect_garbage()
    assert res["segments_collected"] == 1  # the first victim goes whatever its size; no other
    db.gc.cfg = GcConfig(min_garbage=0.01, grace_s=0.0, max_bytes_per_run=one * 100)
    res = await db.collect_garbage()
    assert res["segments_collected"] > 1
    await check(db, model)


async def test_copies_of_rows_of_many_schema_versions():
    """A segment names at most 8 schema versions: victims written under more are copied into
    several segments, each within the limit."""
    w, db = await make(partitions=1, min_garbage=0.1)
    model = {}
    for i in range(11):
        await db.alter_table("m", lambda s, i=i: s.add_column(f"c{i}", "int64"))
        keys = list(range(i * 20, i * 20 + 40))
        t = rows(keys, seed=i)
        await db.upsert("m", t)
        model.update(zip(keys, t.column("v").to_pylist()))
        await db.seal()
    await db.offload()
    res = await db.collect_garbage()
    assert res["segments_collected"] >= 9
    copies = [r for r in await db.store.list() if r.copy and r.state == SegState.OFFLOADED]
    assert len(copies) >= 2
    for r in copies:
        assert len((await db.store.sealed(r.segid)).footer.versions) <= 8
    await check(db, model)


async def test_merges_move_live_counts_before_any_pass():
    w, db = await make(partitions=1)
    await db.upsert("m", rows(range(100)))
    await db.seal()
    await db.offload()
    (seg,) = [r for r in await db.store.list() if r.state == SegState.OFFLOADED]
    assert seg.live_rows == 100
    for i in range(5):  # five checkpoints of overwrites, then merges with the horizon above them
        await db.upsert("m", rows(range(i * 10, i * 10 + 10), v=float(i)))
        await db.checkpoint()
    for p in db.tables.partitions():
        await p.index.merge(0, db.horizon())
    rec, _ = await db.store.record(seg.segid)
    assert rec.live_rows == 50 and rec.live_bytes == seg.bytes * 50 // 100  # 50 keys overwritten
    res = await db.collect_garbage(dry_run=True)  # the pass's own count agrees
    assert [v["live_rows"] for v in res["victims"] if v["segid"] == seg.segid] == [50]


@pytest.mark.parametrize("typ,values", [("uint64", [0, 2**63 + 5, 2**64 - 1]), ("float32", [-1.5, 0.25, 3e30]),
                                        ("date", [-3, 0, 20_000]), ("box", None)])
async def test_cluster_keys_of_every_clusterable_type(typ, values):
    from rowstore.reads.predicates import parse_bbox, parse_where
    from rowstore.reads.zones import misses

    w = TablesWorld(1, retention_ms=0, purge_lag_ms=0, gc=GcConfig(grace_s=0.0))
    db = await w.start()
    await db.create_table("c", f"id int64 primary key, k {typ}", cluster_by="k")
    n = 300
    if typ == "box":
        x = np.arange(n, dtype=float)
        col = pa.StructArray.from_arrays([pa.array(x), pa.array(x), pa.array(x + 1), pa.array(x + 2)],
                                         names=["xmin", "ymin", "xmax", "ymax"])
    else:
        vals = np.resize(np.array(values, dtype=object), n).tolist()
        col = pa.array(vals, {"uint64": pa.uint64(), "float32": pa.float32(), "date": pa.date32()}[typ])
    t = pa.table({"id": pa.array(range(n), pa.int64()), "k": col})
    await db.upsert("c", t)
    await db.seal()
    await db.upsert("c", t.slice(0, 1))
    await db.seal()
    await db.offload()
    res = await db.collect_garbage()
    assert res["segments_collected"] >= 1
    copies = [r for r in await db.store.list() if r.copy and r.state == SegState.OFFLOADED]
    assert copies and all(r.cluster for r in copies)
    got, _ = await db.read_all("c")
    assert got.column("k").to_pylist() == t.column("k").to_pylist()
    d = await db.describe("c")
    if typ == "box":  # a box far from every row misses; one over some rows does not
        assert misses(copies[0].cluster, [], parse_bbox(d.schema, {"column": "k", "xmin": 900, "ymin": 900,
                                                                   "xmax": 950, "ymax": 950}))
        assert not misses(copies[0].cluster, [], parse_bbox(d.schema, {"column": "k", "xmin": 10, "ymin": 10,
                                                                       "xmax": 11, "ymax": 11}))
    elif typ == "uint64":
        assert not misses(copies[0].cluster, parse_where(d.schema, [["k", "=", 2**64 - 1]]), None)
        q, _ = await db.query("c", where=[["k", "=", 2**64 - 1]], limit=None)
        assert q.num_rows == n // 3


async def _crash_in_a_pass(w, db, point: str, model: dict):
    """A GC pass killed at fail point ``point``, the restart, then everything checked: the
    rows against the model, no leaked files or objects. Returns the restarted database."""
    with armed(point), pytest.raises(FailPointCrash):
        await db.collect_garbage()
    w.crash()
    db = await w.start()
    await check(db, model)
    await no_leaks(db)
    return db


async def test_a_segment_row_that_disagrees_with_its_object_is_corruption_not_a_shape_error():
    """The cluster failure 'operands could not be broadcast together with shapes (128,) (166,)':
    a pass's mark bitmap is sized from the segment row (rows), its victim read from the object
    this node cached under that segid — another segment's object once segids were reused. Now
    reported as corruption naming the segment (and segids are never reused)."""
    from dataclasses import replace

    from rowstore.errors import RowCorruptionError
    from rowstore.segments.store import SEG_PREFIX

    w, db = await make(min_garbage=0.1)
    model = {}
    await churn(db, model, rounds=2)
    await db.checkpoint()
    victim = max((r for r in await db.store.list() if r.state == SegState.OFFLOADED), key=lambda r: r.rows)
    await db.store.sealed(victim.segid)  # this node's cached object of the segid
    e = await db.catalog.get(f"{SEG_PREFIX}{victim.segid:08x}")
    from catalog.abc import Put

    await db.catalog.txn([], [Put(e.key, replace(victim, rows=victim.rows - 38).to_bytes())])
    with pytest.raises(RowCorruptionError, match=f"segment {victim.segid} holds {victim.rows} rows"):
        await db.collect_garbage()


@pytest.mark.parametrize("serving", [False, True])
async def test_a_partition_lost_during_its_pass_is_abandoned_not_a_failed_pass(monkeypatch, serving):
    """A partition this node stops serving mid-pass (an election, a hand-off) fails in whatever
    step meets the change first — a segment sealed or released under it, not only a conflict:
    the pass goes on with the others. The same error while it is still served fails the pass."""
    from terrafs.errors import FileStateError

    w, db = await make(partitions=2)
    await db.upsert("m", rows(range(100)))
    gc = db.gc
    real = gc._partition
    seen = []

    async def losing(d, p, H, res):
        seen.append(p.pid)
        if p.pid == 0:
            if not serving:
                db.tables.get(p.table_id).unserve(0)  # moved away meanwhile
            raise FileStateError("segment sealed under the pass")
        await real(d, p, H, res)
    monkeypatch.setattr(gc, "_partition", losing)
    if serving:
        with pytest.raises(FileStateError):
            await gc.run()
    else:
        await gc.run()
        assert seen == [0, 1]


async def test_a_segment_released_on_its_way_to_an_object_is_skipped_not_a_failed_pass(monkeypatch):
    """The offload before a pass (and the offload job) meets a segment whose partition moved
    meanwhile as 503 ``unavailable``: its new leader offloads it; the others still go."""
    from rowstore.errors import UnavailableError

    w, db = await make(partitions=2)
    await db.upsert("m", rows(range(200)))
    await db.seal()
    pending = await db.store.pending_offload()
    assert len(pending) >= 2
    real = db.store.offload

    async def moved_first(segid, *a, **k):
        if segid == pending[0]:
            raise UnavailableError(f"segment {segid} is no longer open here (its partition moved); retry")
        return await real(segid, *a, **k)
    monkeypatch.setattr(db.store, "offload", moved_first)
    await db.gc.run()
    assert await db.store.pending_offload() == [pending[0]]
