"""What the HTTP layer alone costs a point write (RFC 0011 step 3): the candidates for the node's
HTTP server, each answering the point-write request shape with nothing behind it.

Each server runs in its own process and answers ``POST /v1/tables/t/rows`` (a one-row JSON
body: parsed, answered with a small JSON document) on keep-alive connections; the same aiohttp
client drives each with the same number of connections. Printed per server: requests/s and the
server process's CPU per request (from /proc) — the second is what a faster server would take
off each request of the node::

    python -m bench.http_servers [--clients 64] [--seconds 4]

Servers: aiohttp (the node's, stock asyncio loop); aiohttp on uvloop; an asyncio protocol
over httptools (llhttp, the parser uvicorn uses) on the stock loop and on uvloop.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from bench.node_bench import cpu_seconds
from bench.ports import free_port

BODY = json.dumps({"rows": [{"id": 1, "ts": "2026-01-01T00:00:00Z", "loc": [13.4, 52.5], "v": 1.5}]}).encode()
ANSWER = b'{"committed": 1, "commit_ts": 117690000000000000}'
SERVERS = ["aiohttp", "aiohttp+uvloop", "httptools", "httptools+uvloop"]


def _serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def upsert(request):
        json.loads(await request.read())
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/tables/{table}/rows", upsert)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class _HttpToolsProtocol(asyncio.Protocol):
    """One connection: llhttp parses, the body is read whole, a fixed answer goes back."""

    def __init__(self):
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_body(self, body: bytes):
        self.body.append(body)

    def on_message_complete(self):
        json.loads(b"".join(self.body))
        self.body = []
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))


def _serve_httptools(port: int) -> None:
    async def main():
        server = await asyncio.get_running_loop().create_server(_HttpToolsProtocol, "127.0.0.1", port)
        await server.serve_forever()
    asyncio.run(main())


def serve(kind: str, port: int) -> None:
    if kind.endswith("+uvloop"):
        import uvloop

        uvloop.install()
    (_serve_aiohttp if kind.startswith("aiohttp") else _serve_httptools)(port)


async def _drive(url: str, clients: int, seconds: float, pid: int) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for _ in range(100):  # until the server listens
            try:
                async with http.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                break
            except OSError:
                await asyncio.sleep(0.1)
        done, stop = 0, time.perf_counter() + seconds
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()

        async def worker():
            nonlocal done
            while time.perf_counter() < stop:
                async with http.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    assert r.status == 200
                done += 1
        await asyncio.gather(*(worker() for _ in range(clients)))
        took, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return {"req_s": done / took, "cpu_us": cpu * 1e6 / max(done, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.http_servers")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        serve(a.serve, a.port)
        return 0
    print(f"HTTP layer alone, one-row JSON POST, {a.clients} keep-alive clients, {a.seconds:g} s each")
    for kind in SERVERS:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "bench.http_servers", "--serve", kind, "--port", str(port)],
                                cwd=os.getcwd())
        try:
            st = asyncio.run(_drive(f"http://127.0.0.1:{port}/v1/tables/t/rows", a.clients, a.seconds, proc.pid))
        finally:
            proc.kill()
            proc.wait()
        print(f"  {kind:>17}: {st['req_s']:>8,.0f} req/s  {st['cpu_us']:>6,.0f} us server CPU per request", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
