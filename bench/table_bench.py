"""Tables, peers in the same run.

* point get by primary key, hot (memtable) and after a restart (runs + sealed segments
  read back through the block cache) — vs RocksDB (rocksdict) ``get`` of the same keys
  holding the same row bytes (also: RocksDB get + the row decoded to the same dict, for
  what a RocksDB user pays to read a row); single gets and 1000-key ``get_many`` batches
  (vs RocksDB ``get`` of a key list);
* bounding-box query selecting 0.1 %, 1 % and 10 % of 10M points — vs the same table's
  full scan path (the query with no index), vs a numpy filter over the coordinates in
  memory, and vs DuckDB filtering the same Arrow table;
* upsert throughput with the primary-key and column indexes maintained, on the durable
  default catalog (``trkv://``: a multi-partition group's commit decision is fsync'd) —
  vs the raw append rate of the row store (one active segment, same batches, same four
  clients, every batch fdatasync'd before it is acknowledged on both sides).

Medians of alternating rounds: the VM is noisy. ``BENCH_POINTS`` shrinks the bbox table.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import tempfile

import duckdb
import numpy as np
import pyarrow as pa
from rocksdict import Options, Rdict

from bench.common import Result, Timer, print_table, write_json
from bench.rowcodec_bench import SCHEMA as ROW_SCHEMA, sample
from catalog.local import LocalCatalog
from catalog.memory import MemoryCatalog
from rowstore.segments.active import ActiveSegment
from rowstore.db.database import Database, TablesConfig
from rowstore.codec.point_decoder import PointDecoder
from rowstore.codec.rows import encode_rows
from terrafs.active import ActiveConfig, ActiveFile
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.blocks import Codec
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.params import new_params

N_GET = 300_000
GETS = 20_000
POINTS = int(os.environ.get("BENCH_POINTS", 10_000_000))
UPSERT_ROWS = 1_000_000
BATCH = 10_000
COLS = "id int64 primary key, lat float64, lon float64, ts timestamp, name string"


class Node:
    """A node's tables on local disks under ``root``; reopen() is a restart. ``durable``: the
    default ``trkv://`` catalog under ``root`` (commit decisions fsync'd), else in memory."""

    def __init__(self, root: str, durable: bool = False):
        self.root, self.durable = root, durable
        self.catalog = LocalCatalog(os.path.join(root, "catalog")) if durable else MemoryCatalog()

    async def open(self, **cfg) -> Database:
        r = self.root
        if self.durable:
            await self.catalog.open()
        self.fs = TerrascaleFS(self.catalog, LocalBlockDevice(f"{r}/block"),
                               LocalBlockDevice(f"{r}/cache", durable=False), LocalObjectStore(f"{r}/objects"),
                               config=FsConfig(cache_memory_bytes=512 << 20))
        await self.fs.open()
        self.db = Database(self.fs, TablesConfig(**cfg))
        await self.db.open()
        return self.db

    async def close(self) -> None:
        await self.db.close()
        await self.fs.close()
        if self.durable:
            await self.catalog.close()


def _median_rate(n: int, times: list[float]) -> float:
    return n / statistics.median(times)


# -- point gets ------------------------------------------------------------------------------


async def point_gets(root: str) -> list[Result]:
    src = sample(N_GET)
    node = Node(root)
    db = await node.open()
    await db.create_table("g", COLS)
    for i in range(0, N_GET, BATCH):
        await db.upsert("g", src.slice(i, BATCH))
    keys = src.column("id").to_numpy()
    pick = keys[np.random.default_rng(5).integers(0, N_GET, GETS)]
    pick_list = pick.tolist()
    schema = (await db.catalog_tables.describe("g")).schema
    rocks = _Rocks(os.path.join(root, "rocks"), keys, encode_rows(src, schema, 1),
                   PointDecoder(lambda v: schema, schema))
    out = []
    try:
        hot = await _get_rounds(db, pick_list, pick, rocks)
        await db.checkpoint()
        await db.seal()
        await db.offload()
        await node.close()
        db = await node.open()  # restart: key index from its runs, rows from offloaded segments
        cold_first = await _single_pass(db, pick_list[:5000])
        after = await _get_rounds(db, pick_list, pick, rocks)
    finally:
        rocks.close()
        await node.close()
    for label, (single, many, r1, rmany, rdec) in (("hot (memtable, active segments)", hot),
                                                   ("after restart (runs, offloaded segments)", after)):
        out += [Result(f"point get by key, {label}", single, "RocksDB get", r1, "gets/s", ">= 1.0x"),
                Result(f"point get by key, {label}", single, "RocksDB get + the same row decoded to a dict",
                       rdec, "gets/s", "report"),
                Result(f"get_many by key (1000 per call), {label}", many, "RocksDB get of 1000 keys", rmany,
                       "keys/s", ">= 1.0x")]
    out.append(Result("point get, first 5000 after restart (block cache empty)", cold_first, "RocksDB get",
                      after[2], "gets/s", "report"))
    return out


