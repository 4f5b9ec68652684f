"""Per-table retention (docs/rfcs/0016-time-series-aggregates.md §5): a row whose retention
column is older than wall(T) − keep is invisible to every read at T — get, query, scan,
aggregate, histogram, the change feed and read plans (whose bitmaps readers count as they
are) — on active, sealed and offloaded (row and columnar) segments; a read as of before the
setting keeps the old one; the clock is the test's, so rows fall out when it says."""
import numpy as np
import pyarrow as pa
import pytest
from pyroaring import BitMap

from rowstore.reads.agg_spec import parse_spec
from rowstore.db.background.gc import GcConfig
from rowstore.errors import SchemaError
from rowstore.hlc import ms_of
from rowstore.reads.aggregates import finish
from tests.rowstore.tables_world import TablesWorld

SCHEMA = "id int64 primary key, ts timestamp not null, day date not null, p point, v float64, at timestamp"
N = 200


def _rows(now_ms: int, ids: range) -> pa.Table:
    """Row i was measured i seconds before ``now_ms`` (and i hours before, by day)."""
    ids_ = np.asarray(ids, np.int64)
    ts = (now_ms - ids_ * 1000) * 1000
    return pa.table({
        "id": pa.array(ids_),
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "day": pa.array(((now_ms // 1000 - ids_ * 3600) // 86_400).astype(np.int32), pa.date32()),
        "p": pa.StructArray.from_arrays([pa.array(ids_ % 10, pa.float64()), pa.array(ids_ % 7, pa.float64())],
                                        names=["x", "y"]),
        "v": pa.array(ids_.astype(float)),
        "at": pa.array(ts, pa.timestamp("us", tz="UTC")),
    })


def _expected(tbl: pa.Table, T: int, keep_s: int) -> set[int]:
    cut = ms_of(T) * 1000 - keep_s * 1_000_000
    ts = tbl.column("ts").cast(pa.int64()).to_numpy()
    return set(tbl.column("id").to_numpy()[ts >= cut].tolist())


async def _every_read(db, T: int) -> dict[str, set[int] | int]:
    """What each read path sees at T: ids, or a count."""
    ids = list(range(N))
    q, _ = await db.query("r", as_of=T, limit=None)
    page = await db.scan("r", as_of=T, limit=10 * N)
    many = await db.get_many("r", ids, as_of=T)
    got, _ = await db.get_rows("r", ids, as_of=T)
    one = {i for i in ids if await db.get("r", i, as_of=T) is not None}
    _, dicts = await db.get_dicts("r", ids, as_of=T)
    p, _, _ = await db.aggregate("r", [], [{"fn": "count"}], as_of=T)
    d = await db.describe("r", T)
    count = finish(p, parse_spec(d.schema, [], [{"fn": "count"}])).column(0)[0].as_py()
    cells, _, _ = await db.histogram("r", "p", {"xmin": 0, "ymin": 0, "xmax": 10, "ymax": 10}, [2, 2], as_of=T)
    feed, _ = await db.changes("r", 0, T)
    plan = await db.read_plan("r", T)
    planned = sum(len(BitMap.deserialize(s.visible)) for s in plan.sealed)
    for t in plan.tail:
        planned += (await db.tail("r", t, T, sealed=plan.sealed_segids)).num_rows
    return {"query": set(q.column("id").to_pylist()), "scan": set(page.rows.column("id").to_pylist()),
            "get_many": set(many.column("id").to_pylist()), "get_rows": set(got.column("id").to_pylist()),
            "get": one, "get_dicts": {r["id"] for r in dicts if r is not None},
            "feed": set(feed.column("id").to_pylist()), "count": count, "histogram": int(np.sum(cells)),
            "plan": planned}


def _check(seen: dict, want: set[int]) -> None:
    for path, got in seen.items():
        assert got == (len(want) if isinstance(got, int) else want), path


@pytest.mark.parametrize("columnar", [False, True])
@pytest.mark.parametrize("indexes", [[], ["ts", "p", "v"]])  # the scan paths, and the column index's
async def test_rows_fall_out_of_every_read_as_the_clock_moves(columnar, indexes):
    w = TablesWorld(2, columnar=columnar, seal_bytes=8 << 10)
    db = await w.start()
    await db.create_table("r", SCHEMA, indexes=indexes)
    data = _rows(w.clock.now_ms(), range(N))
    await db.upsert("r", data.slice(0, N // 2))
    await db.seal()
    await db.offload()  # older rows in offloaded segments (columnar: with zone maps), the rest active
    await db.upsert("r", data.slice(N // 2))
    before = db.timeline.closed
    assert (await db.read_plan("r", before)).sealed  # some rows are read from objects
    d = await db.set_retention("r", {"column": "ts", "keep": "150s"})
    assert d.retention is not None
    for step in range(3):
        w.clock.advance(7 if step else 0)
        _, T = await db.query("r", limit=1)
        want = _expected(data, T, 150)
        assert 0 < len(want) < N
        _check(await _every_read(db, T), want)
    _check(await _every_read(db, before), set(range(N)))  # as of before the setting: every row


async def test_a_date_column_keeps_a_day_while_any_of_it_is_within():
    w = TablesWorld(2)
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "day", "keep": "2d"})
    data = _rows(w.clock.now_ms(), range(N))  # days: up to 200 h back
    await db.upsert("r", data)
    q, T = await db.query("r", limit=None)
    first_kept = (ms_of(T) - 2 * 86_400_000) // 86_400_000
    days = data.column("day").cast(pa.int32()).to_numpy()
    assert set(q.column("id").to_pylist()) == set(data.column("id").to_numpy()[days >= first_kept].tolist())


async def test_removing_or_lengthening_the_retention_shows_rows_not_yet_collected():
    w = TablesWorld(2)
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "ts", "keep": "10s"})
    data = _rows(w.clock.now_ms(), range(N))
    await db.upsert("r", data)
    q, T = await db.query("r", limit=None)
    assert set(q.column("id").to_pylist()) == _expected(data, T, 10)  # ages 0..10 s
    await db.set_retention("r", None)
    q, _ = await db.query("r", limit=None)
    assert q.num_rows == N


@pytest.mark.parametrize("doc, match", [
    ({"column": "v", "keep": "1d"}, "not a timestamp or date"),
    ({"column": "at", "keep": "1d"}, "nullable"),
    ({"column": "nope", "keep": "1d"}, "no column"),
    ({"column": "ts", "keep": "0s"}, "above zero"),
    ({"column": "ts", "keep": "-1d"}, "above zero"),
    ({"column": "ts", "keep": 30}, "above zero"),
    ({"column": "ts"}, "retention"),
    ({"column": "ts", "keep": "1d", "extra": 1}, "retention"),
    ("30d", "retention"),
])
async def test_a_bad_retention_is_refused_and_changes_nothing(doc, match):
    w = TablesWorld(2)
    db = await w.start()
    with pytest.raises(SchemaError, match=match):
        await db.create_table("bad", SCHEMA, retention=doc)
    assert [t.name for t in await db.list_tables()] == []
    d = await db.create_table("r", SCHEMA)
    with pytest.raises(SchemaError, match=match):
        await db.set_retention("r", doc)
    assert (await db.describe("r")).ts == d.ts  # no new definition version


async def test_the_retention_column_cannot_be_dropped_while_it_holds_the_retention():
    w = TablesWorld(2)
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "ts", "keep": "1d"})
    with pytest.raises(SchemaError, match="remove the retention first"):
        await db.alter_table("r", lambda s: s.drop_column("ts"))
    d = await db.alter_table("r", lambda s: s.rename_column("ts", "measured"))  # by column id: follows it
    assert d.retention is not None and d.schema.by_id(d.retention.column).name == "measured"


async def _aged_world(columnar: bool):
    """Old readings (1,000 s and more) in segments of their own, fresh ones in others, all
    offloaded; a retention of 500 s; the horizon past every commit."""
    w = TablesWorld(2, columnar=columnar, seal_bytes=8 << 10, retention_ms=0,
                    gc=GcConfig(min_garbage=0.5, grace_s=0.0))
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "ts", "keep": "500s"})
    now = w.clock.now_ms()
    old = _rows(now - 1_000_000, range(N // 2))  # measured 1,000 s to 1,100 s ago
    fresh = _rows(now, range(N // 2, N))  # 100 s to 200 s ago
    for part in (old, fresh):
        await db.upsert("r", part)
        await db.seal()
        await db.offload()
    w.clock.advance(db.cfg.purge_lag_ms / 1000 + 1)  # the horizon passes the commits
    return w, db, fresh


@pytest.mark.parametrize("columnar", [False, True])
async def test_segments_of_aged_rows_are_retired_whole_without_moving_a_row(columnar):
    w, db, fresh = await _aged_world(columnar)
    before = {s["segid"]: s for s in await _segments(db)}
    out = await db.collect_garbage()
    assert out["rows_copied"] == 0 and out["segments_collected"] >= 1
    retired = set(out["retired"])
    assert db.gc.totals["retention_segments_dropped"] == len(retired)
    assert db.gc.totals["retention_bytes_dropped"] == sum(before[s]["bytes"] for s in retired)
    q, _ = await db.query("r", limit=None)
    assert set(q.column("id").to_pylist()) == set(fresh.column("id").to_pylist())
    w.clock.advance(1)
    again = await db.collect_garbage()  # nothing else to do
    assert set(out["deleted"]) | set(again["deleted"]) >= retired and again["rows_copied"] == 0  # grace 0
    assert db.gc.totals["retention_segments_dropped"] == len(retired)  # the ranges learned: no second count
    q, _ = await db.query("r", limit=None)
    assert set(q.column("id").to_pylist()) == set(fresh.column("id").to_pylist())


async def test_a_segment_partly_aged_is_rewritten_with_its_kept_rows_only():
    w = TablesWorld(1, seal_bytes=1 << 20, retention_ms=0, gc=GcConfig(min_garbage=0.5, grace_s=0.0))
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "ts", "keep": "150s"})
    data = _rows(w.clock.now_ms(), range(N))  # ages 0..199 s: 150 of them kept, at first
    await db.upsert("r", data)
    await db.seal()
    await db.offload()
    w.clock.advance(80 + db.cfg.purge_lag_ms / 1000)  # now ages 85..284 s: most are past 150 s
    out = await db.collect_garbage()
    q, T2 = await db.query("r", limit=None)
    kept = _expected(data, T2, 150)
    assert set(q.column("id").to_pylist()) == kept
    # the copy holds what reads at the horizon (purge_lag behind) still see: one row a second
    assert out["segments_collected"] == 1
    assert len(kept) <= out["rows_copied"] <= len(kept) + db.cfg.purge_lag_ms // 1000 + 1
    assert db.gc.totals["retention_segments_dropped"] == 0  # rewritten, not dropped unread


async def _segments(db) -> list[dict]:
    return [{"segid": r.segid, "bytes": r.bytes} for r in await db.store.list() if r.state.name == "OFFLOADED"]


async def test_a_partitions_last_segment_aged_whole_is_retired_and_replay_stays_whole():
    """The segment holding a quiet partition's highest seq, aged whole, is retired too (it was
    kept for ever: the cluster test's drops then depended on timing); the seq it held is kept
    in the catalog, so the next segment comes after it and a restart replays that segment."""
    w = TablesWorld(1, seal_bytes=1 << 20, retention_ms=0, gc=GcConfig(min_garbage=0.5, grace_s=0.0))
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "ts", "keep": "500s"})
    await db.upsert("r", _rows(w.clock.now_ms() - 1_000_000, range(N)))  # every row aged already
    await db.seal()
    await db.offload()
    (old,) = [r for r in await db.store.list() if r.state.name == "OFFLOADED"]
    w.clock.advance(db.cfg.purge_lag_ms / 1000 + 1)
    out = await db.collect_garbage()
    assert out["retired"] == [old.segid] and db.gc.totals["retention_segments_dropped"] == 1
    await db.collect_garbage()  # grace 0: its row deleted
    assert not [r for r in await db.store.list() if r.segid == old.segid]
    fresh = _rows(w.clock.now_ms() + N * 1000, range(N, 2 * N))  # ages 0 to 200 s
    await db.upsert("r", fresh)
    (cur,) = [r for r in await db.store.list() if r.state.name == "ACTIVE"]
    assert cur.seq > old.seq  # below the checkpoint mark it would never be replayed
    await db.checkpoint()  # the mark: in the current segment, after the retired one's seq
    more = _rows(w.clock.now_ms() + 2 * N * 1000, range(2 * N, 3 * N))
    await db.upsert("r", more)
    w.crash()
    db = await w.start()
    q, _ = await db.query("r", limit=None)
    assert set(q.column("id").to_pylist()) == set(range(N, 3 * N))


