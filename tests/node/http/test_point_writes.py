"""Coalesced point writes (node/http/coalesce.py) against a real `terrascale node run` process:
concurrent requests are merged, yet each keeps its own answer, atomicity and commit_ts;
kill -9 under 64 single-row clients loses nothing acknowledged and applies nothing in part."""
import asyncio
import json
import re

import aiohttp
import pytest

from bench.node_proc import NodeProc

COLS = [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}, {"name": "v", "type": "float64"},
        {"name": "loc", "type": "point"}, {"name": "g", "type": "int64"}]


def row(i: int, **kw) -> dict:
    return {"id": i, "name": f"s{i % 7}", "v": i / 4, "loc": {"x": i % 100, "y": 1.5}, "g": 0, **kw}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("points"))
    n.start()
    with n.client() as c:
        c.create_table("pw", [(x["name"], x["type"]) for x in COLS], "id", indexes=["name", "loc"])
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log


async def _post(http, url: str, doc) -> tuple[int, dict]:
    async with http.post(url, data=json.dumps(doc), headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def _burst(node, docs: list, path: str = "rows") -> list[tuple[int, dict]]:
    """Every body at once over its own keep-alive connection."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return await asyncio.gather(*[_post(http, f"{node.base}/v1/tables/pw/{path}", d) for d in docs])


def _groups(node) -> tuple[float, float]:
    """(coalesced requests, groups) so far, from the node's metrics."""
    text = node.client().request("GET", "/metrics")[1].decode()
    get = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # noqa: E731
    return get("terrascale_write_group_requests_sum"), get("terrascale_write_group_requests_count")


def test_a_bad_request_fails_alone_in_its_group(node):
    bad = [{"rows": [row(1_000_001, v="fast")]}, {"rows": [row(1_000_002, zz=1)]}, {"rows": [{"name": "no key"}]},
           {"rows": [row(1_000_003), row(1_000_004, g=1.5)]}, {"rows": [row(1_000_005, loc={"x": 1})]}]
    for attempt in range(5):  # until the burst really shared a group
        reqs0, groups0 = _groups(node)
        base = 10_000 * (attempt + 1)
        good = [{"rows": [row(base + i)]} for i in range(60)]
        docs = good[:30] + bad + good[30:]
        got = asyncio.run(_burst(node, docs))
        reqs1, groups1 = _groups(node)
        statuses = [s for s, _ in got]
        assert statuses[:30] == [200] * 30 and statuses[35:] == [200] * 30, got
        assert all(s == 400 and body["error"]["code"] == "invalid_rows" for s, body in got[30:35]), got[30:35]
        if reqs1 - reqs0 > groups1 - groups0:
            break
    else:
        pytest.fail("60 concurrent requests were never coalesced")
    with node.client() as c:
        for i in range(60):
            assert c.get("pw", base + i)["v"] == (base + i) / 4
        for k in range(1_000_001, 1_000_006):
            assert c.get("pw", k) is None  # the multi-row bad request is not there in part either


def test_each_request_reads_back_its_own_row_at_its_commit_ts(node):
    """Concurrent writers of the same keys: every answer's commit_ts shows that request's value."""
    docs = [{"rows": [row(500 + i % 8, g=i)]} for i in range(64)]
    got = asyncio.run(_burst(node, docs))
    assert all(s == 200 for s, _ in got), got
    assert len({b["commit_ts"] for _, b in got}) == 64  # one per request, even when coalesced
    with node.client() as c:
        for i, (_, b) in enumerate(got):
            r = c.get("pw", 500 + i % 8, as_of=b["commit_ts"])
            assert r["g"] == i and r["v"] == (500 + i % 8) / 4
            assert c.query("pw", where=[["name", "=", f"s{(500 + i % 8) % 7}"], ["id", "=", 500 + i % 8]],
                           as_of=b["commit_ts"]).column("g").to_pylist() == [i]


def test_multi_row_requests_are_atomic_when_coalesced(node):
    """10-row requests spread over partitions: whole or (a bad one) absent."""
    docs = [{"rows": [row(20_000 + 10 * i + j, g=i) for j in range(10)]} for i in range(24)]
    docs[5]["rows"][7]["v"] = [1]  # one bad value: that request is refused whole
    got = asyncio.run(_burst(node, docs))
    assert [s for s, _ in got] == [200] * 5 + [400] + [200] * 18
    with node.client() as c:
        t = c.query("pw", where=[["id", ">=", 20_000], ["id", "<", 20_240]], columns=["id", "g"])
        gs = t.column("g").to_pylist()
        assert sorted(set(gs)) == [i for i in range(24) if i != 5] and all(gs.count(g) == 10 for g in set(gs))
        for i, (s, b) in enumerate(got):
            if s == 200:
                assert b["committed"] == 10
                assert c.get("pw", 20_000 + 10 * i + 9, as_of=b["commit_ts"])["g"] == i


def test_coalesced_deletes_count_and_read_back(node):
    asyncio.run(_burst(node, [{"rows": [row(30_000 + i)]} for i in range(32)]))
    docs = [{"keys": [30_000 + i]} for i in range(32)] + [{"keys": [39_000 + i]} for i in range(8)] + \
        [{"keys": ["not a key"]}]
    got = asyncio.run(_burst(node, docs, "delete"))
    assert [b["deleted"] for _, b in got[:40]] == [1] * 32 + [0] * 8
    assert got[40][0] == 400
    with node.client() as c:
        for i, (_, b) in enumerate(got[:32]):
            assert c.get("pw", 30_000 + i) is None
            assert c.get("pw", 30_000 + i, as_of=b["commit_ts"]) is None
            assert c.get("pw", 30_000 + i, as_of=b["commit_ts"] - 1) is not None


def test_python_client_single_row_upsert(node):
    with node.client() as c:
        res = c.upsert("pw", row(40_000))
        assert res["committed"] == 1 and c.get("pw", 40_000, as_of=res["commit_ts"])["v"] == 10_000


# -- kill -9 under 64 single-row clients ------------------------------------------------------------


async def _load(node, acked: dict, stop: asyncio.Event, clients: int = 64) -> None:
    """48 clients writing single rows, 16 writing 10-row requests (group g = the request's id)."""
    async def client(k: int):
        async with aiohttp.ClientSession() as http:
            for seq in range(1_000_000):
                if stop.is_set():
                    return
                rid = k * 1_000_000 + seq
                n = 10 if k % 4 == 0 else 1
                doc = {"rows": [{"id": rid * 10 + j, "g": rid, "v": float(j)} for j in range(n)]}
                try:
                    status, body = await _post(http, f"{node.base}/v1/tables/kk/rows", doc)
                except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError):
                    return
                if status != 200:
                    return
                acked[rid] = n

    await asyncio.gather(*[client(k) for k in range(clients)])


