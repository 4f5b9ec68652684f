"""Spark over Terrascale against Spark over Parquet: the same rows, the same session.

``BENCH_SPARK_ROWS`` rows (default 10M) of the benchmark table (``bench/rowcodec_bench.py``:
int64 key, two float64, a timestamp, a ~95-byte string) are upserted into a real node
(``terrascale node run``) over HTTP as Arrow, sealed and offloaded; Spark writes the same rows
(read through the bridge) to zstd Parquet. Each workload runs through the JVM reader
(``format("terrascale")``, spark_bridge/jvm), the Python reader (``reader=python``) and
``spark.read.parquet``:

* ``count()``;
* a filter and a groupBy (``lat > 90``, grouped by ``floor(lon)``: count and mean) — the three
  sides' results must be equal (the benchmark fails otherwise);
* a 3-column projection (``id, lat, ts``) into Spark's ``noop`` sink;
* the full table to the driver as Arrow (``toArrow()``).

The Python reader gets no column pruning from pyspark 4.3 (it decodes every column); the JVM
reader and Parquet prune by themselves. Where the JVM reader's time goes (fetching object
bytes, verifying checksums, decrypting, decompressing, decoding rows) is summed over its tasks
(``io.terrascale.spark.source.Timings``; local mode runs them in the driver's JVM).

Steady state: the session is started once and each DataFrame is created (and planned) by a
warm-up run; the median of three timed runs counts. Peak memory is the largest sum of resident
set sizes over this process and its descendants (the Spark JVM and its Python workers; not the
node) while a workload runs, sampled every 50 ms.
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
        from node.client.client import Client
        from node.errors import ApiError

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


def load(root: str) -> tuple[NodeProcess, dict]:
    from node.client.client import Client

    node = NodeProcess(root)
    node.wait_ready()
    info = {}
    with Client(node.base, timeout=600) as c:
        c.create_table("bench", [{"name": col.name, "type": str(col.type)} for col in SCHEMA.columns],
                       SCHEMA.pk.names[0])
        spent = 0.0
        for off in range(0, N, CHUNK):
            t = chunk(off, min(CHUNK, N - off))
            with Timer() as tm:
                c.upsert("bench", t)
            spent += tm.seconds
        info["ingest_rows_per_s"] = round(N / spent)
        with Timer() as tm:
            c.admin("seal")
            c.admin("offload")
        info["seal_offload_s"] = round(tm.seconds, 1)
        segs = [s for s in c.segments("bench")["segments"] if s["state"] == "offloaded"]
        info["offloaded_segments"] = len(segs)
    return node, info


def _grouped(df):
    from pyspark.sql import functions as F

    return df.filter(F.col("lat") > 90).groupBy(F.floor("lon").alias("b")).agg(F.count("*"), F.avg("lat")).collect()


def _projected(df):
    df.select("id", "lat", "ts").write.format("noop").mode("overwrite").save()


WORKLOADS = [
    ("count() (both sides answer from metadata: no row is read)", lambda df: df.count()),
    ("filter + groupBy", _grouped),
    ("3-column projection (id, lat, ts) to noop", _projected),
    ("toArrow() (all rows to the driver)", lambda df: df.toArrow().num_rows),
]
TARGETS = {"count() (both sides answer from metadata: no row is read)": "report", "filter + groupBy": ">= 0.5x",
           "3-column projection (id, lat, ts) to noop": ">= 0.5x",
           "toArrow() (all rows to the driver)": ">= 1x"}


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


def _timings(spark) -> dict:
    text = spark._jvm.io.terrascale.spark.source.Timings.snapshot()
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split())}


async def main() -> list[Result]:
    import spark_bridge
    from spark_bridge.session import local_session

    root = tempfile.mkdtemp(prefix="terrascale-spark-bench-")
    node, info = load(root)
    try:
        spark = local_session(cores=2, conf={"spark.driver.memory": "6g", "spark.driver.maxResultSize": "4g",
                                             "spark.sql.shuffle.partitions": "8"})
        if not spark_bridge.jvm_reader(spark):
            raise SystemExit("the JVM reader is not on the classpath: run `make jvm` first")

        def ours(reader: str):
            return (spark.read.format("terrascale").option("endpoint", node.base).option("table", "bench")
                    .option("reader", reader).load())

        parquet = os.path.join(root, "parquet")
        ours("jvm").write.option("compression", "zstd").parquet(parquet)  # Spark writes the peer's files
        sides = {"jvm": ours("jvm"), "python": ours("python"), "parquet": spark.read.parquet(parquet)}
        counts = {k: df.count() for k, df in sides.items()}
        assert set(counts.values()) == {N}, counts
        groups = {k: _grouped(df) for k, df in sides.items()}
        for k in ("jvm", "python"):
            assert _same_groups(groups[k], groups["parquet"]), (
                f"filter + groupBy: the {k} reader's groups differ from Parquet's: "
                f"{groups[k][:5]} vs {groups['parquet'][:5]}")
        exclude = {node.proc.pid}
        results, breakdown = [], []
        for name, fn in WORKLOADS:
            spark._jvm.io.terrascale.spark.source.Timings.reset()
            t_jvm, m_jvm, first_jvm = measure(sides["jvm"], fn, exclude)
            steps = _timings(spark)  # warm-up + timed runs
            t_py, m_py, first_py = measure(sides["python"], fn, exclude)
            t_pq, m_pq, first_pq = measure(sides["parquet"], fn, exclude)
            runs = REPEAT + 1
            breakdown.append((name, t_jvm, {k: steps[k] / runs / 1e6 for k in
                                            ("fetch", "verify", "decrypt", "decompress", "decode")}))
            extra = {"seconds": round(t_jvm, 3), "peer_seconds": round(t_pq, 3),
                     "python_reader_rows_per_s": round(N / t_py), "python_reader_ratio": round(t_pq / t_py, 3),
                     "peak_rss_mib": round(m_jvm / 2**20), "python_peak_rss_mib": round(m_py / 2**20),
                     "peer_peak_rss_mib": round(m_pq / 2**20), "first_run_seconds": round(first_jvm, 3),
                     "python_first_run_seconds": round(first_py, 3), "peer_first_run_seconds": round(first_pq, 3),
                     "jvm_ms_per_run": {k: round(v, 1) for k, v in breakdown[-1][2].items()}}
            results.append(Result(f"{name}, {N:,} rows", N / t_jvm, "Spark read.parquet (zstd, written by Spark)",
                                  N / t_pq, "rows/s", TARGETS[name], extra=extra))
        spark.stop()
    finally:
        node.stop()
        subprocess.run(["rm", "-rf", root], check=False)
    print_table(f"Spark: the JVM reader vs Parquet, {N:,} rows, local[2], steady state", results)
    print("\n| workload | JVM reader | Python reader | Parquet | Python / Parquet | peak RSS JVM / Python / Parquet |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        e = r.extra
        print(f"| {r.workload} | {r.ours:,.0f} | {e['python_reader_rows_per_s']:,} | {r.peer:,.0f} | "
              f"{e['python_reader_ratio']:.2f}x | {e['peak_rss_mib']:,} / {e['python_peak_rss_mib']:,} / "
              f"{e['peer_peak_rss_mib']:,} MiB |")
    print("\nWhere the JVM reader's time goes (ms per run, summed over its tasks; wall = the run's seconds):")
    steps = ("fetch", "verify", "decrypt", "decompress", "decode")
    print("| workload | wall | " + " | ".join(steps) + " |\n| --- | ---: |" + " ---: |" * len(steps))
    for name, wall, st in breakdown:
        print(f"| {name} | {wall * 1000:,.0f} | " + " | ".join(f"{st[k]:,.0f}" for k in steps) + " |")
    print(f"\nload: {info}; filter + groupBy results equal on all three sides (asserted)")
    results[0].extra["load"] = info
    print(f"\nJSON: {write_json('spark', results)}")
    return results
