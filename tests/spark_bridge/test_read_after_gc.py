"""Spark reads of a table the garbage collector rewrote (docs/rfcs/0009-gc.md): copies in
cluster order, with rows of every column type and two schema versions, read by both
readers from the object store, equal the node's query API; a bbox read skips the copies
whose cluster range it misses and still equals the API."""
from __future__ import annotations

import pytest

from bench.node_proc import NodeProc
from tests.node.proc import eventually, holds
from tests.spark_bridge.conftest import api_rows, spark_rows
from tests.spark_bridge.test_read import COLUMNS, make_rows

# 5 s of history: a Spark read pins a snapshot a little in the past (0 s would refuse it); no
# purge lag beyond it: the test waits for the horizon to pass every superseding version
EXTRA = '[tables]\npartitions = 2\n[history]\nretention = "5s"\npurge_lag = "0s"\n' \
        '[gc]\ninterval = "0s"\ngrace = "0s"\n[segments]\nseal_bytes = "256KiB"\n'


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("spark-gc-read"), extra=EXTRA).start()
    c = n.client()
    c.create_table("all", [{"name": k, "type": t} for k, t in COLUMNS], "id", indexes=["s"], cluster_by="loc")
    c.upsert("all", make_rows(range(0, 2000), 1, 1))
    c.admin("seal")
    c.upsert("all", make_rows(range(0, 1500), 2, 2))  # most of the first version is garbage now
    c.delete("all", list(range(0, 2000, 9)))
    c.add_column("all", "extra", "float64")
    c.admin("seal")
    c.upsert("all", [{"id": 5000}])  # a newer segment: the last one is collected too
    c.admin("seal")
    c.admin("offload")
    # until the horizon passes every superseding version (5 s of history): a dry run says so
    eventually(lambda: holds(len(c.gc(dry_run=True)["victims"]) >= 2, "two segments to collect"), 30, 0.5)
    res = c.gc()
    assert res["segments_collected"] >= 2 and res["rows_copied"] > 0 and res["deleted"]
    c.close()
    yield n
    n.stop()


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["jvm", "python"])
def test_copies_read_by_spark_equal_the_api(spark, node, reader):
    c = node.client()
    segs = c.segments("all")["segments"]
    assert any(s["cluster"] for s in segs)  # clustered copies are what the executors read
    df = spark.read.format("terrascale").option("endpoint", node.base).option("table", "all") \
        .option("reader", reader).load()
    assert spark_rows(df, "id") == api_rows(c.query("all", limit=100_000), "id")
    box = {"column": "loc", "xmin": 2.0, "ymin": -3.0, "xmax": 4.5, "ymax": 1.0}
    df = spark.read.format("terrascale").option("endpoint", node.base).option("table", "all") \
        .option("reader", reader).option("bbox", "loc:2,-3,4.5,1").load()
    want = api_rows(c.query("all", bbox=box, limit=100_000), "id")
    assert want and spark_rows(df, "id") == want
    c.close()
