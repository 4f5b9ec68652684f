"""first/last by the key's next column per key prefix, answered from the key index
(``rowstore.db.read.aggregate.key_walk``, RFC 0016 §3): equal to the general path (every
visible row's ``by`` read) through overwrites, deletes of a prefix's last key — in the
memtable and in runs —, checkpoints, seals, time travel and a retention on the time column."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import rowstore.db.read.aggregate as aggregate
from rowstore.reads.agg_spec import parse_spec
from rowstore.reads.aggregates import finish
from tests.rowstore.tables_world import TablesWorld

SCHEMA = "site int32, sensor string, ts timestamp, v float64, tag string, primary key (site, sensor, ts)"
ASKS = [
    (["site", "sensor"], [{"fn": "last", "column": "v", "by": "ts"}, {"fn": "last", "column": "tag", "by": "ts"}]),
    (["site", "sensor"], [{"fn": "first", "column": "v", "by": "ts"}]),
    (["site"], [{"fn": "last", "column": "ts", "by": "sensor"}]),
    ([], [{"fn": "last", "column": "sensor", "by": "site"}]),
]


async def _both(db, group_by, aggs, as_of=None, where=None):
    schema = (await db.describe("m")).schema
    out = []
    for walk in (True, False):
        aggregate.KEY_WALK = walk
        try:
            P, T, _ = await db.aggregate("m", group_by, aggs, where=where, as_of=as_of)
        finally:
            aggregate.KEY_WALK = True
        rows = finish(P, parse_spec(schema, group_by, aggs)).to_pylist()
        out.append(sorted(rows, key=lambda r: tuple(str(r[k]) for k in sorted(r))))
    return out


def _rows(rng, n, now_us):
    site = rng.integers(0, 3, n).astype(np.int32)
    sensor = [f"s\x00{x}" if x % 3 == 0 else f"s{x}" for x in rng.integers(0, 12, n)]  # an escaped zero too
    ts = now_us - rng.integers(0, 3_600, n) * 1_000_000
    keys = {}
    for i in range(n):
        keys[(int(site[i]), sensor[i], int(ts[i]))] = (float(rng.uniform(-5, 5)), f"t{rng.integers(0, 4)}")
    k = list(keys)
    return pa.table({"site": pa.array([x[0] for x in k], pa.int32()), "sensor": [x[1] for x in k],
                     "ts": pa.array([x[2] for x in k], pa.timestamp("us", tz="UTC")),
                     "v": [keys[x][0] for x in k], "tag": [keys[x][1] for x in k]})


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_picks_from_the_key_index_equal_the_general_path(seed):
    w = TablesWorld(partitions=3, seal_bytes=16 << 10)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    rng = np.random.default_rng(seed)
    now_us = w.clock.now_ms() * 1000
    times = []
    for rnd in range(6):
        # delete some prefixes' picks as they stand (in runs after a checkpoint): the memtable's
        # deletion supersedes a run's best entry, and the prefix's pick is the next one below it
        _, general = await _both(db, ["site", "sensor"], [{"fn": "last", "column": "ts", "by": "ts"}])
        picks = [(r["site"], r["sensor"], r["last_ts"]) for r in general if rng.random() < 0.4]
        if picks:
            await db.delete("m", picks)
        batch = _rows(rng, 300, now_us)
        await db.upsert("m", batch)
        # delete some prefixes' newest keys (the picks): in the memtable, or in runs after a checkpoint
        newest = {}
        for s, x, t in zip(batch.column("site").to_pylist(), batch.column("sensor").to_pylist(),
                           batch.column("ts").cast(pa.int64()).to_pylist()):
            newest[(s, x)] = max(newest.get((s, x), t), t)
        gone = [(s, x, pa.scalar(t, pa.timestamp("us", tz="UTC")).as_py()) for (s, x), t in newest.items()
                if rng.random() < 0.3]
        if gone:
            await db.delete("m", gone)
        if rnd % 2:
            await db.checkpoint()
        if rnd == 3:
            await db.seal()
        times.append(db.closed_ts)
        for group_by, aggs in ASKS:
            walked, general = await _both(db, group_by, aggs)
            assert walked == general, (rnd, group_by, aggs)
    for T in times[:3]:  # time travel: the runs' view at an older T, the memtables laid over it
        for group_by, aggs in ASKS:
            walked, general = await _both(db, group_by, aggs, as_of=T)
            assert walked == general, (T, group_by, aggs)
    await db.close()


async def test_a_lower_bound_on_the_time_and_a_retention_leave_a_prefix_out_or_keep_its_pick():
    w = TablesWorld(partitions=2)
    db = await w.start()
    await db.create_table("m", SCHEMA, retention={"column": "ts", "keep": "30m"})
    rng = np.random.default_rng(7)
    await db.upsert("m", _rows(rng, 400, w.clock.now_ms() * 1000))
    await db.checkpoint()
    await db.upsert("m", _rows(rng, 50, w.clock.now_ms() * 1000))
    cut = pa.scalar((w.clock.now_ms() - 600_000) * 1000, pa.timestamp("us", tz="UTC")).as_py()
    for where in (None, [["ts", ">=", cut.isoformat()]]):
        for group_by, aggs in ASKS[:1]:
            walked, general = await _both(db, group_by, aggs, where=where)
            assert walked == general and walked
    assert aggregate.key_walk(parse_spec((await db.describe("m")).schema, ["site", "sensor"], ASKS[1][1]),
                              [], None) == (2, False)
    await db.close()
