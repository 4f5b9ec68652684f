"""kill -9 a process that upserts, deletes, checkpoints and merges a table on local disks.

The kill lands while a checkpoint or a merge is running (right after the child
announces it, after a varying delay). After a restart every acknowledged batch is
there, the one batch in flight is there entirely or not at all, and the indexes
agree with a scan.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from catalog.local import LocalCatalog
from rowstore.db.database import Database, TablesConfig
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

CHILD = textwrap.dedent("""
    import asyncio, sys, time
    import terrafs.fs
    from rowstore.index.key_index import PartitionIndex
    from tests.rowstore.db.test_tables_kill9 import open_db, batch_of

    real_fp, real_collect = terrafs.fs.failpoint, PartitionIndex._collect

    def slow_point(name):  # a run file (key or column) is built and uploaded, not yet published
        if name == "offload.after_upload":
            print("built", flush=True)
            time.sleep(0.02)
        real_fp(name)

    async def slow_collect(self):  # a merge published its run; the replaced ones are not yet deleted
        if self.manifest.garbage:
            print("collect", flush=True)
            time.sleep(0.02)
        await real_collect(self)

    terrafs.fs.failpoint, PartitionIndex._collect = slow_point, slow_collect

    async def main(root):
        db = await open_db(root)
        if not await db.list_tables():
            await db.create_table("t", "id int64 primary key, v float64, p point", indexes=["v", "p"])
        b = 0
        while True:
            kind, keys, tbl = batch_of(b)
            print(f"start {b}", flush=True)
            res = await (db.delete("t", keys) if kind == "del" else db.upsert("t", tbl))
            print(f"ack {b} {res.commit_ts}", flush=True)
            b += 1
            if b % 6 == 0:
                print("checkpoint", flush=True)
                await db.checkpoint()
            if b % 15 == 0:
                print("merge", flush=True)
                for p in db.tables.partitions():
                    if sum(1 for lv, _ in p.index.runs if lv == 0) >= 2:
                        await p.index.merge(0, db.horizon())

    asyncio.run(main(sys.argv[1]))
""")


def batch_of(b: int):
    rng = np.random.default_rng(b)
    keys = sorted(rng.choice(400, size=30, replace=False).tolist())
    if b % 5 == 4:
        return "del", keys, None
    tbl = pa.table({"id": pa.array(keys, pa.int64()), "v": pa.array([float(b)] * len(keys)),
                    "p": pa.StructArray.from_arrays([pa.array(rng.uniform(0, 10, len(keys))),
                                                     pa.array(rng.uniform(0, 10, len(keys)))], names=["x", "y"])})
    return "put", keys, tbl


async def open_db(root: str) -> Database:
    cat = LocalCatalog(os.path.join(root, "catalog"))
    await cat.open()
    fs = TerrascaleFS(cat, LocalBlockDevice(os.path.join(root, "block")),
                      LocalBlockDevice(os.path.join(root, "cache"), durable=False),
                      LocalObjectStore(os.path.join(root, "objects")), config=FsConfig(sealed_block_size=4096))
    await fs.open()
    db = Database(fs, TablesConfig(partitions=4))
    await db.open()
    return db


def run_child(root, marker: str, nth: int, delay: float) -> tuple[int, str | None]:
    """Run until the nth ``marker`` line (+ delay), kill -9; returns (acked batches, in flight).
    The child sleeps 20 ms after printing ``built`` or ``collect``: the kill lands in that step."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, root], stdout=subprocess.PIPE, text=True)
    acked, started, seen = 0, None, 0
    try:
        for line in proc.stdout:
            word = line.split()
            if word[0] == "ack":
                acked = int(word[1]) + 1
            elif word[0] == "start":
                started = int(word[1])
            elif word[0] == marker:
                seen += 1
                if seen == nth:
                    time.sleep(delay)
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return acked, started


@pytest.mark.slow
@pytest.mark.parametrize("marker,nth,delay", [
    ("checkpoint", 1, 0.0),  # as a checkpoint starts
    ("built", 2, 0.0),  # checkpoint: column run built, key run not yet
    ("built", 5, 0.0),  # checkpoint: a run built, the manifest not yet swapped
    ("merge", 1, 0.002),  # as a merge starts
    ("collect", 1, 0.0),  # merge: new run published, replaced runs not yet deleted
])
async def test_kill9_during_checkpoint_and_merge(tmp_path, marker, nth, delay):
    root, state = str(tmp_path), {}
    for rnd in range(2):  # kill, restart and write on (batches numbered from 0 again), kill again
        acked, _ = run_child(root, marker, nth, delay)
        db = await open_db(root)
        got = {r["id"]: r["v"] for r in (await db.read_all("t"))[0].to_pylist()}
        without = apply(range(acked), state)
        if got != without:  # then the batch in flight made it, whole
            assert got == apply(range(acked + 1), state), f"round {rnd}: a partial or lost batch"
        via_index, _ = await db.query("t", where=[["v", ">=", 0.0]], limit=None)
        assert {r["id"]: r["v"] for r in via_index.to_pylist()} == got
        assert await leaked_files(db) == set()
        state = got
        await db.fs.close()
        await db.catalog.close()


def apply(batches, base: dict) -> dict:
    state = dict(base)
    for b in batches:
        kind, keys, _ = batch_of(b)
        for k in keys:
            if kind == "del":
                state.pop(k, None)
            else:
                state[k] = float(b)
    return state


async def leaked_files(db) -> set[int]:
    """Files no manifest or segment names (a run built by an interrupted step, not cleaned)."""
    named = {r.inode for r in await db.store.list()}
    for e in await db.catalog.scan("idx/"):
        if e.key.endswith("/manifest"):
            m = json.loads(e.value)
            named |= {r["inode"] for r in m["runs"]} | {i for r in m["runs"] for i in r.get("cols", {}).values()}
            named |= set(m.get("garbage", []))
    assert not [e.key for e in await db.catalog.scan("idx/") if "/pending/" in e.key]
    return {f.inode for f in await db.fs.list()} - named
