"""`python -m bench tsagg`: time-series aggregates (RFC 0016) of an in-process Database against
DuckDB over the same rows as a zstd Parquet file and as an in-memory Arrow table: per sensor
and hour, count + mean + p95 (ours: a KLL sketch per partition merged; DuckDB's
``approx_quantile``: a t-digest), and the last value per sensor (DuckDB's ``arg_max``).

Rows: 1,000 sensors × ``TERRASCALE_BENCH_TSAGG_PER_SENSOR`` readings (default 10,000, one per
second: the issue's 10M; a smaller number to run it quickly). The rows are checkpointed (the
column index in runs) before the measured requests. Answers are asserted: counts and last
values equal, means within rounding, our p95's rank within the sketch's documented error.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Result, median_time, print_table, write_json
from catalog.memory import MemoryCatalog
from rowstore.db.database import Database, TablesConfig
from rowstore.reads.aggregates import finish
from rowstore.reads.agg_spec import parse_spec
from rowstore.reads.sketches import KLL_RANK_ERROR
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

SENSORS = 1000
PER_SENSOR = int(os.environ.get("TERRASCALE_BENCH_TSAGG_PER_SENSOR", "10000"))
REPEAT = 5
BATCH = 500_000
T0_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
SCHEMA = "id int64 primary key, sensor string, ts timestamp, v float64"
KEYED = "sensor string, ts timestamp, v float64, primary key (sensor, ts)"  # a measurement key (RFC 0013)
GROUP_BY = ["sensor", {"bucket": "ts", "width": "1h"}]
AGGS = [{"fn": "count"}, {"fn": "mean", "column": "v"}, {"fn": "quantile", "column": "v", "q": 0.95, "as": "p95"}]
LAST = [{"fn": "last", "column": "v", "by": "ts"}]
SQL_BUCKETS = ("SELECT sensor, time_bucket(INTERVAL '1 hour', ts) AS b, count(*), avg(v), approx_quantile(v, 0.95) "
               "FROM {src} GROUP BY ALL")
SQL_LAST = "SELECT sensor, arg_max(v, ts) FROM {src} GROUP BY sensor"


def rows(first: int, n: int) -> pa.Table:
    """Rows ``first .. first+n`` of the table: row i is sensor i // PER_SENSOR's (i % PER_SENSOR)-th second."""
    i = np.arange(first, first + n, dtype=np.int64)
    sensor, sec = i // PER_SENSOR, i % PER_SENSOR
    rng = np.random.default_rng(first)
    names = pa.array([f"s{k:04d}" for k in range(SENSORS)]).take(pa.array(sensor))
    return pa.table({"id": i, "sensor": names, "ts": pa.array(T0_US + sec * 1_000_000, pa.timestamp("us", tz="UTC")),
                     "v": pa.array(np.sin(sec / 600.0) * 10 + rng.normal(0, 3, n) + sensor % 7)})


async def _open(root: str) -> Database:
    fs = TerrascaleFS(MemoryCatalog(), LocalBlockDevice(f"{root}/block"),
                      LocalBlockDevice(f"{root}/cache", durable=False), LocalObjectStore(f"{root}/objects"),
                      config=FsConfig(cache_memory_bytes=512 << 20))
    await fs.open()
    db = Database(fs, TablesConfig(partitions=4, seal_bytes=64 << 20, memtable_bytes=1 << 30))
    await db.open()
    return db


async def _timed(db: Database, group_by: list[Any], aggs: list[dict[str, Any]],
                 table: str = "r") -> tuple[pa.Table, float]:
    schema = (await db.describe(table)).schema
    assert schema is not None
    spec = parse_spec(schema, group_by, aggs)
    times, out = [], None
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        p, _, _ = await db.aggregate(table, group_by, aggs)
        out = finish(p, spec)
        times.append(time.perf_counter() - t0)
    assert out is not None
    return out, statistics.median(times)


