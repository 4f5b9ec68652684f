"""A node's reads of columnar segments (RFC 0014) against row-wise ones and against Parquet.

The same ``BENCH_COLUMNAR_ROWS`` rows (default 2M) of ten measurement-like columns
(``bench.segment_formats_bench.sample``) go into two engines (``Database`` on local folders:
block device, cache and object store as a node has them) — one writing row-wise sealed
segments, one columnar — and are sealed and offloaded; pyarrow writes them to a zstd Parquet
file. Then, peers in the same run:

* space: the offloaded objects' bytes against the row-wise objects' and the Parquet file's;
* the node's own scan of 3 of the 10 columns (``query`` with ``columns``, every row): rows/s
  and bytes fetched from the object store, against the row-wise engine and against pyarrow
  reading the same 3 columns of the Parquet file (``pq.read_table``; page cache warm): each
  side's median of three runs after one not timed;
* point reads of random keys (``get``), all in offloaded segments: p50 and p99 against the
  row-wise engine, each engine restarted with an empty block cache first (the scan before
  had cached every row-wise block but only 3 of 10 columns' pages), so neither reads a key's
  pages from the cache the first time.

``python -m bench columnar`` (or ``python -m bench.columnar_node_bench [ROWS]``).
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Result, print_table, write_json
from bench.segment_formats_bench import SAMPLE_SCHEMA_TEXT, sample
from catalog.memory import MemoryCatalog
from rowstore.db.database import Database, TablesConfig
from rowstore.segments.decoded_pages import DECODED
from rowstore.segments.store import SegState
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

SCAN = ["ts", "lat", "speed"]
GETS = 2000
CHUNK = 100_000


class CountingObjects(LocalObjectStore):
    """The local object store, counting the bytes ranged reads fetch."""

    fetched = 0

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.fetched += length
        return await super().get_range(key, offset, length)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.fetched += sum(n for _, n in ranges)
        return await super().get_ranges(key, ranges)


async def _open(root: str, columnar: bool, catalog: MemoryCatalog, objects: CountingObjects,
                cache: str) -> Database:
    fs = TerrascaleFS(catalog, LocalBlockDevice(f"{root}/block"), LocalBlockDevice(f"{root}/{cache}", durable=False),
                      objects, config=FsConfig())
    await fs.open()
    db = Database(fs, TablesConfig(partitions=2, columnar=columnar), lambda: int(time.time() * 1000))
    await db.open()
    return db


async def restarted(db: Database, root: str, columnar: bool) -> Database:
    """``db`` closed and opened again on the same catalog, device and objects with an empty
    block cache (a new cache device) and no decoded pages: both engines' point reads start cold."""
    await db.close()
    DECODED.clear()  # the process's decoded pages
    return await _open(root, columnar, db.fs.catalog, db.fs.objects, "cache-after-restart")


async def engine(root: str, columnar: bool, src: pa.RecordBatch) -> tuple[Database, CountingObjects, int]:
    """An engine holding ``src`` in offloaded segments: (engine, its object store, object bytes)."""
    objects = CountingObjects(f"{root}/objects")
    db = await _open(root, columnar, MemoryCatalog(), objects, "cache")
    fs = db.fs
    await db.create_table("t", SAMPLE_SCHEMA_TEXT)
    for a in range(0, src.num_rows, CHUNK):
        await db.upsert("t", src.slice(a, CHUNK))
    await db.checkpoint()
    await db.seal()
    await db.offload()
    recs = [r for r in await db.store.list() if r.state == SegState.OFFLOADED]
    assert {r.format for r in recs} == {2 if columnar else 1}
    size = sum([(await fs.stat(r.inode)).object_size for r in recs])
    return db, objects, size


async def scan(db: Database, objects: CountingObjects, n: int) -> tuple[float, int]:
    """The median seconds of three scans of 3 columns of every row after one not timed (steady
    state, as for pyarrow's), and the bytes one fetched."""
    await db.query("t", columns=SCAN, limit=None)
    times, fetched = [], []
    for _ in range(3):
        before = objects.fetched
        t0 = time.perf_counter()
        got, _ = await db.query("t", columns=SCAN, limit=None)
        times.append(time.perf_counter() - t0)
        fetched.append(objects.fetched - before)
        assert got.num_rows == n and got.column_names == SCAN
    return statistics.median(times), int(statistics.median(fetched))


async def gets(db: Database, keys: list[int]) -> tuple[float, float]:
    lat = []
    for k in keys:
        t0 = time.perf_counter()
        row = await db.get("t", k)
        lat.append(time.perf_counter() - t0)
        assert row is not None and row["id"] == k
    return float(np.percentile(lat, 50)) * 1e6, float(np.percentile(lat, 99)) * 1e6


def parquet_scan(path: str, n: int) -> float:
    pq.read_table(path, columns=SCAN)  # steady state: one run not timed
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        t = pq.read_table(path, columns=SCAN)
        times.append(time.perf_counter() - t0)
        assert t.num_rows == n
    return statistics.median(times)


async def main(n: int | None = None) -> list[Result]:
    n = n or int(os.environ.get("BENCH_COLUMNAR_ROWS", "2000000"))
    src = sample(n)
    keys = np.random.default_rng(9).integers(0, n, GETS).tolist()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", ".")) as root:
        path = f"{root}/rows.parquet"
        pq.write_table(pa.Table.from_batches([src]), path, compression="zstd")
        pq_bytes = os.path.getsize(path)
        pq_s = parquet_scan(path, n)
        out = {}
        for name, columnar in (("rows", False), ("columnar", True)):
            db, objects, size = await engine(f"{root}/{name}", columnar, src)
            scan_s, fetched = await scan(db, objects, n)
            db = await restarted(db, f"{root}/{name}", columnar)  # the scan cached all of row-wise blocks
            p50, p99 = await gets(db, keys)
            out[name] = {"bytes": size, "scan_s": scan_s, "fetched": fetched, "p50": p50, "p99": p99}
            await db.close()
    c, r = out["columnar"], out["rows"]
    results = [
        Result("bytes at rest: columnar segments / row-wise", c["bytes"] / 1e6, "row-wise segments", r["bytes"] / 1e6,
               "MB"),
        Result("bytes at rest: columnar segments / zstd Parquet", c["bytes"] / 1e6, "zstd Parquet (pyarrow)",
               pq_bytes / 1e6, "MB", "<= 1.1x"),
        Result("node scan of 3 of 10 columns, every row", n / c["scan_s"], "row-wise segments", n / r["scan_s"],
               "rows/s"),
        Result("bytes fetched by that scan", c["fetched"] / 1e6, "row-wise segments", r["fetched"] / 1e6, "MB",
               "<= 0.33x"),
        Result("node scan of 3 of 10 columns / pyarrow", n / c["scan_s"], "pq.read_table, 3 columns, zstd",
               n / pq_s, "rows/s", ">= 1x"),
        Result("point get of a random key, offloaded: p50", c["p50"], "row-wise segments", r["p50"], "us", "<= 1.25x"),
        Result("point get of a random key, offloaded: p99", c["p99"], "row-wise segments", r["p99"], "us", "<= 1.25x"),
    ]
    print_table(f"a node's reads of columnar segments, {n:,} rows x 10 columns", results)
    write_json("columnar", results)
    return results


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