@pytest.mark.slow
def test_kill_9_under_64_single_row_clients(tmp_path):
    node = NodeProc(tmp_path).start()
    try:
        with node.client() as c:
            c.create_table("kk", [("id", "int64"), ("g", "int64"), ("v", "float64")], "id")

        async def run():
            acked, stop = {}, asyncio.Event()
            task = asyncio.ensure_future(_load(node, acked, stop))
            while len(acked) < 1500:
                await asyncio.sleep(0.02)
            node.kill()
            stop.set()
            await task
            return acked

        acked = asyncio.run(run())
        node.start()
        with node.client() as c:
            t = c.query("kk", columns=["id", "g"], limit=10**9)
        ids, gs = t.column("id").to_pylist(), t.column("g").to_pylist()
        assert all(i // 10 == g for i, g in zip(ids, gs))
        counts: dict[int, int] = {}
        for g in gs:
            counts[g] = counts.get(g, 0) + 1
        lost = [rid for rid in acked if counts.get(rid) != acked[rid]]
        assert not lost, f"acknowledged requests lost or partial: {lost[:10]}"
        partial = [g for g, n in counts.items() if n not in (1, 10) or (n == 1 and (g // 1_000_000) % 4 == 0)]
        assert not partial, f"requests applied in part: {partial[:10]}"
    finally:
        node.ensure_stopped()