def _check_buckets(ours: pa.Table, duck: list[tuple], data: pa.Table) -> float:
    """Counts equal, means within rounding, our p95's rank within the KLL bound; DuckDB's p95's
    largest rank error (returned, reported)."""
    key = [(s, b.timestamp()) for s, b in zip(ours.column("sensor").to_pylist(), ours.column("bucket_ts").to_pylist())]
    got = dict(zip(key, zip(ours.column("count").to_pylist(), ours.column("mean_v").to_pylist(),
                            ours.column("p95").to_pylist())))
    want = {(s, b.timestamp()): (c, m, q) for s, b, c, m, q in duck}
    assert got.keys() == want.keys(), "groups differ"
    for k, (c, m, _) in got.items():
        assert c == want[k][0] and abs(m - want[k][1]) <= 1e-9 * max(1.0, abs(m)), (k, got[k], want[k])
    # exact ranks: every group's values sorted once
    sec = (data.column("ts").cast(pa.int64()).to_numpy() - T0_US) // 3_600_000_000
    sensor = data.column("id").to_numpy() // PER_SENSOR
    g = sensor * (PER_SENSOR // 3600 + 1) + sec
    v = data.column("v").to_numpy()
    order = np.lexsort((v, g))
    gs, vs = g[order], v[order]
    bounds = np.searchsorted(gs, np.unique(gs))
    ends = np.r_[bounds[1:], len(gs)]
    worst_duck = 0.0
    names = {f"s{k:04d}": k for k in range(SENSORS)}
    for k, (_, _, q) in got.items():
        gid = names[k[0]] * (PER_SENSOR // 3600 + 1) + int(k[1] * 1e6 - T0_US) // 3_600_000_000
        j = int(np.searchsorted(gs[bounds], gid))
        vals = vs[bounds[j]:ends[j]]
        lo, hi = np.searchsorted(vals, q, "left") / len(vals), np.searchsorted(vals, q, "right") / len(vals)
        assert lo - KLL_RANK_ERROR <= 0.95 <= hi + KLL_RANK_ERROR, (k, q, lo, hi)
        d = want[k][2]
        worst_duck = max(worst_duck, abs(np.searchsorted(vals, d) / len(vals) - 0.95))
    return worst_duck


async def run(root: str) -> list[Result]:
    db = await _open(root)
    try:
        await db.create_table("r", SCHEMA, indexes=["sensor", "ts", "v"])
        await db.create_table("k", KEYED)
        n = SENSORS * PER_SENSOR
        t0 = time.perf_counter()
        parts = []
        for i in range(0, n, BATCH):
            t = rows(i, min(BATCH, n - i))
            parts.append(t)
            await db.upsert("r", t)
            await db.upsert("k", t.drop_columns(["id"]))
        await db.checkpoint()
        print(f"  loaded {n:,} rows in process in {time.perf_counter() - t0:.1f} s", flush=True)
        data = pa.concat_tables(parts)
        path = os.path.join(root, "r.parquet")
        pq.write_table(data, path, compression="zstd")
        con = duckdb.connect()
        con.register("mem", data)
        await _timed(db, GROUP_BY, AGGS)  # the first request builds the visible sets
        ours, ours_s = await _timed(db, GROUP_BY, AGGS)
        pq_rows, pq_s = median_time(
            REPEAT, lambda: con.execute(SQL_BUCKETS.format(src=f"read_parquet('{path}')")).fetchall())
        mem_rows, mem_s = median_time(REPEAT, lambda: con.execute(SQL_BUCKETS.format(src="mem")).fetchall())
        duck_err = _check_buckets(ours, pq_rows, data)
        print(f"  buckets: ours {ours_s * 1e3:.0f} ms, DuckDB Parquet {pq_s * 1e3:.0f} ms, DuckDB Arrow "
              f"{mem_s * 1e3:.0f} ms; {ours.num_rows} groups; DuckDB approx_quantile's worst rank error "
              f"{duck_err:.4f}", flush=True)
        last, last_s = await _timed(db, ["sensor"], LAST)
        lp_rows, lp_s = median_time(
            REPEAT, lambda: con.execute(SQL_LAST.format(src=f"read_parquet('{path}')")).fetchall())
        lm_rows, lm_s = median_time(REPEAT, lambda: con.execute(SQL_LAST.format(src="mem")).fetchall())
        got = dict(zip(last.column("sensor").to_pylist(), last.column("last_v").to_pylist()))
        assert got == dict(lp_rows) == dict(lm_rows), "last values differ"
        print(f"  last: ours {last_s * 1e3:.0f} ms, DuckDB Parquet {lp_s * 1e3:.0f} ms, DuckDB Arrow "
              f"{lm_s * 1e3:.0f} ms", flush=True)
        t1 = time.perf_counter()
        await db.aggregate("k", ["sensor"], LAST)  # the first request builds the key index's view of the runs
        first_s = time.perf_counter() - t1
        keyed, keyed_s = await _timed(db, ["sensor"], LAST, "k")
        assert dict(zip(keyed.column("sensor").to_pylist(), keyed.column("last_v").to_pylist())) == got
        # the runs change (a checkpoint of rows of every sensor, rewritten: the same answer): the
        # next request builds the runs' view again
        again = pa.concat_tables([rows(s * PER_SENSOR, 1) for s in range(SENSORS)]).drop_columns(["id"])
        await db.upsert("k", again)
        await db.checkpoint()
        t1 = time.perf_counter()
        await db.aggregate("k", ["sensor"], LAST)
        publish_s = time.perf_counter() - t1
        print(f"  last, table keyed (sensor, ts): ours {keyed_s * 1e3:.1f} ms (the process's first request: "
              f"{first_s * 1e3:.0f} ms; the first after a checkpoint changed every partition's runs: "
              f"{publish_s * 1e3:.0f} ms)", flush=True)
    finally:
        await db.close()
    # what our side reads: row-format segments on the local block device (sealed at 64 MB, none
    # offloaded, so not columnar) with the column index; DuckDB reads one zstd Parquet file, or Arrow
    m = f"{n / 1e6:g}M readings ({SENSORS} sensors); ours: row segments on local disk + column index"
    extra = {"rows": n, "groups": ours.num_rows, "kll_rank_error": KLL_RANK_ERROR, "duckdb_worst_rank_error": duck_err}
    return [
        Result(f"group by sensor, bucket(ts, 1h): count, mean, quantile 0.95; {m}", 1 / ours_s,
               "DuckDB time_bucket + approx_quantile, zstd Parquet", 1 / pq_s, "queries/s", ">= 1x", extra),
        Result(f"same query, {m}", 1 / ours_s, "DuckDB, in-memory Arrow", 1 / mem_s, "queries/s", "report", extra),
        Result(f"last(v by ts) per sensor, {m}", 1 / last_s, "DuckDB arg_max(v, ts), zstd Parquet", 1 / lp_s,
               "queries/s", ">= 1x", {"rows": n}),
        Result(f"last(v by ts) per sensor, {m}", 1 / last_s, "DuckDB arg_max(v, ts), in-memory Arrow", 1 / lm_s,
               "queries/s", "report", {"rows": n}),
        Result(f"last(v by ts) per sensor, {n / 1e6:g}M readings; ours: the table keyed (sensor, ts), each sensor's "
               f"last key from the key index, its row read (the first request after a checkpoint, which builds "
               f"the runs' view again: {publish_s * 1e3:.0f} ms)", 1 / keyed_s, "DuckDB arg_max(v, ts), zstd Parquet",
               1 / lp_s, "queries/s", ">= 1x",
               {"rows": n, "first_request_s": first_s, "after_checkpoint_s": publish_s}),
        Result(f"last(v by ts) per sensor, {n / 1e6:g}M readings; ours: the table keyed (sensor, ts)", 1 / keyed_s,
               "DuckDB arg_max(v, ts), in-memory Arrow", 1 / lm_s, "queries/s", "report", {"rows": n}),
    ]


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tsagg-bench-") as root:
        print(f"time-series aggregates bench: {SENSORS} sensors x {PER_SENSOR:,} readings", flush=True)
        results = await run(root)
    print_table("Time-series aggregates (in process) vs DuckDB", results)
    print(f"\nJSON: {write_json('tsagg', results)}")
