"""Measurement keys (docs/rfcs/0013-measurement-keys.md): reads by key against their peers, in
the same run, answers asserted equal.

* 1,000 sensors x 10,000 readings (one per second: 10M rows, ``(sensor string, ts timestamp,
  v float64)`` keyed by ``(sensor, ts)``), sealed, offloaded and checkpointed. One sensor's
  1-hour window (3,600 rows) by ``POST /scan`` — requests/s of 8 keep-alive clients, random
  sensors and windows — against (a) the same window through ``/query`` with ``sensor = … and
  ts >= … and ts < …`` on the same table (both columns indexed: the best case of /query;
  target >= 10x) and (b) etcd's range read of the same 3,600 keys (``key``/``range_end``,
  ``serializable``, its v3 JSON gateway, the same client and JSON; one member holding 200
  sensors' readings, its 2 GiB quota; target >= 2x); DuckDB reading the same rows from a
  Parquet file sorted by (sensor, ts), in process, reported.
* 100 random keys by one ``POST /get`` against 100 ``GET rows/{sensor}/{ts}``: keys/s, one
  client, keep-alive (target >= 20x).
* ``terrascale export`` of the 10M rows to zstd Parquet: rows/s against DuckDB writing the
  same rows from in-memory Arrow to zstd Parquet (the cost of the file alone; target >=
  0.5x), and the node's resident memory growth while it serves the export's pages.

Sizes scale down with ``KEYS_BENCH_SENSORS`` / ``KEYS_BENCH_PER_SENSOR`` (a quick run).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Result, print_table, write_json
from bench.http_load import b64, post
from bench.node_bench import EtcdOne, NodeProcess
from node.wire import table_to_rows, write_arrow_stream

SENSORS = int(os.environ.get("KEYS_BENCH_SENSORS", "1000"))
PER_SENSOR = int(os.environ.get("KEYS_BENCH_PER_SENSOR", "10000"))
ETCD_SENSORS = min(SENSORS, int(os.environ.get("KEYS_BENCH_ETCD_SENSORS", "200")))
WINDOW = min(3600, PER_SENSOR)  # one hour of one-per-second readings
CLIENTS = 8
SECONDS = float(os.environ.get("KEYS_BENCH_SECONDS", "5"))
T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
ARROW = "application/vnd.apache.arrow.stream"
CHUNK = 200_000  # rows per ingest request


def sensor(i: int) -> str:
    return f"sensor-{i:04d}"


def chunk(start: int, n: int) -> pa.Table:
    """Rows ``start..start+n`` of the data set: row r is sensor r // PER_SENSOR at second r % PER_SENSOR."""
    r = np.arange(start, start + n, dtype=np.int64)
    names = np.array([sensor(i) for i in range(SENSORS)], dtype=object)
    return pa.table({"sensor": pa.array(names[r // PER_SENSOR].tolist(), pa.string()),
                     "ts": pa.array(T0 + (r % PER_SENSOR) * 1_000_000, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     "v": pa.array((r % 997).astype(np.float64) / 7)})


def _iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + "Z"


async def _load(http, url: str) -> float:
    await post(http, url + "/v1/tables", json.dumps({
        "name": "readings", "primary_key": ["sensor", "ts"], "indexes": ["sensor", "ts"],
        "columns": [{"name": "sensor", "type": "string"}, {"name": "ts", "type": "timestamp"},
                    {"name": "v", "type": "float64"}]}).encode(), "application/json")
    t0 = time.perf_counter()
    total = SENSORS * PER_SENSOR
    for start in range(0, total, CHUNK):
        body = await asyncio.to_thread(lambda s=start: write_arrow_stream(chunk(s, min(CHUNK, total - s))))
        await post(http, url + "/v1/tables/readings/rows", body, ARROW)
    took = time.perf_counter() - t0
    for job in ("seal", "offload", "checkpoint"):
        async with http.post(url + f"/v1/admin/{job}") as r:
            await r.read()
    return total / took


def _window(rng: random.Random) -> tuple[str, int, int]:
    s = rng.randrange(SENSORS)
    lo = T0 + rng.randrange(PER_SENSOR - WINDOW + 1) * 1_000_000
    return sensor(s), lo, lo + WINDOW * 1_000_000


def _scan_doc(s: str, lo: int, hi: int) -> bytes:
    return json.dumps({"prefix": [s], "start": [s, _iso(lo)], "end": [s, _iso(hi)], "limit": WINDOW}).encode()


def _query_doc(s: str, lo: int, hi: int) -> bytes:
    return json.dumps({"where": [["sensor", "=", s], ["ts", ">=", _iso(lo)], ["ts", "<", _iso(hi)]],
                       "limit": WINDOW}).encode()


def _etcd_key(s: str, us: int) -> bytes:
    return f"{s}/{us:020d}".encode()


def _etcd_doc(s: str, lo: int, hi: int) -> bytes:
    return json.dumps({"key": b64(_etcd_key(s, lo)), "range_end": b64(_etcd_key(s, hi)),
                       "serializable": True}).encode()


async def _closed_loop(http, url: str, doc_of, accept: str | None, seconds: float, seed: int,
                       sensors: int = SENSORS) -> dict:
    """CLIENTS keep-alive workers POSTing ``doc_of(window)`` for ``seconds``: req/s, p50/p99 µs."""
    rng, lat = random.Random(seed), []
    stop = time.perf_counter() + seconds
    headers = {"Content-Type": "application/json", **({"Accept": accept} if accept else {})}

    async def worker():
        while time.perf_counter() < stop:
            s, lo, hi = _window(rng)
            if sensors < SENSORS:
                s = sensor(rng.randrange(sensors))
            t = time.perf_counter_ns()
            async with http.post(url, data=doc_of(s, lo, hi), headers=headers) as r:
                payload = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {payload[:200]!r}")
            lat.append(time.perf_counter_ns() - t)
    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(CLIENTS)])
    took = time.perf_counter() - t0
    lat.sort()
    return {"req_s": len(lat) / took, "p50_us": lat[len(lat) // 2] / 1000, "p99_us": lat[int(len(lat) * .99)] / 1000}


async def _same_answers(http, url: str, etcd_url: str) -> None:
    """One window through every path: the same 3,600 readings, in the same order."""
    s, lo, hi = sensor(0), T0, T0 + WINDOW * 1_000_000
    async with http.post(url + "/v1/tables/readings/scan", data=_scan_doc(s, lo, hi)) as r:
        scan = [(x["sensor"], x["ts"], x["v"]) for x in (await r.json())["rows"]]
    async with http.post(url + "/v1/tables/readings/query", data=_query_doc(s, lo, hi)) as r:
        query = [(x["sensor"], x["ts"], x["v"]) for x in (await r.json())["rows"]]
    async with http.post(etcd_url + "/v3/kv/range", data=_etcd_doc(s, lo, hi)) as r:
        kvs = (await r.json(content_type=None)).get("kvs", [])
    etcd = [tuple(json.loads(base64.b64decode(kv["value"]))) for kv in kvs]
    assert len(scan) == WINDOW and scan == query, (len(scan), len(query))
    assert [(a, b) for a, b, _ in scan] == [(a, b) for a, b, _ in etcd], "etcd holds the same readings"


async def _fill_etcd(http, etcd_url: str) -> None:
    for i in range(ETCD_SENSORS):
        t = chunk(i * PER_SENSOR, PER_SENSOR)
        ts = t.column("ts").cast(pa.int64()).to_pylist()
        rows = table_to_rows(t)  # the values as the node's JSON writes them
        for a in range(0, PER_SENSOR, 128):  # etcd's default --max-txn-ops is 128
            ops = [{"request_put": {"key": b64(_etcd_key(sensor(i), ts[j])), "value": b64(json.dumps(
                [rows[j]["sensor"], rows[j]["ts"], rows[j]["v"]]).encode())}}
                for j in range(a, min(a + 128, PER_SENSOR))]
            await post(http, etcd_url + "/v3/kv/txn", json.dumps({"success": ops}).encode(), "application/json")


def _duckdb_window(path: str, rounds: int = 200) -> float:
    """Windows per second DuckDB reads from the sorted Parquet file, in process."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"CREATE VIEW r AS SELECT * FROM read_parquet('{path}')")
    rng = random.Random(3)
    t0 = time.perf_counter()
    for _ in range(rounds):
        s, lo, hi = _window(rng)
        n = con.execute("SELECT count(*), sum(v) FROM (SELECT * FROM r WHERE sensor = ? AND epoch_us(ts) >= ? "
                        "AND epoch_us(ts) < ?)", [s, lo, hi]).fetchone()[0]
        assert n == WINDOW
    return rounds / (time.perf_counter() - t0)


async def _gets(http, url: str, rounds: int = 30, hot: bool = False) -> tuple[float, float]:
    """keys/s: 100 random keys in one POST /get, and as 100 GETs (one client, keep-alive).
    ``hot``: the same 100 keys every round (their blocks in the node's memory after the first),
    else new keys each round (each key's index page, tree leaf and row block read cold)."""
    rng = random.Random(5)
    fixed = [(sensor(rng.randrange(SENSORS)), T0 + rng.randrange(PER_SENSOR) * 1_000_000) for _ in range(100)]

    def keys():
        if hot:
            return fixed
        return [(sensor(rng.randrange(SENSORS)), T0 + rng.randrange(PER_SENSOR) * 1_000_000) for _ in range(100)]

    async def many_round() -> None:
        ks = keys()
        async with http.post(url + "/v1/tables/readings/get",
                             data=json.dumps({"keys": [[s, t] for s, t in ks]})) as r:
            rows = (await r.json())["rows"]
            assert all(row is not None for row in rows)

    async def single_round() -> None:
        for s, t in keys():
            async with http.get(f"{url}/v1/tables/readings/rows/{s}/{t}") as r:
                await r.read()
                assert r.status == 200
    if hot:  # the first reads bring the blocks in
        await many_round()
        await single_round()
    t0 = time.perf_counter()
    for _ in range(rounds):
        await many_round()
    many = rounds * 100 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(rounds):
        await single_round()
    single = rounds * 100 / (time.perf_counter() - t0)
    return many, single


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _export(url: str, root: str, node_pid: int) -> tuple[float, int, int]:
    """``terrascale export`` of every row: rows/s, the node's RSS before and its peak during."""
    out = os.path.join(root, "export.parquet")
    cli = os.path.join(os.path.dirname(sys.executable), "terrascale")
    before = peak = _rss_kb(node_pid)
    t0 = time.perf_counter()
    p = subprocess.Popen([cli, "--endpoint", url, "export", "readings", out, "--no-progress"],
                         stderr=subprocess.PIPE)
    while p.poll() is None:
        peak = max(peak, _rss_kb(node_pid))
        time.sleep(0.05)
    took = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr.read() if p.stderr else ""
    n = pq.ParquetFile(out).metadata.num_rows
    assert n == SENSORS * PER_SENSOR
    return n / took, before, peak


def _duckdb_export(root: str) -> float:
    """rows/s of DuckDB writing the same rows from in-memory Arrow to zstd Parquet."""
    import duckdb

    total = SENSORS * PER_SENSOR
    data = pa.concat_tables([chunk(s, min(CHUNK, total - s)) for s in range(0, total, CHUNK)])
    con = duckdb.connect()
    con.register("data", data)
    path = os.path.join(root, "duck.parquet")
    t0 = time.perf_counter()
    con.execute(f"COPY data TO '{path}' (FORMAT PARQUET, COMPRESSION ZSTD)")
    return total / (time.perf_counter() - t0)


async def main() -> None:
    import aiohttp

    root = tempfile.mkdtemp(prefix="keys-bench-")
    node, etcd = NodeProcess(root), EtcdOne(root)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS * 2),
                                 timeout=aiohttp.ClientTimeout(total=3600))
    results: list[Result] = []
    try:
        await node.wait_ready(http)
        await etcd.open(http)
        ingest = await _load(http, node.url)
        print(f"  ingested {SENSORS * PER_SENSOR:,} rows at {ingest:,.0f} rows/s", flush=True)
        await _fill_etcd(http, etcd.url)
        await _same_answers(http, node.url, etcd.url)
        sorted_path = os.path.join(root, "sorted.parquet")
        total = SENSORS * PER_SENSOR
        with pq.ParquetWriter(sorted_path, chunk(0, 1).schema, compression="zstd") as w:
            for s in range(0, total, CHUNK):
                w.write_table(chunk(s, min(CHUNK, total - s)))
        scan_url, query_url = node.url + "/v1/tables/readings/scan", node.url + "/v1/tables/readings/query"
        got: dict[str, list[dict]] = {k: [] for k in ("scan", "scan_arrow", "query", "scan_etcd_set", "etcd")}
        for rnd in range(2):
            got["scan"].append(await _closed_loop(http, scan_url, _scan_doc, None, SECONDS, rnd))
            got["scan_arrow"].append(await _closed_loop(http, scan_url, _scan_doc, ARROW, SECONDS, rnd))
            got["query"].append(await _closed_loop(http, query_url, _query_doc, None, SECONDS, rnd))
            got["scan_etcd_set"].append(await _closed_loop(http, scan_url, _scan_doc, None, SECONDS, rnd,
                                                           ETCD_SENSORS))
            got["etcd"].append(await _closed_loop(http, etcd.url + "/v3/kv/range", _etcd_doc, None, SECONDS, rnd,
                                                  ETCD_SENSORS))
            print("  round", rnd, {k: round(v[-1]["req_s"]) for k, v in got.items()}, flush=True)
        duck = await asyncio.to_thread(_duckdb_window, sorted_path)
        many, single = await _gets(http, node.url)
        hot_many, hot_single = await _gets(http, node.url, hot=True)
        exp, rss0, rss1 = await asyncio.to_thread(_export, node.url, root, node.proc.pid)
        duck_exp = await asyncio.to_thread(_duckdb_export, root)
    finally:
        await http.close()
        node.close()
        etcd.close()

    def med(k: str, f: str = "req_s") -> float:
        return statistics.median(x[f] for x in got[k])
    n = f"{SENSORS:,} sensors x {PER_SENSOR:,} readings"
    win = f"one sensor's {WINDOW:,}-row window, {CLIENTS} clients"
    results += [
        Result(f"{win}: /scan vs /query (both JSON, {n}, sensor and ts indexed)", med("scan"),
               "/query where sensor = and ts range", med("query"), "req/s", ">= 10x",
               {"p99_us": {"scan": med("scan", "p99_us"), "query": med("query", "p99_us")}}),
        Result(f"{win}: /scan vs etcd range read (both JSON over HTTP, serializable; {ETCD_SENSORS} sensors)",
               med("scan_etcd_set"), "etcd v3 gateway range, 1 member", med("etcd"), "req/s", ">= 2x",
               {"p99_us": {"scan": med("scan_etcd_set", "p99_us"), "etcd": med("etcd", "p99_us")}}),
        Result(f"{win}: /scan as Arrow vs as JSON", med("scan_arrow"), "/scan JSON", med("scan"), "req/s", "report"),
        Result(f"{win}: /scan JSON over HTTP vs DuckDB in process on sorted Parquet (1 thread of queries)",
               med("scan"), "DuckDB read_parquet, sorted (sensor, ts)", duck, "req/s", "report"),
        Result("100 random keys, new each round (read cold): one POST /get vs 100 GET rows/{sensor}/{ts} "
               "(1 client)", many, "100 single gets", single, "keys/s", ">= 20x"),
        Result("the same 100 keys every round (blocks in memory): one POST /get vs 100 GETs (1 client)", hot_many,
               "100 single gets", hot_single, "keys/s", ">= 20x"),
        Result(f"export of {total:,} rows to zstd Parquet (terrascale export, CLI over HTTP)", exp,
               "DuckDB COPY from in-memory Arrow", duck_exp, "rows/s", ">= 0.5x",
               {"node_rss_mb_before": rss0 / 1024, "node_rss_mb_peak": rss1 / 1024,
                "node_rss_growth_mb": (rss1 - rss0) / 1024, "ingest_rows_s": ingest}),
    ]
    print_table("measurement keys (RFC 0013)", results)
    print(f"\n  node RSS during the export: {rss0 / 1024:,.0f} MB before, {rss1 / 1024:,.0f} MB peak")
    write_json("keys", results)


if __name__ == "__main__":
    asyncio.run(main())
