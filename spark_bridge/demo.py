"""`make demo`: the end-to-end tour on a 3-node loopback cluster; exits by itself.

Starts ``ops/local-cluster.sh up 3`` in a fresh directory, creates a table, writes a
sample data set (vehicle positions) to Parquet and loads it with ``terrascale ingest``
(progress bar), seals and offloads the segments, runs point, range and bounding-box
queries and a time-travel read — each through a different node: the table's partitions are
placed across all three (RFC 0010), so requests are routed by partition and batches and
queries span nodes — ends with a Spark job over the offloaded segments (the
executors read the objects), prints a short report and stops the cluster.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from node.client.client import Client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(os.path.dirname(sys.executable), "terrascale")
ROWS = int(os.environ.get("TERRASCALE_DEMO_ROWS", "300000"))


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(*args, **kw) -> subprocess.CompletedProcess:
    print("$ " + " ".join(a if " " not in a else repr(a) for a in args), flush=True)
    return subprocess.run(args, check=True, **kw)


def sample(n: int, seed: int = 7) -> pa.Table:
    """n positions of 500 vehicles around Berlin, one per vehicle per second."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int64)
    vehicle = ids % 500
    t0 = 1_700_000_000_000_000
    lon = 13.40 + rng.uniform(-0.25, 0.25, 500)[vehicle] + rng.normal(0, 0.002, n)
    lat = 52.52 + rng.uniform(-0.15, 0.15, 500)[vehicle] + rng.normal(0, 0.002, n)
    return pa.table({
        "id": ids,
        "ts": pa.array(t0 + (ids // 500) * 1_000_000, pa.timestamp("us", tz="UTC")),
        "loc": pa.StructArray.from_arrays([pa.array(lon), pa.array(lat)], names=["x", "y"]),
        "vehicle": pa.array([f"v{v:03d}" for v in vehicle.tolist()]),
        "speed": pa.array(np.abs(rng.normal(30, 12, n))),
    })


def main() -> int:
    base = int(os.environ.get("TERRASCALE_BASE_PORT", "7500"))
    d = os.path.abspath(os.environ.get("TERRASCALE_CLUSTER_DIR", os.path.join(ROOT, "demo-cluster")))
    env = {**os.environ, "TERRASCALE_CLUSTER_DIR": d, "TERRASCALE_BASE_PORT": str(base), "TERRASCALE": CLI}
    env.pop("TERRASCALE_TOKEN", None)
    urls = [f"http://127.0.0.1:{base + 10 * i}" for i in range(3)]
    shutil.rmtree(d, ignore_errors=True)
    report: dict[str, object] = {}
    t_start = time.perf_counter()
    step("start a 3-node cluster on loopback (Raft catalog, shared object store)")
    run("bash", os.path.join(ROOT, "ops", "local-cluster.sh"), "up", "3", env=env)
    print(f"    the admin console, while the tour runs: {urls[0]}/ui/ (any node's /ui/; docs/console.md)", flush=True)
    report["admin console (while it ran)"] = f"{urls[0]}/ui/"
    try:
        tour(d, urls, report)
    finally:
        step("stop the cluster")
        subprocess.run(["bash", os.path.join(ROOT, "ops", "local-cluster.sh"), "down"], env=env)
    step("report")
    for k, v in report.items():
        print(f"  {k:<34} {v}")
    print(f"  {'total time':<34} {time.perf_counter() - t_start:.1f} s")
    return 0


def tour(d: str, urls: list[str], report: dict) -> None:
    cli = [CLI, "--endpoint", urls[0]]
    step("create a table (through n1; its 8 partitions are placed across the three nodes, each replicated "
         "to all three: a write is acknowledged once two of them hold it)")
    run(*cli, "table", "create", "positions", "--schema",
        "id int64 primary key, ts timestamp, loc point, vehicle string, speed float64", "--index", "loc,vehicle,ts",
        "--replicas", "3")
    step(f"ingest a sample data set ({ROWS:,} vehicle positions) from Parquet, through n2")
    path = os.path.join(d, "positions.parquet")
    pq.write_table(sample(ROWS), path, row_group_size=50_000)
    t0 = time.perf_counter()
    run(CLI, "--endpoint", urls[1], "ingest", "positions", path, "--batch-rows", "25000")
    report["rows ingested"] = f"{ROWS:,} in {time.perf_counter() - t0:.1f} s (CLI, Parquet, via n2 -> all nodes)"
    with Client(urls[2]) as c3:
        t_before = c3.query_json("positions", limit=0)["as_of"]
        step("update 1,000 rows (speeds doubled) — the old values stay readable as of the earlier time")
        old = c3.query("positions", where=[["id", "<", 1000]], limit=1000)
        c3.upsert("positions", old.set_column(4, "speed", pc.multiply(old.column("speed"), 2.0)))
        step("seal and offload the segments to the object store (each node its own partitions')")
        for u in urls:
            run(CLI, "--endpoint", u, "admin", "seal")
            run(CLI, "--endpoint", u, "admin", "offload")
        segs = c3.segments("positions")["segments"]
        report["segments offloaded"] = sum(s["state"] == "offloaded" for s in segs)
        report["bytes in objects (compressed)"] = f"{sum(s['bytes'] for s in segs if s['state'] == 'offloaded'):,}"
    step("point read (through n3)")
    run(CLI, "--endpoint", urls[2], "get", "positions", "42")
    step("range query: one vehicle, speed above 50 (through n2)")
    run(CLI, "--endpoint", urls[1], "query", "positions", "--where", "vehicle = v042", "--where", "speed > 50",
        "--columns", "id,ts,vehicle,speed", "--limit", "5")
    step("bounding-box query: a square around the Brandenburg Gate (through n1)")
    run(*cli, "query", "positions", "--bbox", "loc:13.37,52.51,13.38,52.52", "--columns", "id,loc,vehicle",
        "--limit", "5")
    with Client(urls[1]) as c2:
        t = c2.query("positions", bbox={"column": "loc", "xmin": 13.37, "ymin": 52.51, "xmax": 13.38, "ymax": 52.52},
                     limit=10**7, columns=["id"])
        report["rows in the bounding box"] = f"{t.num_rows:,}"
    step(f"time travel: row 42 now, and as of {t_before} (before the update; read from the objects)")
    run(CLI, "--endpoint", urls[1], "get", "positions", "42", "--as-of", str(t_before))
    with Client(urls[1]) as c2:
        now, then = c2.get("positions", 42), c2.get("positions", 42, as_of=t_before)
        report["row 42 speed now / before update"] = f"{now['speed']:.2f} / {then['speed']:.2f}"
    kill_step(d, urls, report)
    spark_step(urls, report)
    report["cluster"] = ("3 nodes, Raft catalog; partitions placed across them and replicated to all three, "
                         "requests routed by partition")


def kill_step(d: str, urls: list[str], report: dict) -> None:
    """kill -9 one node: its partitions fail over to the other replicas, writes and reads go
    on; it comes back, catches up, and reads through it see everything."""
    pid = int(open(os.path.join(d, "n3.pid")).read())
    with Client(urls[0]) as c1:
        total = c1.query("positions", columns=["id"], limit=10**7).num_rows
        led = sum(p["leader"] == "n3" for p in c1.describe("positions")["placement"])
        step(f"kill -9 n3 (pid {pid}; it leads {led} of the 8 partitions) and keep writing through n1")
        os.kill(pid, 9)
        t0 = time.perf_counter()
        extra = sample(2000, seed=11)
        extra = extra.set_column(0, "id", pa.array(np.arange(ROWS, ROWS + 2000, dtype=np.int64)))
        while True:
            try:
                c1.upsert("positions", extra)
                break
            except Exception as e:  # 503 while the partitions fail over: retry
                if time.perf_counter() - t0 > 60:
                    raise
                print(f"    (retrying: {str(e)[:80]})", flush=True)
                time.sleep(0.5)
        took = time.perf_counter() - t0
        print(f"    2,000 rows acknowledged {took:.1f} s after the kill (failure detection + election)")
        after = c1.query("positions", columns=["id"], limit=10**7).num_rows
        assert after == total + 2000, (after, total)
        run(CLI, "--endpoint", urls[0], "table", "describe", "positions")
        report["kill -9 of n3: first write after"] = f"{took:.1f} s; {after:,} rows readable, none lost"
    step("restart n3: it rejoins as a follower and catches up from the leaders")
    with open(os.path.join(d, "n3.log"), "a") as log:
        proc = subprocess.Popen([CLI, "node", "run", "--config", os.path.join(d, "n3.toml")], stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    open(os.path.join(d, "n3.pid"), "w").write(str(proc.pid))
    t0 = time.perf_counter()
    while True:
        try:
            with Client(urls[2], timeout=5) as c3:
                c3.readyz()
                n = c3.query("positions", columns=["id"], limit=10**7).num_rows
                if n == after:
                    break
        except Exception:  # noqa: BLE001 - starting up
            pass
        if time.perf_counter() - t0 > 90:
            raise RuntimeError("n3 did not come back")
        time.sleep(0.5)
    report["n3 back and serving after"] = f"{time.perf_counter() - t0:.1f} s ({n:,} rows through n3)"


def spark_step(urls: list[str], report: dict) -> None:
    """A Spark job over the sealed segments: executors read the offloaded objects directly."""
    step("Spark over the sealed segments (local[2]; executors read the objects, not the nodes)")
    print(">>> spark.read.format('terrascale').option('endpoint', N3).option('sealed_only', 'true')"
          ".load('positions').groupBy('vehicle').agg(count, avg(speed)).orderBy(desc('n')).limit(5)", flush=True)
    from pyspark.sql import functions as F

    from spark_bridge.session import local_session

    t0 = time.perf_counter()
    spark = local_session(app="terrascale-demo")
    import spark_bridge

    print(f"    (served by the {'JVM' if spark_bridge.jvm_reader(spark) else 'Python'} reader; docs/spark.md, Readers)")
    try:
        df = (spark.read.format("terrascale").option("endpoint", urls[2]).option("sealed_only", "true")
              .load("positions"))
        top = (df.groupBy("vehicle").agg(F.count("*").alias("n"), F.avg("speed").alias("avg_speed"))
               .orderBy(F.desc("n"), "vehicle").limit(5))
        top.show(truncate=False)
        report["Spark: rows read from objects"] = f"{df.count():,} in {df.rdd.getNumPartitions()} partitions"
    finally:
        spark.stop()
    report["Spark step (with session start)"] = f"{time.perf_counter() - t0:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