async def test_a_segment_checkpointed_before_it_was_sealed_ages_out_too():
    """Writes stop right after a checkpoint: the replay mark stays inside the last segment
    (nothing new to checkpoint), and the collector takes only segments below the mark — so
    that segment, aged whole, was kept for ever (the three-node retention test found it). A
    checkpoint with empty memtables now moves the mark alone; a restart replays the rest."""
    w = TablesWorld(1, seal_bytes=1 << 20, retention_ms=0, gc=GcConfig(min_garbage=0.5, grace_s=0.0))
    db = await w.start()
    await db.create_table("r", SCHEMA, retention={"column": "ts", "keep": "500s"})
    await db.upsert("r", _rows(w.clock.now_ms() + N * 1000, range(N)))  # ages 0 to 200 s
    await db.checkpoint()  # the mark: inside the current segment
    await db.seal()
    await db.offload()
    (seg,) = [r for r in await db.store.list() if r.state.name == "OFFLOADED"]
    w.clock.advance(1_000 + db.cfg.purge_lag_ms / 1000)  # every row aged
    out = await db.collect_garbage()
    assert out["retired"] == [seg.segid] and db.gc.totals["retention_segments_dropped"] == 1
    q, _ = await db.query("r", limit=None)
    assert q.num_rows == 0
    fresh = _rows(w.clock.now_ms() + N * 1000, range(N, 2 * N))
    await db.upsert("r", fresh)
    w.crash()
    db = await w.start()
    q, _ = await db.query("r", limit=None)
    assert set(q.column("id").to_pylist()) == set(range(N, 2 * N))
