"""The leader's transport as one stream per follower node (RFC 0011, step 2): appends of several
partitions that arrive while a request to a node is in flight leave together in the next one,
each caller gets its own message's answer (a fenced one only for its partition), a follower of
an older version gets one message per request, and a batch body that does not add up is 400."""
import asyncio
import json

import pytest

from node.cluster.transport import (APPEND, APPEND_MANY, PROMISED, HttpTransport, decode, decode_many, encode,
                                    encode_many)
from node.errors import ApiError
from rowstore.errors import FencedError


class FakeCluster:
    """Answers appends as a follower would; each call waits until the test releases it."""

    def __init__(self, many: bool = True):
        self.calls: list[tuple[str, list[dict]]] = []
        self.release = asyncio.Event()
        self.many = many

    async def call(self, node, method, path, *, body=None, headers=None):
        if path == APPEND:
            heads = [decode(body)[0]]
        elif not self.many:
            self.calls.append((path, []))
            return 404, {}, b'{"error": {"code": "not_found", "message": "no route"}}'
        else:
            heads = [decode(bytes(m))[0] for m in decode_many(body)]
        self.calls.append((path, heads))
        await self.release.wait()
        answers = [self._one(h) for h in heads]
        if path == APPEND:
            a = answers[0]
            return a["status"], {PROMISED: str(a.get("promised", 0))}, json.dumps(a["body"]).encode()
        return 200, {}, json.dumps({"answers": answers}).encode()

    @staticmethod
    def _one(h: dict) -> dict:
        if h["pid"] == 3:
            return {"status": 409, "body": {"error": {"code": "fenced", "message": "epoch 9 promised"}},
                    "promised": 9}
        return {"status": 200, "body": {"pos": [1, h["pid"] * 10]}}


def header(pid: int) -> dict:
    return {"table": "T", "pid": pid, "epoch": 1, "base": 0, "start": [0, 0], "clock": 0, "pieces": []}


async def test_appends_that_wait_for_a_request_in_flight_leave_together():
    cl = FakeCluster()
    tr = HttpTransport(cl, timeout_s=5, streams=False)
    first = asyncio.ensure_future(tr.append("n2", header(0), []))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(tr.append("n2", header(p), [])) for p in (1, 2, 3)]
    other = asyncio.ensure_future(tr.append("n3", header(5), []))  # another node: its own stream
    await asyncio.sleep(0.01)
    cl.release.set()
    assert (await first)["pos"] == [1, 0]
    assert [(await r)["pos"] for r in rest[:2]] == [[1, 10], [1, 20]]
    with pytest.raises(FencedError) as e:
        await rest[2]  # fenced: that partition's caller only
    assert e.value.promised == 9
    assert (await other)["pos"] == [1, 50]
    paths = [(p, [h["pid"] for h in hs]) for p, hs in cl.calls]
    assert (APPEND, [0]) in paths and (APPEND_MANY, [1, 2, 3]) in paths and (APPEND, [5]) in paths
    assert tr.requests == 3


async def test_a_follower_without_append_many_gets_one_message_per_request():
    cl = FakeCluster(many=False)
    cl.release.set()
    tr = HttpTransport(cl, timeout_s=5, streams=False)
    blocker = asyncio.Event()
    real = cl.call

    async def slow_first(node, method, path, **kw):  # the first request stays in flight a moment
        if not cl.calls:
            await blocker.wait()
        return await real(node, method, path, **kw)
    cl.call = slow_first
    first = asyncio.ensure_future(tr.append("n2", header(0), []))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(tr.append("n2", header(p), [])) for p in (1, 2)]
    await asyncio.sleep(0)
    blocker.set()
    assert [(await f)["pos"] for f in (first, *rest)] == [[1, 0], [1, 10], [1, 20]]
    assert [p for p, _ in cl.calls] == [APPEND, APPEND_MANY, APPEND, APPEND]
    tr2 = [await tr.append("n2", header(4), [])]  # from now on: singles only
    assert tr2[0]["pos"] == [1, 40] and [p for p, _ in cl.calls][-1] == APPEND


async def test_a_failed_batch_request_fails_each_of_its_callers():
    class Down(FakeCluster):
        async def call(self, node, method, path, **kw):
            raise ConnectionError("node n2 does not answer")
    tr = HttpTransport(Down(), timeout_s=5, streams=False)
    got = await asyncio.gather(*(tr.append("n2", header(p), []) for p in range(3)), return_exceptions=True)
    assert all(isinstance(g, ConnectionError) for g in got)


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x00", b"\x02\x00\x00\x00\x05\x00\x00\x00abc",
                                  encode_many([b"x"]) + b"tail", b"\xff\xff\xff\xff"])
def test_a_batch_body_that_does_not_add_up_is_400(body):
    with pytest.raises(ApiError) as e:
        decode_many(body)
    assert e.value.status == 400


def test_a_batch_body_round_trips():
    bodies = [encode(header(p), [b"abc" * p]) for p in range(4)]
    assert [bytes(m) for m in decode_many(encode_many(bodies))] == bodies


@pytest.mark.slow
def test_three_nodes_carry_several_partitions_appends_per_request_and_lose_nothing(tmp_path):
    """Three real nodes, R = 3, 8 partitions, 8 writers at once, every node-to-node request held
    100 ms (a slow link, ``TERRASCALE_FAILPOINT_CUT_DIR``): appends of partitions that wait for
    the request in flight leave together (each leader's status counts more messages than
    requests), and every acknowledged batch reads back whole from every node."""
    import threading

    from bench.node_proc import raft_cluster
    from tests.node.cluster.test_replication import FAST, batches, rows
    from tests.node.proc import eventually

    nodes = raft_cluster(tmp_path, 3, extra=FAST)
    try:
        for n in nodes:
            (tmp_path / f"cut-{n.node_id}").mkdir()
            (tmp_path / f"cut-{n.node_id}" / "slow-all").write_text("100")
            n.start(wait=False, env={"TERRASCALE_FAILPOINT_CUT_DIR": str(tmp_path / f"cut-{n.node_id}")})
        for n in nodes:
            n.wait_ready(90)
        with nodes[0].client(timeout=60) as c:
            c.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=8, replicas=3)
        acked, lock = set(), threading.Lock()

        def writer(w: int) -> None:
            with nodes[w % 3].client(timeout=60) as c:
                for k in range(6):
                    bid = w * 100 + k
                    eventually(lambda bid=bid: c.upsert("t", rows(bid, n=8)), 60)
                    with lock:
                        acked.add(bid)
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert len(acked) == 48
        sent = [n.client(timeout=60).status()["replication"]["transport"] for n in nodes]
        assert sum(s["messages"] for s in sent) > sum(s["requests"] for s in sent), sent
        for n in nodes:
            with n.client(timeout=60) as c:
                got = eventually(lambda c=c: batches(c))
                assert got == {b: 8 for b in acked}, sorted(set(acked) ^ set(got))[:5]
        print("transport per node:", sent)
    finally:
        for n in nodes:
            n.ensure_stopped()
