"""HTTP load on a node and on etcd, shared by the node and cluster benchmarks, the aggregates
benchmark and the point-write profile: one POST that must succeed, ``clients`` keep-alive
workers sending requests, and the point-write requests of each side (rows of the bench's
shape as JSON upserts, etcd's put / delete-range / txn of puts)."""
from __future__ import annotations

import asyncio
import base64
import json
import time


async def post(http, url, body, ctype):
    async with http.post(url, data=body, headers={"Content-Type": ctype}) as r:
        payload = await r.read()
        if r.status not in (200, 201):
            raise RuntimeError(f"{url}: {r.status} {payload[:200]!r}")


async def write_load(http, clients: int, seconds: float, send) -> dict:
    """``clients`` keep-alive workers calling ``send(i)`` with distinct i for ``seconds``:
    requests/s, p50/p99 in µs."""
    lat: list[int] = []
    stop = time.perf_counter() + seconds
    counter = iter(range(1 << 62))

    async def worker():
        while time.perf_counter() < stop:
            i = next(counter)
            t0 = time.perf_counter_ns()
            await send(i)
            lat.append(time.perf_counter_ns() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(clients)])
    took = time.perf_counter() - t0
    lat.sort()
    return {"req_s": len(lat) / took, "p50_us": lat[len(lat) // 2] / 1000, "p99_us": lat[int(len(lat) * 0.99)] / 1000,
            "requests": len(lat)}


def sensor_row(i: int) -> dict:
    """One sensor reading of the bench's row shape (as a JSON-ready dict)."""
    return {"id": i, "ts": 1_714_564_800_000_000 + i, "loc": {"x": (i * 7919 % 10_000) / 100.0,
            "y": (i * 104_729 % 10_000) / 100.0}, "name": f"sensor-{i % 997}", "v": (i % 1000) / 10.0, "n": i % 17}


def b64(s: bytes) -> str:
    return base64.b64encode(s).decode()


async def _ok(resp) -> None:
    payload = await resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{resp.status} {payload[:200]!r}")


class PointPeers:
    """The requests each side serves: single-row upserts / deletes / 10-row batches as
    ``POST /v1/tables/pw{n}/rows`` bodies, and etcd's put / delete-range / 10-put txn with
    values as big as our JSON row."""

    def __init__(self, http, ours: str, etcd: str):
        self.http, self.ours, self.etcd = http, ours, etcd
        self.hdr = {"Content-Type": "application/json"}

    async def _post(self, url: str, body: bytes) -> None:
        async with self.http.post(url, data=body, headers=self.hdr) as r:
            await _ok(r)

    def upsert(self, table: str, base: int, rows: int = 1):
        url = f"{self.ours}/v1/tables/{table}/rows"
        return lambda i: self._post(url, json.dumps({"rows": [sensor_row(base + i * rows + j)
                                                              for j in range(rows)]}).encode())

    def delete(self, table: str, base: int):
        url = f"{self.ours}/v1/tables/{table}/delete"
        return lambda i: self._post(url, json.dumps({"keys": [base + i]}).encode())

    def put(self, prefix: str, rows: int = 1):
        def body(i: int, j: int) -> dict:
            k = i * rows + j
            return {"key": b64(f"{prefix}{k:012d}".encode()), "value": b64(json.dumps(sensor_row(k)).encode())}
        if rows == 1:
            url = f"{self.etcd}/v3/kv/put"
            return lambda i: self._post(url, json.dumps(body(i, 0)).encode())
        url = f"{self.etcd}/v3/kv/txn"
        return lambda i: self._post(url, json.dumps({"success": [{"request_put": body(i, j)}
                                                                  for j in range(rows)]}).encode())

    def delete_range(self, prefix: str):
        url = f"{self.etcd}/v3/kv/deleterange"
        return lambda i: self._post(url, json.dumps({"key": b64(f"{prefix}{i:012d}".encode())}).encode())