async def _single_pass(db, keys) -> float:
    with Timer() as t:
        for k in keys:
            await db.get("g", k)
    return len(keys) / t.seconds


async def _get_rounds(db, pick_list, pick, rocks, rounds: int = 3):
    single, many, r1, rmany, rdec = [], [], [], [], []
    await _single_pass(db, pick_list[:2000])  # warm
    for _ in range(rounds):
        with Timer() as t:
            for k in pick_list:
                await db.get("g", k)
        single.append(t.seconds)
        with Timer() as t:
            for i in range(0, GETS, 1000):
                await db.get_many("g", pa.array(pick[i : i + 1000]))
        many.append(t.seconds)
        r1.append(rocks.gets(pick_list))
        rmany.append(rocks.get_lists(pick_list))
        rdec.append(rocks.gets_decoded(pick_list))
    n = len(pick_list)
    return (_median_rate(n, single), _median_rate(n, many), _median_rate(n, r1), _median_rate(n, rmany),
            _median_rate(n, rdec))


class _Rocks:
    """RocksDB holding our encoded row bytes under the same keys; ``decode`` turns a row's
    bytes into the dict our get returns (what a RocksDB user would still have to do)."""

    def __init__(self, path: str, keys: np.ndarray, rows, decode):
        self.path, self.db, self.decode = path, Rdict(path, Options()), decode
        ends = np.append(rows.starts, rows.nbytes)
        for k, a, b in zip(keys.tolist(), ends[:-1].tolist(), ends[1:].tolist()):
            self.db[k.to_bytes(8, "big", signed=True)] = rows.buf[a:b].tobytes()
        self.db.flush()

    def gets_decoded(self, keys) -> float:
        bk = [k.to_bytes(8, "big", signed=True) for k in keys]
        db, decode = self.db, self.decode
        with Timer() as t:
            for k in bk:
                decode(db[k], "rocksdb")
        return t.seconds

    def gets(self, keys) -> float:
        bk = [k.to_bytes(8, "big", signed=True) for k in keys]
        with Timer() as t:
            for k in bk:
                self.db[k]
        return t.seconds

    def get_lists(self, keys) -> float:
        bk = [k.to_bytes(8, "big", signed=True) for k in keys]
        with Timer() as t:
            for i in range(0, len(bk), 1000):
                self.db[bk[i : i + 1000]]
        return t.seconds

    def close(self):
        self.db.close()
        Rdict.destroy(self.path)


# -- bounding boxes ----------------------------------------------------------------------------


def _points(n: int):
    rng = np.random.default_rng(11)
    x, y = rng.uniform(0, 1000, n), rng.uniform(0, 1000, n)
    return pa.table({"id": pa.array(np.arange(n), pa.int64()),
                     "loc": pa.StructArray.from_arrays([pa.array(x), pa.array(y)], names=["x", "y"]),
                     "v": pa.array(rng.normal(size=n))}), x, y


