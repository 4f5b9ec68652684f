"""`python -m bench memory`: a node's resident memory and restart time as its indexed history
grows (RFC 0014, "What is left"), this code against the code before column-index runs were built on
demand (``BEFORE``, a commit of this repository, run from an exported copy), in the same run.

Each side: a node process (embedded catalog, local object store), one table of
``id int64`` key, ``sensor string``, ``v float64``, ``loc point``, the last three indexed; N
rows ingested as Arrow in chunks, then sealed, offloaded and checkpointed (every row in objects,
every index entry in runs, every merge the runs call for done); the node stopped (SIGTERM) and
started again: the time until it
answers ``/readyz``, its resident memory then, and again after one query per indexed column
(what a node serving reads holds). Run at two sizes, the growth per million rows between them
is what the issue's goal ("flat beyond the caches") is about. ``TERRASCALE_BENCH_MEMORY_ROWS``:
the two sizes (default ``2000000,6000000``).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench.common import Result, print_table, write_json
from bench.ports import free_port
from node.wire import write_arrow_stream

BEFORE = "39758d24"  # main before the column-index runs were built on demand
CHUNK = 250_000
SENSORS = 1_000
ARROW = "application/vnd.apache.arrow.stream"


def _rows(start: int, n: int) -> pa.Table:
    r = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    names = np.array([f"sensor-{i:04d}" for i in range(SENSORS)], dtype=object)
    return pa.table({"id": r, "sensor": pa.array(names[r % SENSORS].tolist(), pa.string()),
                     "v": rng.uniform(-100, 100, n),
                     "loc": pa.StructArray.from_arrays([pa.array(rng.uniform(0, 1000, n)),
                                                        pa.array(rng.uniform(0, 1000, n))], names=["x", "y"])})


class _Node:
    """``terrascale node run`` from the source tree ``src`` on a free port, data under ``root``."""

    def __init__(self, src: str, root: str):
        self.src, self.root = src, root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=self.src)
        self.log = open(os.path.join(self.root, "node.log"), "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "node.cli", "node", "run", "--data-dir",
                                      os.path.join(self.root, "node"), "--listen", f"127.0.0.1:{self.port}"],
                                     cwd=self.src, env=env, stderr=self.log, stdout=subprocess.DEVNULL)

    async def ready(self, http) -> float:
        t0 = time.perf_counter()
        for _ in range(6000):
            try:
                async with http.get(self.url + "/readyz") as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"node did not become ready (log: {self.root}/node.log)")

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident memory now (``VmHWM``: its peak since the process started)."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
        return kb / 1024

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
            self.proc = None
            self.log.close()


async def _call(http, url: str, body: bytes | None = None, ctype: str = "application/json") -> bytes:
    async with http.post(url, data=body, headers={"Content-Type": ctype}) as r:
        out = await r.read()
        if r.status // 100 != 2:
            raise RuntimeError(f"{url}: {r.status} {out[:300]!r}")
        return out


async def _load(http, node: _Node, n: int) -> None:
    await _call(http, node.url + "/v1/tables", json.dumps({
        "name": "m", "primary_key": ["id"], "indexes": ["sensor", "v", "loc"],
        "columns": [{"name": "id", "type": "int64"}, {"name": "sensor", "type": "string"},
                    {"name": "v", "type": "float64"}, {"name": "loc", "type": "point"}]}).encode())
    for start in range(0, n, CHUNK):
        body = await asyncio.to_thread(lambda s=start: write_arrow_stream(_rows(s, min(CHUNK, n - s))))
        await _call(http, node.url + "/v1/tables/m/rows", body, ARROW)
    for job in ("seal", "offload", "checkpoint"):
        await _call(http, node.url + f"/v1/admin/{job}")
    for _ in range(200):  # the index merges the checkpoints call for, all done: nothing runs after the restart
        if not json.loads(await _call(http, node.url + "/v1/admin/checkpoint")).get("merged"):
            break


async def _queries(http, node: _Node) -> None:
    for doc in ({"where": [["sensor", "=", "sensor-0007"]], "columns": ["id"], "limit": 100},
                {"where": [["v", ">", 99.9]], "columns": ["id"], "limit": 100},
                {"bbox": {"column": "loc", "xmin": 10, "ymin": 10, "xmax": 12, "ymax": 12}, "columns": ["id"],
                 "limit": 100}):
        await _call(http, node.url + "/v1/tables/m/query", json.dumps(doc).encode())


async def _side(http, src: str, n: int) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="memory-bench-")
    node = _Node(src, root)
    try:
        node.start()
        await node.ready(http)
        t0 = time.perf_counter()
        await _load(http, node, n)
        ingest = n / (time.perf_counter() - t0)
        peak = node.rss_mb("VmHWM")
        node.stop()
        node.start()
        ready_s = await node.ready(http)
        opened = node.rss_mb()
        await _queries(http, node)
        queried = node.rss_mb()
        return {"ready_s": ready_s, "rss_open_mb": opened, "rss_queried_mb": queried, "ingest_rows_s": ingest,
                "rss_ingest_peak_mb": peak}
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def _export(commit: str) -> str:
    """The repository at ``commit``, as files (the node runs from them)."""
    out = tempfile.mkdtemp(prefix="memory-bench-src-")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    arch = subprocess.run(["git", "-C", here, "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "x", "-C", out], input=arch, check=True)
    return out


async def main() -> None:
    import aiohttp

    sizes = [int(float(x)) for x in os.environ.get("TERRASCALE_BENCH_MEMORY_ROWS", "2000000,6000000").split(",")]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    before = _export(BEFORE)
    got: dict[tuple[str, int], dict[str, float]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
        try:
            for n in sizes:
                for side, src in (("now", here), ("before", before)):
                    got[(side, n)] = await _side(http, src, n)
                    print(f"  {side} {n:,} rows: {got[(side, n)]}", flush=True)
        finally:
            shutil.rmtree(before, ignore_errors=True)
    lo, hi = sizes[0], sizes[-1]
    per_m = (hi - lo) / 1e6

    def growth(side: str, k: str) -> float:
        return (got[(side, hi)][k] - got[(side, lo)][k]) / per_m
    name = "3 indexed columns (sensor, v, loc), all rows offloaded and checkpointed, restarted"
    results = [
        Result(f"{name}: resident memory after the restart, {hi:,} rows", got[("now", hi)]["rss_open_mb"],
               f"before ({BEFORE})", got[("before", hi)]["rss_open_mb"], "MB"),
        Result(f"{name}: resident memory after one query per indexed column, {hi:,} rows",
               got[("now", hi)]["rss_queried_mb"], f"before ({BEFORE})", got[("before", hi)]["rss_queried_mb"], "MB"),
        Result(f"{name}: growth after the restart, per million rows ({lo:,} to {hi:,})",
               growth("now", "rss_open_mb"), f"before ({BEFORE})", growth("before", "rss_open_mb"), "MB",
               "flat beyond the caches"),
        Result(f"{name}: growth after the queries, per million rows ({lo:,} to {hi:,})",
               growth("now", "rss_queried_mb"), f"before ({BEFORE})", growth("before", "rss_queried_mb"), "MB",
               "bounded by tables.column_cache_bytes"),
        Result(f"{name}: time to ready after the restart, {hi:,} rows", got[("now", hi)]["ready_s"],
               f"before ({BEFORE})", got[("before", hi)]["ready_s"], "s"),
        Result(f"{name}: peak resident memory while ingesting {hi:,} rows (Arrow, {CHUNK:,} a request, one "
               "writer), sealing, offloading and checkpointing them", got[("now", hi)]["rss_ingest_peak_mb"],
               f"before ({BEFORE})", got[("before", hi)]["rss_ingest_peak_mb"], "MB",
               "bounded by tables.memtable_bytes (write stall at 4x)"),
        Result(f"{name}: ingest of {hi:,} rows (Arrow, {CHUNK:,} a request, one writer, durable), then seal, "
               "offload and checkpoint, all in the time",
               got[("now", hi)]["ingest_rows_s"], f"before ({BEFORE})", got[("before", hi)]["ingest_rows_s"],
               "rows/s"),
    ]
    for r in results:
        r.extra = {f"{side}_{n}": got[(side, n)] for side in ("now", "before") for n in sizes}
    print_table("A node's memory and restart as its indexed history grows", results)
    print("results:", write_json("memory", results))
