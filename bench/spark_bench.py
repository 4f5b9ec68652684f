"""Spark over Terrascale (issue 6) against Spark over Parquet: the same rows, the same session.

``BENCH_SPARK_ROWS`` rows (default 10M) of the benchmark table (``bench/rowcodec_bench.py``:
int64 key, two float64, a timestamp, a ~95-byte string) are upserted into a real node
(``terrascale node run``) over HTTP as Arrow, sealed and offloaded; the same rows are
written to Parquet. Through ``spark.read.format("terrascale")`` (executors read the
offloaded segments from the object store) and ``spark.read.parquet``:

* ``count()``;
* a filter and a groupBy (``lat > 90``, grouped by ``floor(lon)``: count and mean);
* the full table to the driver as Arrow (``toArrow()``).

pyspark 4.3 gives a Python data source no column pruning, so the bridge reads every column
where Parquet reads only what the query uses (or just metadata, for ``count()``); the first
two workloads also run with the bridge's ``columns`` option naming what Parquet prunes to.

Steady state: the session is started once and each DataFrame is created (and, for the
bridge, planned) by a warm-up run; the median of three timed runs counts. Peak memory is
the largest sum of resident set sizes over this process and its descendants (the Spark JVM
and its Python workers; not the node) while a workload runs, sampled every 50 ms.
"""
from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Result, Timer, print_table, write_json
from bench.rowcodec_bench import SCHEMA

N = int(os.environ.get("BENCH_SPARK_ROWS", 10_000_000))
CHUNK = 250_000
REPEAT = 3


def chunk(offset: int, n: int) -> pa.Table:
    """Rows ``offset .. offset+n`` shaped like ``rowcodec_bench.sample`` (sequential keys, so
    the row count is exact)."""
    rng = np.random.default_rng(offset)
    ids = np.arange(offset, offset + n, dtype=np.int64)
    names = pa.array([f"sensor-{i % 100000:06d}-" + "x" * 80 for i in range(offset, offset + n)])
    return pa.Table.from_arrays([
        pa.array(ids), pa.array(rng.random(n) * 180), pa.array(rng.random(n) * 90),
        pa.array(rng.integers(0, 2**50, n)).cast(pa.timestamp("us", tz="UTC")), names,
    ], schema=pa.schema([pa.field(f.name, f.type, f.nullable) for f in SCHEMA.arrow()]))


