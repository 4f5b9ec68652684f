"""The replication stream (RFC 0011, step 2; node/cluster/stream.py and the follower's
``stream`` route): a real websocket on loopback between the leader's transport and the real
follower route, over a follower engine double that records what it applied. Frames in flight
answer their own callers in whatever order they finish; a partition's messages apply in the
order they were sent, across frames; a frame not answered in time, a stream that breaks and a
malformed frame each fail only what they carried and change nothing else; a follower without
the route gets HTTP requests. Three real nodes use the stream in test_transport.py and every
replicated cluster test."""
import asyncio
import json
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web

from node.cluster import stream as stream_mod
from node.cluster.stream import FRAME_ID, STREAM
from node.cluster.transport import APPEND_MANY, HttpTransport, decode, decode_many, encode, encode_many
from node.http.routes.replication import add_replication_routes, close_streams
from rowstore.errors import FencedError


def header(pid: int, epoch: int = 1, table: str = "T") -> dict:
    return {"table": table, "pid": pid, "epoch": epoch, "base": 0, "start": [0, 0], "clock": 0, "pieces": []}


class Engine:
    """The follower's ``leadership.append``: records (pid, epoch) in the order applied; a
    partition, or a (partition, epoch), listed in ``hold`` waits for its event; epoch 0 is
    fenced."""

    def __init__(self):
        self.applied: list[tuple[int, int]] = []
        self.hold: dict[int, asyncio.Event] = {}

    async def append(self, table, pid, epoch, base, start, pieces, via, clock):
        for k in (pid, (pid, epoch)):
            if k in self.hold:
                await self.hold[k].wait()
        if epoch == 0:
            raise FencedError("epoch 0 is not above 7", 7)
        self.applied.append((pid, epoch))
        return {"pos": [1, pid * 10 + epoch], "via": via}


class _Known:
    """The tables a follower knows (``NodeReplication.partitions_of``)."""

    def __init__(self, known: dict[str, int]):
        self.known = known

    async def partitions_of(self, table_id: str) -> int | None:
        return self.known.get(table_id)


