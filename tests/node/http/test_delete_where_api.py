"""Deletes by predicate over HTTP against a real node process (RFC 0016 §6): ``POST
/v1/tables/{t}/delete`` with ``where``/``bbox``/``prefix`` deletes at one T exactly the rows
that matched at T − 1 (``deleted`` counts them), a read as of T − 1 still has them, a
subscriber watching the table receives their deletions at T, and the CLI does the same; bad
requests are refused with the contract's codes and change nothing."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import aiohttp
import pytest

from bench.node_proc import NodeProc
from node.client.client import AsyncClient
from tests.rowstore.db.read.test_subscribe import _matches

COLUMNS = [("id", "int64"), ("loc", "point"), ("v", "float64"), ("n", "int64")]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("delete_where"), extra='\n[subscriptions]\nprogress_every = "50ms"\n')
    n.start()
    with n.client() as c:
        c.create_table("t", COLUMNS, "id", partitions=4, indexes=["v"])
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log, log[-3000:]


def _rows(rng, ids):
    return [{"id": i, "loc": {"x": rng.uniform(0, 100), "y": rng.uniform(0, 100)}, "v": rng.uniform(-50, 50),
             "n": rng.randrange(20)} for i in ids]


async def _all(c, as_of=None):
    got = await c.query("t", limit=None, as_of=as_of)
    return {r["id"]: r for r in got.to_pylist()}


async def test_a_delete_by_predicate_over_http_and_its_subscriber(node):
    rng = random.Random(3)
    async with AsyncClient(node.base) as c, aiohttp.ClientSession() as session:
        for lo in range(0, 600, 100):
            await c.upsert("t", _rows(rng, range(lo, lo + 100)))
        start = (await c.status())["closed_ts"]
        async with session.ws_connect(f"{node.base}/v1/tables/t/subscribe?from={start}") as ws:
            f = {"where": [["v", "<", -10.0]], "bbox": {"column": "loc", "xmin": 10, "ymin": 10, "xmax": 90,
                                                         "ymax": 90}}
            before = await _all(c)
            gone = sorted(i for i, r in before.items() if _matches(r, f))
            res = await c.delete_where("t", **f)
            T = res["commit_ts"]
            assert res["deleted"] == len(gone) > 20
            assert await _all(c, T - 1) == before
            assert await _all(c, T) == {i: r for i, r in before.items() if i not in gone}
            seen, closed = [], 0
            while closed < T:
                frame = json.loads((await ws.receive(timeout=30)).data)
                if isinstance(frame, list):
                    seen += [(ch["commit_ts"], ch["row"]["id"]) for ch in frame if ch["op"] == "delete"]
                else:
                    closed = frame["closed"]
            assert sorted(seen) == [(T, i) for i in gone]
        # a prefix covering the key: one partition, one row
        res = await c.delete_where("t", prefix=[gone[-1] + 1])
        assert res["deleted"] == (1 if gone[-1] + 1 in before else 0)


async def test_bad_deletes_are_refused_and_change_nothing(node):
    async with AsyncClient(node.base) as c, aiohttp.ClientSession() as session:
        await c.upsert("t", _rows(random.Random(4), range(1000, 1050)))
        before = await _all(c)
        cases = [({}, 400, "bad_request"), ({"where": []}, 400, "invalid_query"),
                 ({"keys": [1], "where": [["v", "<", 0]]}, 400, "bad_request"),
                 ({"where": [["nope", "<", 0]]}, 400, "invalid_query"), ({"where": [["v", "~", 0]]}, 400,
                                                                         "invalid_query"),
                 ({"bbox": {"column": "v", "xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}}, 400, "invalid_query"),
                 ({"prefix": ["x"]}, 400, "bad_request"), ({"where": "v < 0"}, 400, "invalid_query"),
                 ({"colour": 1}, 400, "bad_request")]
        for body, status, code in cases:
            async with session.post(f"{node.base}/v1/tables/t/delete", json=body) as r:
                doc = await r.json()
                assert (r.status, doc["error"]["code"]) == (status, code), (body, doc)
        async with session.post(f"{node.base}/v1/tables/nope/delete", json={"where": [["v", "<", 0]]}) as r:
            assert r.status == 404
        assert await _all(c) == before


def test_the_cli_deletes_by_predicate(node):
    with node.client() as c:
        c.upsert("t", _rows(random.Random(5), range(2000, 2010)))
        want = c.query("t", where=[["id", ">=", 2000], ["n", "<", 10]], limit=None).num_rows
    out = subprocess.run([sys.executable, "-m", "node.cli", "--endpoint", node.base, "delete", "t", "--where",
                          "id >= 2000", "--where", "n < 10", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["deleted"] == want
    bad = subprocess.run([sys.executable, "-m", "node.cli", "--endpoint", node.base, "delete", "t", "5", "--where",
                          "n < 10"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not both" in bad.stderr
