"""Garbage collection and clustered rewrites (RFC 0009), peers in the same run.

* **Space amplification**: N rows of ~140 encoded bytes, then R rounds overwriting a random
  30% of the keys (each round sealed and offloaded), then GC passes to quiescence (history
  kept 0 s, grace 0 s). (bytes in the object store + block device) / (bytes of the live rows,
  encoded the same way) — vs RocksDB (rocksdict) holding the same keys and row bytes, written
  in the same rounds, after ``compact_range``, compressing with zstd at our level (not its
  default Snappy).
* **Ingest while GC runs**: upserts of overwrite batches with GC passes running meanwhile vs
  the same upserts with no GC (same table state, same batches).
* **GC copy rate**: MB/s of live rows relocated, per row, and the pass's time by phase.
* **Queries after clustering**: P points with ``cluster_by`` the point column (and a
  column index on it), rewritten by GC; bbox at 0.1%, 1%, 10% — vs DuckDB ``read_parquet``
  of the same rows in a zstd Parquet file, and vs DuckDB on the same Arrow table in memory.
  The same for a 1-hour window of a 30-day table with ``cluster_by`` the timestamp.

Defaults finish in a few minutes on 2 shared cores; the issue's sizes:
``BENCH_GC_ROWS=1000000 BENCH_GC_ROUNDS=10 BENCH_GC_POINTS=10000000``.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rocksdict import DBCompressionType, Options, Rdict

from bench.common import Result, Timer, print_table, write_json
from bench.gc_workload import BATCH, ROUNDS, ROWS, SCHEMA, dir_bytes, rows_of
from catalog.memory import MemoryCatalog
from rowstore.codec.rows import encode_rows
from terrafs.blocks import ZSTD_LEVEL
from rowstore.db.database import Database, TablesConfig
from rowstore.db.background.gc import GcConfig
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

POINTS = int(os.environ.get("BENCH_GC_POINTS", 1_000_000))


async def _open(root: str, **cfg) -> tuple[TerrascaleFS, Database]:
    fs = TerrascaleFS(MemoryCatalog(), LocalBlockDevice(f"{root}/block"),
                      LocalBlockDevice(f"{root}/cache", durable=False), LocalObjectStore(f"{root}/objects"),
                      config=FsConfig(cache_memory_bytes=512 << 20))
    await fs.open()
    db = Database(fs, TablesConfig(**cfg))
    await db.open()
    return fs, db


async def _gc_to_quiescence(db: Database) -> tuple[int, float]:
    rows, t0 = 0, time.perf_counter()
    for _ in range(50):
        res = await db.collect_garbage()
        rows += res["rows_copied"]
        if not res["segments_collected"] and not res["deleted"]:
            break
    return rows, time.perf_counter() - t0


def _rocks_options() -> Options:
    """RocksDB compressing as our sealed segments do: zstd at our level on every level (its
    default is Snappy, which compares a weaker codec with ours)."""
    o = Options()
    o.set_compression_type(DBCompressionType.zstd())
    o.set_bottommost_compression_type(DBCompressionType.zstd())
    o.set_compression_options(-14, ZSTD_LEVEL, 0, 0)
    return o


async def space_and_ingest(root: str) -> list[Result]:
    fs, db = await _open(root, partitions=4, seal_bytes=8 << 20, retention_ms=0,
                         gc=GcConfig(min_garbage=0.2, grace_s=0.0, max_bytes_per_run=256 << 20))
    await db.create_table("s", SCHEMA)
    schema = (await db.describe("s")).schema
    rocks = Rdict(f"{root}/rocks", _rocks_options())
    rng = np.random.default_rng(1)

    async def write(keys: np.ndarray, gen: int, both: bool = True) -> None:
        for i in range(0, len(keys), BATCH):
            t = rows_of(keys[i:i + BATCH], gen, rng)
            await db.upsert("s", t)
            if both:
                enc = encode_rows(t, schema, 1)
                for k, a, b in zip(t.column("id").to_pylist(), enc.starts, np.append(enc.starts[1:], enc.nbytes)):
                    rocks[int(k).to_bytes(8, "big")] = enc.buf[a:b].tobytes()

    await write(np.arange(ROWS), 0)
    await db.seal()
    await db.offload()
    for r in range(1, ROUNDS + 1):
        await write(np.sort(rng.choice(ROWS, ROWS * 3 // 10, replace=False)), r)
        await db.seal()
        await db.offload()

    # ingest with and without GC passes running (same table, same number of rows)
    n_ingest = min(ROWS, 100_000)
    batches = [np.sort(rng.choice(ROWS, BATCH, replace=False)) for _ in range(n_ingest // BATCH)]
    with Timer() as base:
        for i, keys in enumerate(batches):
            await write(keys, 100 + i, both=False)
    stop = asyncio.Event()

    async def gc_loop():
        while not stop.is_set():
            await db.collect_garbage()
            await asyncio.sleep(0)

    gc_task = asyncio.ensure_future(gc_loop())
    with Timer() as during:
        for i, keys in enumerate(batches):
            await write(keys, 200 + i, both=False)
    stop.set()
    await gc_task
    # write the same last versions to RocksDB (the ingest rounds above only went to us)
    final, _ = await db.read_all("s")
    enc = encode_rows(final, schema, 1)
    for k, a, b in zip(final.column("id").to_pylist(), enc.starts, np.append(enc.starts[1:], enc.nbytes)):
        rocks[int(k).to_bytes(8, "big")] = enc.buf[a:b].tobytes()

    await db.seal()
    await db.offload()
    await _gc_to_quiescence(db)
    tot = db.gc.totals  # every pass of the run (those during the ingest did most of the copying)
    copied, copied_bytes, secs = tot["rows_copied"], tot["bytes_copied"], tot["run_seconds"]
    phases = {k: round(v, 3) for k, v in db.gc.phases.items()}
    await db.checkpoint()
    live = encode_rows(final, schema, 1).nbytes
    ours = (dir_bytes(f"{root}/objects") + dir_bytes(f"{root}/block")) / live
    rocks.compact_range(None, None)
    rocks.flush()
    rocks.close()
    peer = dir_bytes(f"{root}/rocks") / live
    await db.close()
    await fs.close()
    rate = copied_bytes / secs / 1e6 if secs else 0.0
    ingest_mb = n_ingest * (live / len(final)) / base.seconds / 1e6  # the same rows, encoded, ingested
    return [
        Result(f"space amplification, {ROWS / 1e6:g}M rows x {ROUNDS} rounds of 30% overwrites, GC to quiescence",
               ours, "RocksDB after compact_range (same rows, same encoding, zstd at our level)", peer, "x live bytes",
               "<= 1.25x and <= RocksDB + 0.1", {"live_bytes": live}),
        Result(f"ingest while GC runs ({n_ingest} rows in {BATCH}-row batches)", n_ingest / during.seconds,
               "the same ingest without GC", n_ingest / base.seconds, "rows/s", ">= 0.7x"),
        Result(f"GC copy rate ({copied} rows, {copied_bytes / 1e6:.1f} MB in {tot['runs']} passes, "
               f"{secs / max(copied, 1) * 1e6:.1f} µs per row)", rate,
               "ingest of the same rows without GC (encoded MB/s)", ingest_mb, "MB/s", "report",
               {"seconds_by_phase": phases}),
    ]


# -- queries after clustering -------------------------------------------------------------------


async def _clustered(root: str, name: str, schema: str, data: pa.Table, col: str) -> Database:
    fs, db = await _open(root, partitions=4, seal_bytes=16 << 20, memtable_bytes=1 << 30, retention_ms=0,
                         gc=GcConfig(min_garbage=0.5, grace_s=0.0, max_bytes_per_run=1 << 40))
    await db.create_table(name, schema, indexes=[col], cluster_by=col)
    for i in range(0, data.num_rows, 100_000):
        await db.upsert(name, data.slice(i, 100_000))
    await db.seal()
    await db.upsert(name, data.slice(0, 1))  # a newer segment: the last full one is not the newest
    await db.seal()
    await db.offload()
    await _gc_to_quiescence(db)
    db._fs = fs
    return db


async def _compare(db: Database, name: str, label: str, ours_q, duck_sql: str, params, parquet: str,
                   arrow: pa.Table) -> list[Result]:
    con = duckdb.connect()
    con.register("mem", arrow)
    ours, disk, mem = [], [], []
    got = None
    for _ in range(3):
        with Timer() as t:
            got = await ours_q()
        ours.append(t.seconds)
        with Timer() as t:
            d = con.sql(duck_sql.format(src=f"read_parquet('{parquet}')"), params=params).to_arrow_table()
        disk.append(t.seconds)
        with Timer() as t:
            con.sql(duck_sql.format(src="mem"), params=params).to_arrow_table()
        mem.append(t.seconds)
    assert got.num_rows == d.num_rows, (got.num_rows, d.num_rows)
    q = 1 / statistics.median(ours)
    label = f"{label} ({got.num_rows} rows)"
    return [Result(label, q, "DuckDB read_parquet (zstd file)", 1 / statistics.median(disk), "queries/s", ">= 1x"),
            Result(label, q, "DuckDB on the Arrow table in memory", 1 / statistics.median(mem), "queries/s",
                   "report")]


async def clustered_queries(root: str) -> list[Result]:
    rng = np.random.default_rng(3)
    x, y = rng.uniform(0, 1000, POINTS), rng.uniform(0, 1000, POINTS)
    pts = pa.table({"id": pa.array(np.arange(POINTS), pa.int64()),
                    "loc": pa.StructArray.from_arrays([pa.array(x), pa.array(y)], names=["x", "y"]),
                    "v": pa.array(rng.uniform(0, 1, POINTS))})
    flat = pa.table({"id": pts.column("id"), "x": pa.array(x), "y": pa.array(y), "v": pts.column("v")})
    pq.write_table(flat, f"{root}/pts.parquet", compression="zstd")
    db = await _clustered(f"{root}/p", "pts", "id int64 primary key, loc point, v float64", pts, "loc")
    out = []
    for share in (0.001, 0.01, 0.1):
        side = 1000 * share ** 0.5
        box = {"column": "loc", "xmin": 300.0, "ymin": 300.0, "xmax": 300.0 + side, "ymax": 300.0 + side}

        async def ours(box=box):
            return (await db.query("pts", bbox=box, columns=["id", "v"], limit=None))[0]

        out += await _compare(db, "pts", f"bbox {share:.1%} of {POINTS / 1e6:g}M points, cluster_by loc", ours,
                              "select id, v from {src} where x between ? and ? and y between ? and ?",
                              [box["xmin"], box["xmax"], box["ymin"], box["ymax"]], f"{root}/pts.parquet", flat)
    await db.close()
    await db._fs.close()

    day_us = 86_400_000_000
    ts = np.sort(rng.integers(0, 30 * day_us, POINTS))
    rng.shuffle(ts)  # arrival order is not time order
    tt = pa.table({"id": pa.array(np.arange(POINTS), pa.int64()), "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                   "v": pa.array(rng.uniform(0, 1, POINTS))})
    pq.write_table(tt, f"{root}/ts.parquet", compression="zstd")
    db = await _clustered(f"{root}/t", "ev", "id int64 primary key, ts timestamp, v float64", tt, "ts")
    lo = 15 * day_us
    hi = lo + 3_600_000_000

    async def window():
        return (await db.query("ev", where=[["ts", ">=", lo], ["ts", "<", hi]], columns=["id", "v"],
                               limit=None))[0]

    out += await _compare(db, "ev", f"1-hour window of a 30-day table, {POINTS / 1e6:g}M rows, cluster_by ts",
                          window, "select id, v from {src} where ts >= make_timestamp(?) and ts < make_timestamp(?)",
                          [lo, hi], f"{root}/ts.parquet", tt)
    await db.close()
    await db._fs.close()
    return out


async def main() -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", ".")) as root:
        os.makedirs(f"{root}/space")
        results += await space_and_ingest(f"{root}/space")
        os.makedirs(f"{root}/q/p")
        os.makedirs(f"{root}/q/t")
        results += await clustered_queries(f"{root}/q")
    print_table("Garbage collection and clustered rewrites", results)
    for r in results:
        if r.extra:
            print(f"  {r.workload}: {r.extra}")
    print(f"\nJSON: {write_json('gc', results)}")
    return results


if __name__ == "__main__":
    asyncio.run(main())
