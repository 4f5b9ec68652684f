"""Reads without a partition's leader (RFC 0010 §6), against the leader's own read, same run.

One partition of N rows (~60 encoded bytes each), half of them overwritten once, every
segment sealed and offloaded to a local object directory; reads as of the last commit:

* **Read plan**: the visible localids of every offloaded segment — from the key index (what
  the leader does) vs worked out from the objects alone (what any node does when the leader
  does not answer: reads every object's keys and timestamps).
* **Query**: every visible row — through the key index vs from the objects alone.

``BENCH_LEADERLESS_ROWS`` (default 200,000).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa

from bench.common import Result, Timer, print_table, write_json
from catalog.memory import MemoryCatalog
from rowstore.db.database import Database, TablesConfig
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

ROWS = int(os.environ.get("BENCH_LEADERLESS_ROWS", 200_000))
BATCH = 50_000
SCHEMA = "id int64 primary key, v int64, pad string"


def _rows(lo: int, hi: int, v: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"id": ids, "v": np.full(len(ids), v, np.int64),
                     "pad": pa.array([f"row-{i:012d}-{v}" for i in ids.tolist()])})


async def _db(root: str) -> Database:
    fs = TerrascaleFS(MemoryCatalog(), LocalBlockDevice(os.path.join(root, "block")),
                      LocalBlockDevice(os.path.join(root, "cache"), durable=False),
                      LocalObjectStore(os.path.join(root, "objects")), config=FsConfig())
    await fs.open()
    db = Database(fs, TablesConfig(partitions=1))
    await db.open()
    return db


async def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        db = await _db(root)
        await db.create_table("m", SCHEMA)
        for lo in range(0, ROWS, BATCH):
            await db.upsert("m", _rows(lo, min(ROWS, lo + BATCH), 1))
        await db.seal()
        await db.offload()
        for lo in range(0, ROWS // 2, BATCH):
            T = (await db.upsert("m", _rows(lo, min(ROWS // 2, lo + BATCH), 2))).commit_ts
        await db.seal()
        await db.offload()
        best = {k: float("inf") for k in ("plan_index", "plan_objects", "query_index", "query_objects")}
        for _ in range(3):
            with Timer() as t:
                plan = await db.read_plan("m", as_of=T, sealed_only=True)
            best["plan_index"] = min(best["plan_index"], t.seconds)
            with Timer() as t:
                slices = await db.plan_without_leader("m", T, [0])
            best["plan_objects"] = min(best["plan_objects"], t.seconds)
            with Timer() as t:
                a, _ = await db.query("m", as_of=T, limit=None)
            best["query_index"] = min(best["query_index"], t.seconds)
            with Timer() as t:
                b = await db.query_without_leader("m", T, [0])
            best["query_objects"] = min(best["query_objects"], t.seconds)
        assert a.num_rows == b.num_rows == ROWS and len(slices) == len(plan.sealed)
        await db.close()
        await db.fs.close()
    n = (f"{ROWS:,} rows + {ROWS // 2:,} overwrites, offloaded, 1 partition, in process, "
         "best of 3 (blocks cached on both sides)")
    res = [Result(f"read plan from the objects alone (no leader), {n}", best["plan_objects"] * 1000,
                  "read plan from the key index (the leader)", best["plan_index"] * 1000, "ms",
                  "report (degraded path)"),
           Result(f"query of every row from the objects alone (no leader), {n}", best["query_objects"] * 1000,
                  "the same query through the key index (the leader)", best["query_index"] * 1000, "ms",
                  "report (degraded path)")]
    print_table("Reads without a partition's leader (RFC 0010 §6)", res)
    write_json("leaderless", res)
