"""Subscriptions over HTTP against a real node process (docs/rfcs/0015-subscriptions.md):
random upserts, overwrites and deletes from concurrent writers (small JSON writes coalesced,
Arrow batches, deletes); WebSocket and SSE subscribers with random where/bbox filters, from a
closed T; what each receives up to its last closed T equals the model's changes whose new or
old version matches; a reconnect from a random closed T it saw gets the rest exactly once; bad
requests refused before the upgrade with nothing opened; a subscriber that stops reading is
told why and dropped while writers go on."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import time
from urllib.parse import quote

import aiohttp
import pytest

from bench.node_proc import NodeProc
from node.client.client import AsyncClient
from tests.node.proc import eventually, holds, metric
from tests.rowstore.db.read.test_subscribe import _matches  # the model's filter, one copy

COLUMNS = [("id", "int64"), ("loc", "point"), ("v", "float64"), ("n", "int64"), ("name", "string")]
IDS = 60


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("subscribe"), extra='\n[subscriptions]\nprogress_every = "100ms"\n'
                                                            'buffer_bytes = "256KiB"\nmax = 8\n')
    n.start()
    with n.client() as c:
        c.create_table("t", COLUMNS, "id", partitions=4)
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log, log[-3000:]


def url(node, table="t", **params) -> str:
    q = "&".join(f"{k}={quote(v if isinstance(v, str) else json.dumps(v))}" for k, v in params.items()
                 if v is not None)
    return f"{node.base}/v1/tables/{table}/subscribe" + (f"?{q}" if q else "")


class Model:
    """Every acknowledged change: (commit_ts, id, op, new row or None, the version before)."""

    def __init__(self):
        self.now: dict[int, dict] = {}
        self.changes: list[tuple[int, int, str, dict | None, dict | None]] = []

    def upsert(self, ts: int, rows: list[dict]):
        for r in rows:
            self.changes.append((ts, r["id"], "upsert", r, self.now.get(r["id"])))
            self.now[r["id"]] = r

    def delete(self, ts: int, ids: list[int]):
        for i in ids:
            self.changes.append((ts, i, "delete", None, self.now.pop(i, None)))

    def expected(self, f: dict, after: int, upto: int) -> list[tuple[int, int, str]]:
        narrow = bool(f.get("where") or f.get("bbox"))
        return sorted((ts, i, op) for ts, i, op, new, old in self.changes
                      if after < ts <= upto and (not narrow or _matches(new, f) or _matches(old, f)))


def _filter(rng: random.Random) -> dict:
    k = rng.randrange(4)
    if k == 0:
        return {}
    if k == 1:
        return {"where": [["v", rng.choice([">", "<="]), rng.uniform(-40, 40)]]}
    x, y = rng.uniform(0, 60), rng.uniform(0, 60)
    box = {"column": "loc", "xmin": x, "ymin": y, "xmax": x + 40, "ymax": y + 40}
    return {"bbox": box} if k == 2 else {"bbox": box, "where": [["n", "<", rng.randrange(1, 9)]]}


def _row(rng: random.Random, i: int) -> dict:
    return {"id": i, "loc": {"x": rng.uniform(0, 100), "y": rng.uniform(0, 100)}, "v": rng.uniform(-50, 50),
            "n": rng.randrange(10), "name": f"r{rng.randrange(1000)}"}


async def _writer(c: AsyncClient, model: Model, rng: random.Random, ops: int):
    for _ in range(ops):
        if rng.random() < 0.2:
            keys = rng.sample(range(IDS), rng.randrange(1, 4))
            res = await c.delete("t", keys)
            model.delete(res["commit_ts"], keys)
        else:
            rows = [_row(rng, i) for i in rng.sample(range(IDS), rng.randrange(1, 8))]
            res = await c.upsert("t", rows)
            model.upsert(res["commit_ts"], rows)


class Received:
    """A subscriber's frames: changes as (commit_ts, id, op), the closed timestamps, each change
    with the last closed T before it."""

    def __init__(self):
        self.changes: list[tuple[int, int, str]] = []
        self.closed: list[int] = []
        self.error: dict | None = None

    def take(self, frame):
        if isinstance(frame, list):
            for ch in frame:
                assert set(ch) == {"op", "commit_ts", "row"}
                if ch["op"] == "delete":
                    assert set(ch["row"]) == {"id"}
                self.changes.append((ch["commit_ts"], ch["row"]["id"], ch["op"]))
        elif "closed" in frame:
            assert not self.closed or frame["closed"] > self.closed[-1], "closed timestamps move up"
            self.closed.append(frame["closed"])
        else:
            self.error = frame["error"]

    def upto(self, T: int) -> list[tuple[int, int, str]]:
        return sorted(c for c in self.changes if c[0] <= T)


async def _ws_until(session, u: str, until: int, rec: Received, timeout: float = 60):
    async with session.ws_connect(u) as ws:
        deadline = time.monotonic() + timeout
        while not rec.closed or rec.closed[-1] < until:
            msg = await ws.receive(timeout=max(deadline - time.monotonic(), 0.1))
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            rec.take(json.loads(msg.data))


def _sse_until(node, u: str, until: int, rec: Received, timeout: float = 60):
    path = u.removeprefix(node.base)
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=timeout)
    conn.request("GET", path, headers={"Accept": "text/event-stream"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    event_id = None
    try:
        while not rec.closed or rec.closed[-1] < until:
            line = r.fp.readline().decode()
            assert line, "the stream ended"
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                rec.take(json.loads(line[6:]))
                if "closed" in json.loads(line[6:]):
                    assert event_id == rec.closed[-1]  # a closed frame carries its T as the event id
    finally:
        conn.close()


async def test_subscribers_get_the_models_changes_and_resume_exactly_once(node):
    rng = random.Random(int(os.environ.get("TERRASCALE_SEED", "39")))
    model = Model()
    async with AsyncClient(node.base) as c, aiohttp.ClientSession() as session:
        await asyncio.gather(*(_writer(c, model, random.Random(rng.random()), 10) for _ in range(3)))
        start = (await c.status())["closed_ts"]
        filters = [_filter(rng) for _ in range(4)]
        writing = asyncio.gather(*(_writer(c, model, random.Random(rng.random()), 25) for _ in range(4)))
        await asyncio.sleep(0.05)
        end_box: list[int] = []

        async def until() -> int:
            await writing
            end_box.append((await c.status())["closed_ts"])
            return end_box[0]

        recs = [Received() for _ in filters]
        sse = Received()
        done = asyncio.ensure_future(until())

        async def follow(f, rec):  # a subscriber that stays until the writers are done
            async with session.ws_connect(url(node, **f, **{"from": str(start)})) as ws:
                while not (done.done() and rec.closed and rec.closed[-1] >= done.result()):
                    msg = await ws.receive(timeout=30)
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    rec.take(json.loads(msg.data))
        await asyncio.gather(*(follow(f, r) for f, r in zip(filters, recs)), done)
        await asyncio.to_thread(_sse_until, node, url(node, **filters[0], **{"from": str(start)}), done.result(), sse)
        for f, rec in zip(filters + filters[:1], recs + [sse]):
            last = rec.closed[-1]
            assert rec.upto(last) == model.expected(f, start, last), f
            assert [ch[0] for ch in rec.changes] == sorted(ch[0] for ch in rec.changes)  # commit order
        # a reconnect from a random closed T it saw: the changes after it, exactly once
        for f, rec in zip(filters, recs):
            T = rng.choice(rec.closed[:-1] or rec.closed)
            more = asyncio.ensure_future(_writer(c, model, random.Random(rng.random()), 5))
            again = Received()
            await more
            await _ws_until(session, url(node, **f, **{"from": str(T)}), (await c.status())["closed_ts"], again)
            before = [ch for ch in rec.upto(rec.closed[-1]) if ch[0] <= T]
            assert before + again.upto(again.closed[-1]) == model.expected(f, start, again.closed[-1])
    eventually(lambda: holds(metric(node, "terrascale_subscriptions") == 0))


def test_bad_requests_are_refused_before_the_upgrade_and_open_nothing(node):
    frames = metric(node, "terrascale_subscription_frames_total", kind="closed")
    cases = [
        (url(node, where=[["nope", "=", 1]]), 400, "invalid_query"),
        (url(node, where=[["v", "~", 1]]), 400, "invalid_query"),
        (url(node, columns=["v", "nope"]), 400, "invalid_query"),
        (url(node, bbox={"column": "v", "xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}), 400, "invalid_query"),
        (url(node) + "?where=%5B%5Bnot-json", 400, "invalid_query"),
        (url(node, prefix=["not an int"]), 400, "bad_request"),
        (url(node) + "?colums=%5B%5D", 400, "bad_request"),
        (url(node, **{"from": "-3"}), 400, "invalid_as_of"),
        (url(node, table="nope"), 404, "table_not_found"),
        (url(node, **{"from": "1"}), 410, "history_purged"),
        (url(node, **{"from": str(2**62)}), 409, "future_timestamp"),
    ]
    key = base64.b64encode(os.urandom(16)).decode()
    for u, status, code in cases:
        path = u.removeprefix(node.base)
        for headers in ({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key,
                         "Sec-WebSocket-Version": "13"}, {"Accept": "text/event-stream"}):
            conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            body = json.loads(r.read())
            conn.close()
            assert (r.status, body["error"]["code"]) == (status, code), (u, body)
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    conn.request("GET", "/v1/tables/t/subscribe")  # neither a WebSocket nor an event stream
    r = conn.getresponse()
    assert r.status == 400 and json.loads(r.read())["error"]["code"] == "bad_request"
    assert metric(node, "terrascale_subscriptions") == 0
    assert metric(node, "terrascale_subscription_frames_total", kind="closed") == frames


async def test_more_subscriptions_than_the_limit_are_429(node):
    async with aiohttp.ClientSession() as session:
        open_ = [await session.ws_connect(url(node)) for _ in range(8)]
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(url(node))
        assert e.value.status == 429
        for ws in open_:
            await ws.close()
    eventually(lambda: holds(metric(node, "terrascale_subscriptions") == 0))


def _stalled_subscriber(node) -> socket.socket:
    """A WebSocket subscriber that never reads, with a small receive buffer."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", node.port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /v1/tables/big/subscribe HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


