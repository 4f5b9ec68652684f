"""What the parts of ``python -m bench cluster`` share (``bench/cluster_bench.py`` describes the
workloads; ``bench/cluster_catchup.py`` and ``bench/cluster_failover.py`` hold two of them):
the three-node cluster with its load client, keys by partition, batches split by partition
leader and sent, and the settings they share (quick mode, partitions per table, the cluster's
timings)."""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.node_bench import ARROW, SCHEMA
from bench.node_proc import raft_cluster, start_all
from node.wire import write_arrow_stream
from rowstore.tables.keys import encode_keys, partition_of

QUICK = os.environ.get("CLUSTER_BENCH_QUICK") == "1"
PARTITIONS = 8
COLUMNS = [{"name": c.split()[0], "type": c.split()[1]} for c in SCHEMA.split(", ")]
TIMINGS = "default [cluster] timings: heartbeat 500 ms, failure_timeout 2 s"


def keys_of(parts: int, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 keys first..first+n-1 and the partition of each."""
    keys = np.arange(first, first + n, dtype=np.int64)
    return keys, partition_of(encode_keys(pa.array(keys), "int64"), parts)


class Cluster:
    """Three node processes (bench/node_proc.py) and one aiohttp session for the load."""

    def __init__(self, root: Path):
        self.nodes = raft_cluster(root, 3)  # no [cluster] section: the node's defaults
        self.by_id = {n.node_id: n for n in self.nodes}
        self.replicated: dict[str, int] = {}  # table -> partitions, R > 1

    async def open(self) -> None:
        import aiohttp

        await asyncio.to_thread(start_all, self.nodes)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                          timeout=aiohttp.ClientTimeout(total=120))

    async def close(self) -> None:
        if getattr(self, "http", None) is not None:
            await self.http.close()
        for n in self.nodes:
            n.ensure_stopped()

    def url(self, node_id: str) -> str:
        return self.by_id[node_id].base

    def live(self) -> list:
        return [n for n in self.nodes if n.proc is not None]

    async def get(self, node_id: str, path: str) -> dict:
        async with self.http.get(self.url(node_id) + path) as r:
            doc = await r.json(content_type=None)
            if r.status != 200:
                raise RuntimeError(f"GET {path} on {node_id}: {r.status} {doc}")
            return doc

    async def post(self, url: str, body: bytes, ctype: str = "application/json") -> None:
        async with self.http.post(url, data=body, headers={"Content-Type": ctype}) as r:
            payload = await r.read()
            if r.status not in (200, 201):
                raise RuntimeError(f"POST {url}: {r.status} {payload[:300]!r}")

    async def create(self, name: str, replicas: int) -> list[str]:
        """Create ``name`` with ``replicas`` replicas; the leader of each partition."""
        n0 = self.live()[0]
        await self.post(n0.base + "/v1/tables", json.dumps({
            "name": name, "primary_key": "id", "columns": COLUMNS, "partitions": PARTITIONS,
            "replicas": replicas}).encode())
        if replicas > 1:
            self.replicated[name] = PARTITIONS
        return await self.leaders(name)

    async def drop(self, name: str) -> None:
        n0 = self.live()[0]
        async with self.http.delete(f"{n0.base}/v1/tables/{name}") as r:
            if r.status != 200:
                raise RuntimeError(f"drop {name}: {r.status} {await r.text()}")
        self.replicated.pop(name, None)

    async def leaders(self, name: str, via: str | None = None) -> list[str]:
        d = await self.get(via or self.live()[0].node_id, f"/v1/tables/{name}")
        return [p["leader"] for p in d["placement"]]

    async def wait_ready(self, node, timeout: float = 120) -> None:
        import aiohttp

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(f"node {node.node_id} exited: {node.log()[-2000:]}")
            try:
                async with self.http.get(node.base + "/readyz") as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"node {node.node_id} never became ready")

    async def shippers(self) -> dict[str, dict]:
        """Each replicated partition ("table/pid") -> the status of its newest live shipper,
        with ``node`` (its leader)."""
        import aiohttp

        out: dict[str, dict] = {}
        for n in self.live():
            try:
                st = await self.get(n.node_id, "/v1/admin/status")
            except (aiohttp.ClientError, OSError, RuntimeError):
                continue
            for key, sh in ((st.get("replication") or {}).get("led") or {}).items():
                if sh["fenced"] is None and (key not in out or sh["epoch"] > out[key]["epoch"]):
                    out[key] = dict(sh, node=n.node_id)
        return out

    def all_caught_up(self, shippers: dict[str, dict]) -> bool:
        for name, parts in self.replicated.items():
            for pid in range(parts):
                sh = shippers.get(f"{name}/{pid}")
                if sh is None or not sh["lease"]:
                    return False
                if any(f["pos"] is None or f["pos"] != sh["end"] for f in sh["followers"].values()):
                    return False
        return True

    async def caught_up(self, timeout: float = 120, every: float = 0.1) -> dict[str, dict]:
        """Wait until every replicated partition has a leader holding its lease and every
        follower's durable position equals the leader's log end; the shippers then."""
        deadline = time.monotonic() + timeout
        while True:
            sh = await self.shippers()
            if self.all_caught_up(sh):
                return sh
            if time.monotonic() > deadline:
                raise RuntimeError(f"replicas not caught up after {timeout} s: {sh}")
            await asyncio.sleep(every)


def split_by_leader(tables: list[pa.Table], leaders: list[str]) -> list[list[tuple[str, bytes]]]:
    """Each batch as (leader, Arrow IPC body) pieces, one per node (as ``terrascale ingest``)."""
    lead = np.array(leaders)
    out = []
    for t in tables:
        who = lead[partition_of(encode_keys(t.column("id"), "int64"), len(leaders))]
        out.append([(n, write_arrow_stream(t.filter(pa.array(who == n)))) for n in np.unique(who).tolist()])
    return out


async def send_batches(cl: Cluster, name: str, pieces: list[list[tuple[str, bytes]]], inflight: int,
                       retry_s: float = 0.0) -> float:
    """Post every batch's pieces at once, ``inflight`` batches at a time; seconds taken.
    With ``retry_s``, a refused piece is sent again (through any node) until it is acknowledged
    (also when its node died under it: the connection drops)."""
    import aiohttp

    nxt = iter(range(len(pieces)))

    async def piece(node: str, body: bytes):
        url = f"/v1/tables/{name}/rows"
        target = cl.url(node)
        deadline = time.monotonic() + 120
        while True:
            try:
                await cl.post(target + url, body, ARROW)
                return
            except (RuntimeError, OSError, asyncio.TimeoutError, aiohttp.ClientError):
                if not retry_s or time.monotonic() > deadline:
                    raise
                live = cl.live()
                target = live[int(time.monotonic() * 1000) % len(live)].base
                await asyncio.sleep(retry_s)

    async def worker():
        for i in nxt:
            await asyncio.gather(*(piece(n, b) for n, b in pieces[i]))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return time.perf_counter() - t0