async def bboxes(root: str) -> list[Result]:
    data, x, y = _points(POINTS)
    node = Node(root)
    db = await node.open(memtable_bytes=1 << 30)
    await db.create_table("pts", "id int64 primary key, loc point, v float64", indexes=["loc"])
    await db.create_table("raw", "id int64 primary key, loc point, v float64")  # the full-scan path
    for name in ("pts", "raw"):
        for i in range(0, POINTS, 100_000):
            await db.upsert(name, data.slice(i, 100_000))
    await db.checkpoint()
    await db.seal()
    await db.offload()
    con = duckdb.connect()
    con.register("pts", data.flatten())
    out = []
    for share in (0.001, 0.01, 0.1):
        side = 1000 * share ** 0.5
        box = {"column": "loc", "xmin": 300.0, "ymin": 300.0, "xmax": 300.0 + side, "ymax": 300.0 + side}
        ours, scan, npy, duck = [], [], [], []
        for _ in range(3):
            with Timer() as t:
                got, _ = await db.query("pts", bbox=box, columns=["id"], limit=None)
            ours.append(t.seconds)
            with Timer() as t:
                full, _ = await db.query("raw", bbox=box, columns=["id"], limit=None)
            scan.append(t.seconds)
            with Timer() as t:
                m = (x >= box["xmin"]) & (x <= box["xmax"]) & (y >= box["ymin"]) & (y <= box["ymax"])
                data.column("id").filter(pa.array(m))
            npy.append(t.seconds)
            with Timer() as t:
                con.sql("select id from pts where \"loc.x\" between ? and ? and \"loc.y\" between ? and ?",
                        params=[box["xmin"], box["xmax"], box["ymin"], box["ymax"]]).to_arrow_table()
            duck.append(t.seconds)
        assert got.num_rows == full.num_rows == int(m.sum())
        q = statistics.median(ours)
        label = f"bbox {share:.1%} of {POINTS / 1e6:g}M points ({got.num_rows} rows)"
        out += [Result(label, 1 / q, "same table, no index (full scan path)", 1 / statistics.median(scan),
                       "queries/s", ">= 20x at 0.1%" if share == 0.001 else "report"),
                Result(label, 1 / q, "numpy filter of the coordinates in memory", 1 / statistics.median(npy),
                       "queries/s", "report"),
                Result(label, 1 / q, "DuckDB filter on the same Arrow table", 1 / statistics.median(duck),
                       "queries/s", "report")]
    await node.close()
    return out


# -- upserts with indexes ------------------------------------------------------------------------


async def upserts(root: str, rounds: int = 5) -> list[Result]:
    """Medians of alternating rounds (the order flips each round: this VM's disk speed drifts
    with what was written before)."""
    src = sample(UPSERT_ROWS)
    batches = [src.slice(i, BATCH) for i in range(0, UPSERT_ROWS, BATCH)]
    ours, raw = [], []

    async def table_round(rnd):
        node = Node(os.path.join(root, f"u{rnd}"), durable=True)  # trkv://, the default catalog
        db = await node.open()
        await db.create_table("u", COLS, indexes=["ts", "name"])
        with Timer() as t:
            await _clients(4, batches, lambda b: db.upsert("u", b))
        ours.append(t.seconds)
        await node.close()

    async def raw_round(rnd):
        seg = await _raw_segment(os.path.join(root, f"r{rnd}"))
        with Timer() as t:
            await _clients(4, batches, lambda b: seg.append(b, ROW_SCHEMA, 1))
        raw.append(t.seconds)
        await seg.file.close()

    for rnd in range(rounds):
        for step in ((table_round, raw_round) if rnd % 2 == 0 else (raw_round, table_round)):
            await step(rnd)
    return [Result("upsert 10k-row batches, 4 clients, key + 2 column indexes, durable trkv:// catalog",
                   _median_rate(UPSERT_ROWS, ours), "raw row-store append (one active segment, same 4 clients)",
                   _median_rate(UPSERT_ROWS, raw), "rows/s",
                   ">= 0.5x", {"ours_s": ours, "raw_s": raw})]


async def _clients(n: int, batches, call) -> None:
    async def client(mine):
        for b in mine:
            await call(b)
    await asyncio.gather(*(client(batches[i::n]) for i in range(n)))


async def _raw_segment(root: str) -> ActiveSegment:
    dev = LocalBlockDevice(root)
    p = new_params(1, 1, codec=Codec.NONE, block_size=64 * 1024, page_size=4096)
    af = await ActiveFile.create(dev, "seg.act", p, None, ActiveConfig(flush_bytes=64 * 1024, flush_ms=2))
    return ActiveSegment(1, af, af.where)


async def main() -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", ".")) as root:
        results += await upserts(os.path.join(root, "up"))
        results += await point_gets(os.path.join(root, "get"))
        results += await bboxes(os.path.join(root, "bbox"))
    print_table("Tables", results)
    print(f"\nJSON: {write_json('table', results)}")
    return results


if __name__ == "__main__":
    asyncio.run(main())