async def _load(c: AsyncClient, table: str, rounds: int = 30) -> float:
    """~12 MB of rows in 1,000-row upserts; the seconds they took."""
    pad = "x" * 400
    t0 = time.perf_counter()
    for k in range(rounds):
        await c.upsert(table, [{"id": k * 1000 + i, "pad": pad} for i in range(1000)])
    return time.perf_counter() - t0


async def test_a_subscriber_that_stops_reading_is_dropped_and_writers_go_on(node):
    with node.client() as c:
        c.create_table("big", [("id", "int64"), ("pad", "string")], "id", partitions=2)
        c.create_table("alone", [("id", "int64"), ("pad", "string")], "id", partitions=2)
    async with AsyncClient(node.base) as c:
        alone = await _load(c, "alone")  # the same writes with nobody subscribed
    stalled = _stalled_subscriber(node)
    fast = Received()
    try:
        async with AsyncClient(node.base) as c, aiohttp.ClientSession() as session:
            ws = await session.ws_connect(url(node, table="big", columns=["id"]))
            took = await _load(c, "big")  # past every socket buffer and the 256 KiB budget
            end = (await c.status())["closed_ts"]
            while not fast.closed or fast.closed[-1] < end:
                msg = await ws.receive(timeout=30)
                fast.take(json.loads(msg.data))
            await ws.close()
        assert len(fast.changes) == 30_000  # the reader that keeps up has every change
        eventually(lambda: holds(metric(node, "terrascale_subscription_drops_total", reason="slow_subscriber") >= 1
                         ))
        eventually(lambda: holds(metric(node, "terrascale_subscriptions") == 0))
        stalled.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            while stalled.recv(1 << 16):  # what the node had sent, then the end: it cut the subscriber off
                pass
        print(f"writes alone {alone:.2f}s, with a stalled and a fast subscriber {took:.2f}s")
        assert took < 3 * alone + 5, (took, alone)
    finally:
        stalled.close()


def test_a_stopping_node_tells_its_subscribers_and_stops_at_once(tmp_path):
    n = NodeProc(tmp_path)
    n.start()
    try:
        with n.client() as c:
            c.create_table("t", COLUMNS, "id", partitions=2)

        async def subscribed():
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(url(n)) as ws:
                    first = json.loads((await ws.receive(timeout=10)).data)
                    assert "closed" in first
                    t0 = time.perf_counter()
                    n.proc.send_signal(signal.SIGTERM)
                    rec = Received()
                    while rec.error is None:
                        msg = await ws.receive(timeout=10)
                        assert msg.type == aiohttp.WSMsgType.TEXT, msg
                        rec.take(json.loads(msg.data))
                    closing = await ws.receive(timeout=10)
                    assert rec.error["code"] == "stopping" and closing.data == 1001, closing
                    return time.perf_counter() - t0
        took = asyncio.run(subscribed())
        assert n.proc.wait(30) == 0 and took < 10
    finally:
        n.ensure_stopped()