class NodeProcess:
    """``terrascale node run`` on a free loopback port with its data under ``root``."""

    def __init__(self, root: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        config = os.path.join(root, "node.toml")
        with open(config, "w") as f:
            f.write(f'[node]\nlisten = "127.0.0.1:{self.port}"\n[storage]\nblock = "trfs://{root}/block"\n'
                    f'volatile = "trfs://{root}/cache"\nobjects = "trfs://{root}/objects"\n'
                    f'[catalog]\nuri = "trkv://{root}/catalog"\n')
        exe = os.path.join(os.path.dirname(sys.executable), "terrascale")
        self.log = open(os.path.join(root, "node.log"), "w")
        self.proc = subprocess.Popen([exe, "node", "run", "--config", config], stderr=self.log,
                                     stdout=subprocess.DEVNULL)

    def wait_ready(self):
        from node.client import ApiError, Client

        with Client(self.base, timeout=5) as c:
            for _ in range(600):
                try:
                    return c.readyz()
                except (ApiError, ConnectionError):
                    time.sleep(0.1)
        raise RuntimeError("the node did not become ready")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(120)
        self.log.close()


class PeakRss:
    """The peak of the summed RSS of this process and its descendants, minus ``exclude``."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.peak, self._stop = exclude, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(_rss(p) for p in _tree(os.getpid()) if p not in self.exclude))
            self._stop.wait(0.05)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def load(root: str) -> tuple[NodeProcess, str, dict]:
    from node.client import Client

    node = NodeProcess(root)
    node.wait_ready()
    parquet = os.path.join(root, "parquet")
    os.makedirs(parquet)
    info = {}
    with Client(node.base, timeout=600) as c:
        c.create_table("bench", [{"name": col.name, "type": str(col.type)} for col in SCHEMA.columns], SCHEMA.key.name)
        spent = 0.0
        for i, off in enumerate(range(0, N, CHUNK)):
            t = chunk(off, min(CHUNK, N - off))
            with Timer() as tm:
                c.upsert("bench", t)
            spent += tm.seconds
            pq.write_table(t, os.path.join(parquet, f"part-{i:05d}.parquet"))
        info["ingest_rows_per_s"] = round(N / spent)
        with Timer() as tm:
            c.admin("seal")
            c.admin("offload")
        info["seal_offload_s"] = round(tm.seconds, 1)
        segs = [s for s in c.segments("bench")["segments"] if s["state"] == "offloaded"]
        info["offloaded_segments"] = len(segs)
    return node, parquet, info


# (name, query, the bridge's ``columns`` option: None = every column, as Spark gives a Python
# data source no column pruning; the named ones = what Parquet's reader prunes to by itself)
WORKLOADS = [
    ("count()", lambda df: df.count(), None),
    ("count(), bridge option columns=id", lambda df: df.count(), "id"),
    ("filter + groupBy", lambda df: _grouped(df), None),
    ("filter + groupBy, bridge option columns=lat,lon", lambda df: _grouped(df), "lat,lon"),
    ("toArrow() (all rows to the driver)", lambda df: df.toArrow().num_rows, None),
]


def _grouped(df):
    from pyspark.sql import functions as F

    return df.filter(F.col("lat") > 90).groupBy(F.floor("lon").alias("b")).agg(F.count("*"), F.avg("lat")).collect()


def _same_groups(a, b) -> bool:
    """Equal groups and counts; means equal up to float summation order."""
    a, b = sorted(tuple(r) for r in a), sorted(tuple(r) for r in b)
    return len(a) == len(b) and all(x[:2] == y[:2] and abs(x[2] - y[2]) <= 1e-9 * abs(y[2]) for x, y in zip(a, b))


def measure(df, fn, exclude: set[int]) -> tuple[float, int, float]:
    """(median seconds of REPEAT runs after a warm-up, peak RSS bytes, warm-up seconds)."""
    with Timer() as first:
        fn(df)
    times = []
    with PeakRss(exclude) as mem:
        for _ in range(REPEAT):
            with Timer() as t:
                fn(df)
            times.append(t.seconds)
    return statistics.median(times), mem.peak, first.seconds


async def main() -> list[Result]:
    from spark_bridge.session import local_session

    root = tempfile.mkdtemp(prefix="terrascale-spark-bench-")
    node, parquet, info = load(root)
    try:
        spark = local_session(cores=2, conf={"spark.driver.memory": "6g", "spark.driver.maxResultSize": "4g",
                                                     "spark.sql.shuffle.partitions": "8"})
        def ours_df(columns):
            r = spark.read.format("terrascale").option("endpoint", node.base).option("table", "bench")
            return (r if columns is None else r.option("columns", columns)).load()

        ours = ours_df(None)
        peer = spark.read.parquet(parquet)
        assert ours.count() == peer.count() == N
        got, want = _grouped(ours), _grouped(peer)
        assert _same_groups(got, want), f"the bridge's groupBy differs from Parquet's: {got[:5]} vs {want[:5]}"
        exclude = {node.proc.pid}
        results = []
        for name, fn, columns in WORKLOADS:
            t_ours, m_ours, first_ours = measure(ours if columns is None else ours_df(columns), fn, exclude)
            t_peer, m_peer, first_peer = measure(peer, fn, exclude)
            results.append(Result(f"{name}, {N:,} rows", N / t_ours, "Spark read.parquet, same rows", N / t_peer,
                                  "rows/s", ">= 0.5x", extra={
                                      "seconds": round(t_ours, 3), "peer_seconds": round(t_peer, 3),
                                      "peak_rss_mib": round(m_ours / 2**20), "peer_peak_rss_mib": round(m_peer / 2**20),
                                      "first_run_seconds": round(first_ours, 3),
                                      "peer_first_run_seconds": round(first_peer, 3)}))
        spark.stop()
    finally:
        node.stop()
        subprocess.run(["rm", "-rf", root], check=False)
    print_table(f"Spark bridge (issue 6): {N:,} rows, local[2], steady state", results)
    print("\n| workload | bridge peak RSS | Parquet peak RSS |\n| --- | ---: | ---: |")
    for r in results:
        print(f"| {r.workload} | {r.extra['peak_rss_mib']:,} MiB | {r.extra['peer_peak_rss_mib']:,} MiB |")
    print(f"\nload: {info}; groupBy results equal (asserted)")
    results[0].extra["load"] = info
    print(f"\nJSON: {write_json('spark', results)}")
    return results
