"""The clients of subscriptions against real node processes (docs/rfcs/0015-subscriptions.md):
``Client.subscribe`` and ``AsyncClient.subscribe`` resume by themselves — across a node
stopped and started, killed with -9 and started, and the node ending a subscriber that fell
behind — and yield every matching change exactly once; ``terrascale watch`` prints them."""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import threading

import pytest

from bench.node_proc import TERRASCALE, NodeProc
from node.client.client import AsyncClient
from node.errors import ApiError
from tests.node.proc import eventually, holds, metric

COLUMNS = [("id", "int64"), ("v", "float64"), ("pad", "string")]


def _writes(node, rounds: int, seed: int, log: list, pad: int = 10, rows: int = 5, ids: int = 50) -> None:
    """``rounds`` upserts and deletes of random ids; each change (commit_ts, id, op, v) in ``log``."""
    rng = random.Random(seed)
    with node.client() as c:
        for _ in range(rounds):
            if rng.random() < 0.2:
                gone = rng.sample(range(ids), 2)
                res = eventually(lambda gone=gone: c.delete("t", gone), timeout=60)
                log += [(res["commit_ts"], i, "delete", None) for i in gone]
            else:
                batch = [{"id": i, "v": rng.uniform(-1, 1), "pad": "p" * pad} for i in rng.sample(range(ids), rows)]
                res = eventually(lambda batch=batch: c.upsert("t", batch), timeout=60)
                log += [(res["commit_ts"], r["id"], "upsert", r["v"]) for r in batch]


def _expected(log, after: int, upto: int, positive_only: bool = False):
    """The changes in (after, upto] a subscription to ``v > 0`` (or everything) gets."""
    last: dict[int, float | None] = {}
    out = []
    for ts, i, op, v in sorted(log):
        old = last.get(i)
        last[i] = v
        hit = not positive_only or (v is not None and v > 0) or (old is not None and old > 0)
        if after < ts <= upto and hit:
            out.append((ts, i, op))
    return out


@pytest.fixture
def node(tmp_path):
    n = NodeProc(tmp_path, extra='\n[subscriptions]\nprogress_every = "100ms"\nbuffer_bytes = "64KiB"\n')
    n.start()
    with n.client() as c:
        c.create_table("t", COLUMNS, "id", partitions=4)
    yield n
    n.ensure_stopped()


def test_the_blocking_client_resumes_across_restarts_exactly_once(node):
    with node.client() as c:
        start = c.status()["closed_ts"]
    log: list = []
    got: list = []
    closed: list[int] = []
    done = threading.Event()

    def follow():
        with node.client() as c:
            for item in c.subscribe("t", where=[["v", ">", 0]], from_ts=start, idle_timeout=5):
                if "closed" in item:
                    closed.append(item["closed"])
                    if done.is_set() and item["closed"] >= done.until:
                        return
                else:
                    got.append((item["commit_ts"], item["row"]["id"], item["op"]))
    t = threading.Thread(target=follow)
    t.start()
    _writes(node, 30, 1, log)
    node.stop()  # SIGTERM: the subscription hears "stopping", then nothing answers for a while
    node.start()
    _writes(node, 30, 2, log)
    node.kill()  # kill -9
    node.start()
    _writes(node, 30, 3, log)
    with node.client() as c:
        done.until = c.status()["closed_ts"]
    done.set()
    t.join(120)
    assert not t.is_alive()
    assert sorted(got) == _expected(log, start, closed[-1], positive_only=True)
    assert [g[0] for g in got] == sorted(g[0] for g in got)


async def test_the_async_client_resumes_after_the_node_drops_it_for_falling_behind(node):
    log: list = []
    got: list = []
    async with AsyncClient(node.base) as c:
        start = (await c.status())["closed_ts"]
        writer = None
        until = closed = 0
        async for item in c.subscribe("t", from_ts=start, idle_timeout=5):
            if "closed" not in item:
                got.append((item["commit_ts"], item["row"]["id"], item["op"]))
                continue
            closed = item["closed"]
            if writer is None:  # ~20 MB of changes while this reader looks away for longer than the node waits:
                writer = asyncio.ensure_future(asyncio.to_thread(_writes, node, 10, 4, log, 2000, 1000, 5000))
                # all of them written first (a loaded machine wrote too few of them in a fixed 7 s)
                await asyncio.gather(asyncio.sleep(7), asyncio.wait([writer], timeout=180))
            elif writer.done() and not until:
                until = (await c.status())["closed_ts"]
            if until and closed >= until:
                break
        await writer
    assert metric(node, "terrascale_subscription_drops_total", reason="slow_subscriber") >= 1
    assert sorted(got) == _expected(log, start, closed)


def test_a_bad_filter_is_raised_at_once_not_retried(node):
    with node.client() as c:
        with pytest.raises(ApiError) as e:
            next(iter(c.subscribe("t", where=[["nope", "=", 1]])))
        assert e.value.code == "invalid_query"
        with pytest.raises(ApiError) as e:
            next(iter(c.subscribe("missing")))
        assert e.value.status == 404


def test_terrascale_watch_prints_the_changes(node):
    with node.client() as c:
        start = c.status()["closed_ts"]
    log: list = []
    _writes(node, 20, 5, log)
    want = _expected(log, start, max(ts for ts, *_ in log), positive_only=True)
    out = subprocess.run([TERRASCALE, "--endpoint", node.base, "watch", "t", "--where", "v > 0", "--from", str(start),
                          "--output", "json", "--limit", str(len(want))], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert sorted((d["commit_ts"], d["row"]["id"], d["op"]) for d in lines) == want
    table = subprocess.run([TERRASCALE, "--endpoint", node.base, "watch", "t", "--from", str(start), "--columns", "v",
                            "--limit", "3"], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    head, *rows = table.stdout.splitlines()
    assert head.split("\t") == ["op", "commit_ts", "v", "id"] and len(rows) == 3
    bad = subprocess.run([TERRASCALE, "--endpoint", node.base, "watch", "t", "--where", "nope = 1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "invalid_query" in bad.stderr
    eventually(lambda: holds(metric(node, "terrascale_subscriptions") == 0))