class Follower:
    """The real follower routes (append_many and stream) on loopback over an Engine."""

    def __init__(self, with_stream: bool = True):
        self.engine = Engine()
        self.api = SimpleNamespace(cfg=SimpleNamespace(max_body=1 << 20), multi=True, replication=_Known({"T": 8}),
                                   db=SimpleNamespace(leadership=self.engine), streams=set())
        self.with_stream = with_stream
        self.http_calls: list[str] = []

    async def start(self) -> str:
        app = web.Application()
        add_replication_routes(self.api, app.router)
        if not self.with_stream:  # a follower of an older version: no stream route
            app = web.Application()
            router = _Only(app.router, STREAM)
            add_replication_routes(self.api, router)

        @web.middleware
        async def count(request, handler):
            self.http_calls.append(request.path)
            return await handler(request)
        app.middlewares.append(count)
        self.runner = web.AppRunner(app, shutdown_timeout=2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        await close_streams(self.api)
        await self.runner.cleanup()


class _Only:
    """A router that leaves out one path."""

    def __init__(self, router, without: str):
        self.router, self.without = router, without

    def add_post(self, path, h):
        self.router.add_post(path, h)

    def add_get(self, path, h):
        if path != self.without:
            self.router.add_get(path, h)


class Cluster:
    """The leader's side of Cluster: one address, a real session, the fault hook."""

    def __init__(self, url: str):
        self.url, self.node_id = url, "n1"
        self.session = aiohttp.ClientSession()
        self.opened = 0

    async def open_stream(self, node, path, max_msg_size):
        self.opened += 1
        return await self.session.ws_connect(self.url + path, headers={"X-Terrascale-Forwarded-By": "n1"},
                                             max_msg_size=max_msg_size)

    async def fault(self, node):
        pass

    async def call(self, node, method, path, *, body=None, headers=None):
        async with self.session.request(method, self.url + path, data=body, headers=headers) as r:
            return r.status, dict(r.headers), await r.read()


@pytest.fixture
async def pair():
    f = Follower()
    cl = Cluster(await f.start())
    yield f, cl
    await cl.session.close()
    await f.stop()


async def test_frames_in_flight_answer_their_own_callers_in_the_order_they_finish(pair):
    f, cl = pair
    f.engine.hold[1] = asyncio.Event()
    tr = HttpTransport(cl, timeout_s=5)
    slow = asyncio.ensure_future(tr.append("n2", header(1), []))
    await asyncio.sleep(0.05)
    fast = [await tr.append("n2", header(p), []) for p in (2, 3)]  # answered while pid 1 waits
    assert [a["pos"] for a in fast] == [[1, 21], [1, 31]] and not slow.done()
    f.engine.hold[1].set()
    assert (await slow)["pos"] == [1, 11] and (await slow)["via"] == "n1"
    assert f.engine.applied == [(2, 1), (3, 1), (1, 1)]
    assert cl.opened == 1 and tr.requests == 3 and f.http_calls == [STREAM]  # one stream, no request per message


async def test_a_partitions_messages_apply_in_the_order_sent_across_frames(pair):
    f, cl = pair
    f.engine.hold[(4, 1)] = asyncio.Event()  # the first message is slow
    tr = HttpTransport(cl, timeout_s=5)
    # Three frames carrying partition 4 (a link sends one at a time; a retry after a timeout
    # may not): the follower must apply them in the order they were sent, whatever finishes.
    got = []
    for e in (1, 2, 3):
        got.append(asyncio.ensure_future(tr.append("n2", header(4, epoch=e), [])))
        await asyncio.sleep(0.02)
    assert tr.requests == 3 and f.engine.applied == []
    f.engine.hold[(4, 1)].set()
    assert [(await g)["pos"] for g in got] == [[1, 41], [1, 42], [1, 43]]
    assert f.engine.applied == [(4, 1), (4, 2), (4, 3)]


async def test_the_fifth_frame_waits_for_a_slot_and_carries_everything_that_waited(pair):
    f, cl = pair
    for p in range(8):
        f.engine.hold[p] = asyncio.Event()
    tr = HttpTransport(cl, timeout_s=5)
    first = []
    for p in range(stream_mod.IN_FLIGHT):  # each leaves in its own frame: every slot is taken
        first.append(asyncio.ensure_future(tr.append("n2", header(p), [])))
        await asyncio.sleep(0.02)
    assert tr.requests == stream_mod.IN_FLIGHT
    rest = [asyncio.ensure_future(tr.append("n2", header(p), [])) for p in range(4, 8)]
    await asyncio.sleep(0.05)
    assert tr.requests == stream_mod.IN_FLIGHT  # waiting for a slot
    for p in range(8):
        f.engine.hold[p].set()
    assert [(await g)["pos"] for g in first + rest] == [[1, p * 10 + 1] for p in range(8)]
    assert tr.requests == stream_mod.IN_FLIGHT + 1 and tr.messages == 8


async def test_a_fenced_message_fails_its_caller_only(pair):
    f, cl = pair
    tr = HttpTransport(cl, timeout_s=5)
    f.engine.hold[0] = asyncio.Event()
    blocker = []
    for _ in range(stream_mod.IN_FLIGHT):
        blocker.append(asyncio.ensure_future(tr.append("n2", header(0), [])))
        await asyncio.sleep(0.02)
    both = [asyncio.ensure_future(tr.append("n2", header(5, epoch=0), [])),
            asyncio.ensure_future(tr.append("n2", header(6), []))]
    await asyncio.sleep(0.01)
    f.engine.hold[0].set()
    await asyncio.gather(*blocker)
    with pytest.raises(FencedError) as e:
        await both[0]
    assert e.value.promised == 7 and (await both[1])["pos"] == [1, 61]


async def test_a_frame_not_answered_in_time_fails_its_callers_and_the_next_opens_a_new_stream(pair):
    f, cl = pair
    f.engine.hold[2] = asyncio.Event()
    tr = HttpTransport(cl, timeout_s=0.3)
    with pytest.raises(asyncio.TimeoutError):
        await tr.append("n2", header(2), [])
    assert (await tr.append("n2", header(3), []))["pos"] == [1, 31]
    assert cl.opened == 2
    f.engine.hold[2].set()  # the late message still applies on the follower, as over HTTP
    for _ in range(50):
        if (2, 1) in f.engine.applied:
            break
        await asyncio.sleep(0.02)
    assert (2, 1) in f.engine.applied


async def test_a_stream_the_follower_closes_fails_what_is_in_flight_and_reopens(pair):
    f, cl = pair
    f.engine.hold[1] = asyncio.Event()
    tr = HttpTransport(cl, timeout_s=5)
    assert (await tr.append("n2", header(0), []))["pos"] == [1, 1]
    pending = asyncio.ensure_future(tr.append("n2", header(1), []))
    await asyncio.sleep(0.05)
    await close_streams(f.api)  # the follower is stopping: it closes every stream
    with pytest.raises(ConnectionError):
        await pending
    f.engine.hold[1].set()
    assert (await tr.append("n2", header(3), []))["pos"] == [1, 31]
    assert cl.opened == 2


async def test_a_malformed_frame_is_refused_and_applies_nothing(pair):
    f, cl = pair
    ws = await cl.open_stream("n2", STREAM, 1 << 20)
    good = encode(header(3), [])
    bad_many = encode_many([good])[:-2]  # lengths that do not add up
    await ws.send_bytes(FRAME_ID.pack(9) + bad_many)
    got = await ws.receive()
    assert FRAME_ID.unpack_from(got.data)[0] == 9
    assert json.loads(got.data[FRAME_ID.size:])["error"]["code"] == "bad_request"
    await ws.send_bytes(FRAME_ID.pack(10) + encode_many([good, good[:-1] + b"}x"]))  # one bad message
    assert "error" in json.loads((await ws.receive()).data[FRAME_ID.size:])
    await ws.send_str("text")  # not a frame: the follower closes the stream
    assert (await ws.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert f.engine.applied == []
    await ws.close()


async def test_a_follower_without_the_stream_gets_http_requests():
    f = Follower(with_stream=False)
    cl = Cluster(await f.start())
    try:
        tr = HttpTransport(cl, timeout_s=5)
        assert (await tr.append("n2", header(0), []))["pos"] == [1, 1]
        got = await asyncio.gather(*(tr.append("n2", header(p), []) for p in (1, 2, 3)))
        assert [g["pos"] for g in got] == [[1, 11], [1, 21], [1, 31]]
        assert f.http_calls.count(STREAM) == 1 and APPEND_MANY in f.http_calls  # tried once (404)
    finally:
        await cl.session.close()
        await f.stop()


def test_the_stream_frame_is_an_id_then_an_append_many_body():
    body = encode_many([encode(header(p), []) for p in range(3)])
    frame = FRAME_ID.pack(5) + body
    assert [decode(bytes(m))[0]["pid"] for m in decode_many(memoryview(frame)[FRAME_ID.size:])] == [0, 1, 2]
