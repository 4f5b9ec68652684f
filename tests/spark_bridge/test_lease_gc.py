"""Read leases against the garbage collector (docs/rfcs/0009-gc.md): ``collect`` runs a real
pass (``Database.collect_garbage``, with ``gc.grace = 0s``). A segment whose rows were all
superseded before the retention horizon (the node keeps a 4 s history here) is retired by a
pass, and deleted by a later one only once no unexpired lease names it.

The node's segments live on S3 (moto); the executors read them through a proxy that delays
every request, so a task reads its segment for seconds — long after the horizon has passed
the snapshot's rows and an unrenewed 2 s lease would have run out. The collector keeps
refusing because the reading task renews the lease. Once the job is over and the lease has
run out the segment goes; the DataFrame whose plan still names it then stops with a lease
error before reading anything, and a new DataFrame reads the table as it is now."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pyarrow as pa
import pytest
from aiohttp import web

from rowstore.segments.store import SegState
from tests.fixtures.moto import make_bucket, s3_uri
from tests.spark_bridge.conftest import api_rows, spark_rows
from tests.spark_bridge.inproc import InProcessNode
from tests.terrafs.test_backend_s3 import FaultProxy

ROWS = 8_000
LEASE_S = 2.0
RETENTION_S = 4
DELAY_S = 1.5


class SlowProxy(FaultProxy):
    """Forwards every request to S3 after ``DELAY_S`` (a slow object store, for the readers)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(DELAY_S)
        return await self._forward(request, await request.read())


async def collect(db, segid: int) -> str:
    """One pass; then s1 is "retained" (live at the horizon), "leased" (retired, held by a
    lease), "retired" (not leased, not yet deleted) or "deleted"."""
    res = await db.collect_garbage("g")
    if segid in res["deleted"]:
        return "deleted"
    rec = next(r for r in await db.store.list() if r.segid == segid)
    if rec.state != SegState.RETIRED:
        return "retained"
    return "leased" if segid in await db.leased_segments() else "retired"


async def lease_expiries(db) -> list[int]:
    return sorted(json.loads(e.value)["expires_ms"] for e in await db.catalog.scan("lease/"))


@pytest.fixture(scope="module")
def s3(moto_server):
    return moto_server, make_bucket(moto_server)


@pytest.fixture(scope="module")
def node(tmp_path_factory, s3):
    n = InProcessNode(tmp_path_factory.mktemp("spark-gc"), objects=s3_uri(*s3),
                      extra='[tables]\npartitions = 1\n[history]\nretention = "1h"\n'
                            '[gc]\ninterval = "0s"\ngrace = "0s"\n').start()
    yield n
    n.stop()


def rows(version: int) -> pa.Table:
    return pa.table({"id": pa.array(range(ROWS), pa.int64()), "v": pa.array([version] * ROWS, pa.int64()),
                     "pad": pa.array([f"{version}:" + "p" * 150] * ROWS)})


def read(spark, node, objects: str, **opts):
    r = spark.read.format("terrascale").option("endpoint", node.base).option("table", "g").option("objects", objects)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def warm_up(spark, node, c, objects: str) -> None:
    """A first read starts Spark's Python workers: its first task runs seconds after planning,
    a gap the default lease_s (600 s) covers and this test's 2 s does not. (Another table: a
    plan's lease names its own table's segments.)"""
    c.create_table("warm", [{"name": "id", "type": "int64"}], "id")
    c.upsert("warm", [{"id": 1}])
    c.admin("seal")
    c.admin("offload")
    c.upsert("warm", [{"id": 1}])  # load() pins the newest commit: keep it well inside the 4 s history
    assert spark.read.format("terrascale").option("endpoint", node.base).option("table", "warm") \
        .option("objects", objects).load().count() == 1


@pytest.mark.slow
def test_a_running_job_protects_its_segments_and_an_expired_lease_reads_nothing(spark, node, s3):
    direct = s3_uri(*s3)
    proxy = SlowProxy(s3[0])
    node.call(proxy.__aenter__())
    slow_objects = s3_uri(proxy.url, s3[1])
    c = node.client()
    c.create_table("g", [{"name": "id", "type": "int64"}, {"name": "v", "type": "int64"},
                         {"name": "pad", "type": "string"}], "id")
    c.upsert("g", rows(1))
    c.admin("seal")
    c.admin("offload")
    (s1,) = [s["segid"] for s in c.segments("g")["segments"] if s["state"] == "offloaded"]
    warm_up(spark, node, c, direct)
    node.db.reader.retention_ms = RETENTION_S * 1000  # after the warm-up, whose first task may start late
    node.db.reader.purge_lag_ms = 0  # the lease alone protects s1 as soon as the retention lets go of it
    c.upsert("warm", [{"id": 2}])  # a commit: load() pins a recent T (the plan must come within 4 s of it)
    old = read(spark, node, slow_objects, lease_s=LEASE_S)  # pins the snapshot now: the v1 rows, in s1
    c.upsert("g", rows(2))  # supersedes every row of s1

    result, answers, expiries = [], [], []
    job = threading.Thread(target=lambda: result.append(old.count()))
    job.start()
    while job.is_alive() and not node.call(lease_expiries(node.db)):
        time.sleep(0.01)  # planning: until the plan's lease exists, retention keeps s1
    while job.is_alive():
        got = node.call(collect(node.db, s1))
        assert got != "deleted", "the collector deleted a segment a running job was reading"
        answers.append(got)
        expiries.extend(node.call(lease_expiries(node.db)))
        time.sleep(0.1)
    job.join()
    assert result == [ROWS]  # the job read the whole snapshot: s1, from S3
    assert answers.count("leased") >= 5  # protected by the lease alone once retention let go of s1
    assert len(set(expiries)) >= 3  # the reading task renewed it

    time.sleep(LEASE_S + 0.5)  # the job is over: nobody renews; the lease runs out
    assert node.call(collect(node.db, s1)) == "deleted"
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        old.count()  # the DataFrame's plan still names s1: its lease is refused before any read
    assert "LeaseExpiredError" in str(e.value) and "expired" in str(e.value)
    assert "ObjectNotFound" not in str(e.value)
    now = read(spark, node, direct)  # the node has been idle for longer than the retention by now
    assert spark_rows(now, "id") == api_rows(c.query("g", limit=ROWS + 10), "id")
    assert {r["v"] for r in spark_rows(now, "id")} == {2}
    c.close()
    node.call(proxy.__aexit__())
