"""Garbage collection on three nodes (RFC 0009, "Who collects"): the one-node GC workload of
``bench/gc_bench.py`` run through three real ``terrascale node run`` processes on one Raft
catalog and one object store, every node collecting the partitions it serves.

* **Space amplification**: N rows of ~140 encoded bytes, R rounds overwriting a random 30% of
  the keys (each round sealed and offloaded on every node), then GC passes on every node to
  quiescence (history 1 s: at 0 s a read across nodes at the coordinator's closed timestamp can
  be refused as purged on another node, whose horizon follows its own wall clock; grace 0 s):
  (bytes in the object store + the bytes of the three log devices' extents that active files
  use — ``terrascale_device_used_bytes``; each device file is preallocated, 16 MiB here, which
  dominated this small data set and is kept in ``extra``) / (bytes of the live rows, encoded
  the same way); every key is checked to read its last written value — vs RocksDB holding the same keys and row
  bytes, written in the same rounds, after ``compact_range`` (one copy: the R=1 row compares
  like with like; the R=3 row's followers hold copies of unsealed segments, and drop the
  offloaded ones every 5 s: measured after that).
* **Ingest while GC runs**: 20k-row Arrow batches sent to one node (routed to each key's
  partition) with ``POST /v1/admin/gc`` looping on every node meanwhile, vs the same batches
  with no GC (same table state, same client path).

``python -m bench gc_cluster``; ``BENCH_GC_ROWS`` / ``BENCH_GC_ROUNDS`` as in the one-node bench,
``BENCH_GC_REPLICAS`` (default ``1,3``).
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import Options, Rdict

from bench.common import Result, Timer, print_table, write_json
from bench.gc_workload import BATCH, ROUNDS, ROWS, SCHEMA, dir_bytes, rows_of
from bench.node_proc import raft_cluster, start_all
from node.cluster.controller import PRUNE_EVERY_S
from node.errors import ApiError
from rowstore.codec.rows import encode_rows
from rowstore.schema import parse_schema

REPLICAS = [int(r) for r in os.environ.get("BENCH_GC_REPLICAS", "1,3").split(",")]
EXTRA = """
[history]
retention = "1s"
[gc]
interval = "0s"
grace = "0s"
min_garbage = 0.2
max_bytes_per_run = "256MiB"
[segments]
seal_bytes = "8MiB"
[jobs]
offload_every = "0s"
"""


def _gc_metrics(c) -> dict[str, float]:
    """A node's GC counters (seconds in passes, rows copied) from its /metrics."""
    out = {}
    for line in c.metrics().splitlines():
        for k in ("terrascale_gc_run_seconds_total", "terrascale_gc_rows_copied_total"):
            if line.startswith(k + " "):
                out[k.removeprefix("terrascale_gc_").removesuffix("_total")] = float(line.split()[1])
    return out


def _device_used(c) -> float:
    """Bytes of a node's log device that active files use (its /metrics)."""
    for line in c.metrics().splitlines():
        if line.startswith("terrascale_device_used_bytes "):
            return float(line.split()[1])
    raise AssertionError("no terrascale_device_used_bytes in the node's /metrics")


