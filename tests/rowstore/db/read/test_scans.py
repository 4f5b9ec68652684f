"""Ordered scans of composite keys (docs/rfcs/0013-measurement-keys.md), held against a model:
random (sensor, ts) keys, overwrites, deletes and a schema change; pages of random sizes read
at several snapshots with seals, offloads, checkpoints and GC passes between them — the pages
concatenated are exactly the model's rows at that T, in key order."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rowstore.errors import InvalidKeyError, RowValidationError, SchemaError
from rowstore.schema import parse_schema
from rowstore.types import TS
from tests.rowstore.tables_world import TablesWorld

SENSORS = ["s1", "s10", "s2", "s\x00x", ""]  # "" and a NUL: the encoding's corner cases


def readings(keys: list[tuple[str, int]], v: float) -> pa.Table:
    return pa.table({"sensor": pa.array([k[0] for k in keys]),
                     "ts": pa.array([k[1] for k in keys], pa.int64()).view(TS),
                     "v": pa.array([v] * len(keys), pa.float64())})


async def world(partitions: int = 4) -> tuple[TablesWorld, object]:
    w = TablesWorld(partitions, seal_bytes=4096)
    db = await w.start()
    await db.create_table("r", parse_schema("sensor string, ts timestamp, v float64, primary key (sensor, ts)"))
    return w, db


async def pages(db, T: int, size: int, **scan) -> list[tuple[str, int, float]]:
    """Every page of one scan at T, concatenated (the cursor's key: ``after``)."""
    out, after = [], None
    while True:
        page = await db.scan("r", **scan, after=after, as_of=T, limit=size)
        assert page.T == T
        out += [(r["sensor"], r["ts"], r["v"]) for r in _plain(page.rows)]
        if not page.more:
            return out
        after = page.last


def _plain(t: pa.Table) -> list[dict]:
    t = t.set_column(t.schema.get_field_index("ts"), "ts", t.column("ts").cast(pa.int64()))
    return t.select(["sensor", "ts", "v"]).to_pylist()


def expected(model: dict, prefix=(), start=None, end=None) -> list[tuple[str, int, float]]:
    keys = sorted(k for k in model if k[: len(prefix)] == tuple(prefix)
                  and (start is None or _enc(k) >= _enc(tuple(start), False))
                  and (end is None or _enc(k) < _enc(tuple(end), False)))
    return [(k[0], k[1], model[k]) for k in keys]


def _enc(k: tuple, whole: bool = True) -> bytes:
    from rowstore.tables.tuple_keys import encode_tuple
    from rowstore.types import Kind

    return encode_tuple(k, [Kind.STRING, Kind.TIMESTAMP][: len(k)], end=whole)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
async def test_pages_of_a_scan_are_the_model_at_each_snapshot(seed):
    rng = random.Random(seed)
    w, db = await world()
    model: dict[tuple[str, int], float] = {}
    snaps: list[tuple[int, dict]] = []
    for step in range(8):
        keys = list({(rng.choice(SENSORS), rng.randrange(-3, 40)) for _ in range(rng.randrange(1, 60))})
        r = await db.upsert("r", readings(keys, float(step)))
        model.update({k: float(step) for k in keys})
        if rng.random() < 0.4 and model:
            gone = rng.sample(sorted(model), min(len(model), rng.randrange(1, 8)))
            r = await db.delete("r", [list(k) for k in gone])
            for k in gone:
                model.pop(k)
        snaps.append((r.commit_ts, dict(model)))
        job = rng.choice(["seal", "offload", "checkpoint", "gc", None])
        if job == "seal":
            await db.seal()
        elif job == "offload":
            await db.seal()
            await db.offload()
        elif job == "checkpoint":
            await db.checkpoint()
        elif job == "gc":
            await db.seal()
            await db.offload()
            await db.collect_garbage()
        if step == 4:
            await db.alter_table("r", lambda s: s.add_column("note", "string"))  # a schema change between snapshots
    for T, at in snaps[-4:]:
        size = rng.randrange(1, 12)
        assert await pages(db, T, size) == expected(at)
        s = rng.choice(SENSORS)
        assert await pages(db, T, size, prefix=[s]) == expected(at, (s,))
        lo, hi = sorted([rng.randrange(-3, 40), rng.randrange(-3, 40)])
        assert await pages(db, T, size, prefix=[s], start=[s, lo], end=[s, hi]) == \
            expected(at, (s,), (s, lo), (s, hi))
        assert await pages(db, T, size, start=["s1"], end=["s2"]) == expected(at, (), ("s1",), ("s2",))


async def test_a_prefix_naming_the_partition_key_reads_one_partition():
    w, db = await world(partitions=8)
    await db.upsert("r", readings([(s, t) for s in SENSORS for t in range(5)], 1.0))
    d = await db.describe("r")
    assert len(db.scan_partitions(d, ("s1",))) == 1 and len(db.scan_partitions(d, ())) == 8
    page = await db.scan("r", prefix=["s1"], where=[["v", ">", 0]], columns=["ts"])
    assert page.rows.column_names == ["ts"] and page.rows.num_rows == 5 and not page.more


async def test_many_rows_by_composite_key_in_the_order_asked():
    w, db = await world()
    await db.upsert("r", readings([("a", 1), ("b", 2), ("c", 3)], 7.0))
    t, _ = await db.get_rows("r", [["c", 3], ["zz", 0], ["a", 1], ["c", 3]])
    assert sorted(t.column("__pos").to_pylist()) == [0, 2, 3]
    by_pos = dict(zip(t.column("__pos").to_pylist(), t.column("sensor").to_pylist()))
    assert by_pos == {0: "c", 2: "a", 3: "c"}
    assert (await db.get("r", ["b", 2]))["v"] == 7.0 and await db.get("r", ["b", 3]) is None


@pytest.mark.parametrize("bad", [["s1"], ["s1", 1, 2], "s1", [1, 1], ["s1", "not a time"], [None, 1]])
async def test_a_malformed_key_is_refused_and_changes_nothing(bad):
    w, db = await world()
    await db.upsert("r", readings([("s1", 1)], 1.0))
    with pytest.raises((InvalidKeyError, RowValidationError)):  # both answer 400
        await db.delete("r", [bad])
    with pytest.raises((InvalidKeyError, RowValidationError)):
        await db.get("r", bad)
    assert (await db.read_all("r"))[0].num_rows == 1


async def test_a_prefix_longer_than_the_key_is_refused():
    w, db = await world()
    with pytest.raises(InvalidKeyError, match="at most 2 components"):
        await db.scan("r", prefix=["s1", 1, 2])


def test_the_partition_key_is_a_leading_run_of_the_key():
    with pytest.raises(SchemaError, match="partition key"):
        parse_schema("sensor string, ts timestamp, primary key (sensor, ts)", partition_key=3)
    with pytest.raises(SchemaError, match="cannot be nullable|cannot be of type"):
        parse_schema("sensor string, loc point, primary key (sensor, loc)")


async def test_a_page_across_many_partitions_merges_rounds_of_each():
    """Pages far larger than a partition's share: each partition is read in rounds and the
    rounds merged, every row once and in key order, with a where filter thinning them out."""
    w, db = await world(partitions=8)
    keys = [(f"s{i % 50}", i) for i in range(1200)]
    await db.upsert("r", readings(keys, 1.0))
    await db.delete("r", [[s, t] for s, t in keys[::7]])
    await db.seal()
    await db.offload()
    T = (await db.upsert("r", readings([("s1", -5)], 2.0))).commit_ts
    model = {k: 1.0 for i, k in enumerate(keys) if i % 7} | {("s1", -5): 2.0}
    for size in (7, 150, 2000):
        assert await pages(db, T, size) == expected(model)
    got = await pages(db, T, 111, where=[["ts", ">=", 600]])
    assert got == [r for r in expected(model) if r[1] >= 600]