def _allocated(path: str) -> int:
    """Bytes a directory's files take on disk (active files are preallocated: their size is not)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(path) for f in fs)


def _rocks_put(rocks, t: pa.Table, schema) -> None:
    enc = encode_rows(t, schema, 1)
    for k, a, b in zip(t.column("id").to_pylist(), enc.starts, np.append(enc.starts[1:], enc.nbytes)):
        rocks[int(k).to_bytes(8, "big")] = enc.buf[a:b].tobytes()


def _all(clients, job: str) -> None:
    for c in clients:
        c.admin(job)


def _gc_to_quiescence(clients) -> None:
    for _ in range(50):
        busy = False
        for c in clients:
            res = c.gc()
            busy |= bool(res["segments_collected"] or res["deleted"])
        if not busy:
            return


def run_cluster(root: Path, replicas: int) -> list[Result]:
    nodes = raft_cluster(root / "nodes", 3, extra=EXTRA)
    schema = parse_schema(SCHEMA)
    rocks = Rdict(str(root / "rocks"), Options())
    rng = np.random.default_rng(1)
    try:
        start_all(nodes)
        clients = [n.client(timeout=600) for n in nodes]
        c0 = clients[0]
        c0.create_table("s", [c.split()[:2] for c in SCHEMA.split(", ")], "id", partitions=6, replicas=replicas)

        last = np.full(ROWS, -1, np.int64)  # each key's last acknowledged generation

        def write(keys: np.ndarray, gen: int, both: bool = True) -> None:
            for i in range(0, len(keys), BATCH):
                t = rows_of(keys[i:i + BATCH], gen, rng)
                c0.upsert("s", t)
                last[keys[i:i + BATCH]] = gen
                if both:
                    _rocks_put(rocks, t, schema)

        write(np.arange(ROWS), 0)
        _all(clients, "seal")
        _all(clients, "offload")
        for r in range(1, ROUNDS + 1):
            write(np.sort(rng.choice(ROWS, ROWS * 3 // 10, replace=False)), r)
            _all(clients, "seal")
            _all(clients, "offload")

        n_ingest = min(ROWS, 100_000)
        batches = [np.sort(rng.choice(ROWS, BATCH, replace=False)) for _ in range(n_ingest // BATCH)]
        with Timer() as base:
            for i, keys in enumerate(batches):
                write(keys, 100 + i, both=False)
        stop, passes = threading.Event(), [0]

        def gc_loop(c):
            while not stop.is_set():
                try:
                    c.gc()
                    passes[0] += 1
                except ApiError:
                    time.sleep(0.05)

        before = [_gc_metrics(c) for c in clients]
        loops = [threading.Thread(target=gc_loop, args=(n.client(timeout=600),)) for n in nodes]
        for t in loops:
            t.start()
        with Timer() as during:
            for i, keys in enumerate(batches):
                write(keys, 200 + i, both=False)
        stop.set()
        for t in loops:
            t.join()
        gc_work = {k: round(sum(_gc_metrics(c)[k] - b[k] for c, b in zip(clients, before)), 2)
                   for k in before[0]}
        time.sleep(1.5)  # past the 1 s history: the last round's overwritten versions are garbage too
        final = c0.query("s", limit=10_000_000).sort_by("id")
        _rocks_put(rocks, final, schema)
        _all(clients, "seal")
        _all(clients, "offload")
        _gc_to_quiescence(clients)
        _all(clients, "checkpoint")
        if replicas > 1:  # followers drop their copies of offloaded segments every PRUNE_EVERY_S
            time.sleep(PRUNE_EVERY_S + 2)
        assert final.num_rows == ROWS, final.num_rows
        assert (final.column("v").to_numpy() == last).all(), "a key reads another value than its last write"
        live = encode_rows(final, schema, 1).nbytes
        where = {"objects": dir_bytes(str(root / "nodes" / "objects"))}
        where.update({f"{n.node_id} device, used": _device_used(c) for n, c in zip(nodes, clients)})
        where.update({f"{n.node_id} block files (preallocated)": dir_bytes(str(n.data / "block")) for n in nodes})
        where["block, allocated (du)"] = sum(_allocated(str(n.data / "block")) for n in nodes)
        ours = sum(v for k, v in where.items() if k == "objects" or k.endswith("device, used")) / live
        for c in clients:
            c.close()
    finally:
        for n in nodes:
            n.ensure_stopped()
    rocks.compact_range(None, None)
    rocks.flush()
    rocks.close()
    peer = dir_bytes(str(root / "rocks")) / live
    return [
        Result(f"3 nodes, R={replicas}: space amplification, {ROWS / 1e6:g}M rows x {ROUNDS} rounds of 30% "
               "overwrites, GC on every node to quiescence (objects + the log devices' used extents)", ours,
               "RocksDB after compact_range (same rows, same encoding, one copy)", peer, "x live bytes",
               "<= 1.25x" if replicas == 1 else "report", {"live_bytes": live, "bytes": where}),
        Result(f"3 nodes, R={replicas}: ingest while GC runs on every node ({n_ingest} rows in {BATCH}-row "
               f"Arrow batches to one node, {passes[0]} GC passes)", n_ingest / during.seconds,
               "the same ingest without GC", n_ingest / base.seconds, "rows/s", ">= 0.7x",
               {"gc_during_ingest (all nodes)": gc_work, "seconds": round(during.seconds, 2)}),
    ]


async def main() -> list[Result]:
    results = []
    t0 = time.perf_counter()
    for r in REPLICAS:
        with tempfile.TemporaryDirectory(prefix="gc-cluster-", dir=os.environ.get("BENCH_DIR", ".")) as root:
            results += await asyncio.to_thread(run_cluster, Path(root).resolve(), r)  # nodes run in their own dirs
    print_table("Garbage collection on three nodes (RFC 0009, who collects)", results)
    for r in results:
        if r.extra:
            print(f"  {r.workload}: {r.extra}")
    print(f"\nJSON: {write_json('gc_cluster', results)}  ({time.perf_counter() - t0:.0f} s)")
    return results


if __name__ == "__main__":
    asyncio.run(main())
