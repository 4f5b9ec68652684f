"""Tables keyed by (sensor, ts) read by both Spark readers (docs/rfcs/0013-measurement-keys.md):
the same rows as the node's scan, before and after offload; a filter naming the whole
partition key plans only that partition's segments, and a window on the next key column only
the segments holding keys in it."""
from __future__ import annotations

import datetime as dt

import pytest

from tests.spark_bridge.conftest import started_node

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "spark-keys", 4)
    c = n.client()
    c.create_table("readings", [("sensor", "string"), ("ts", "timestamp"), ("v", "float64")], ["sensor", "ts"])
    for part in range(3):  # three offloaded generations and a tail
        c.upsert("readings", [{"sensor": f"s{i % 10}", "ts": (T0 + dt.timedelta(minutes=part * 100 + i)).isoformat(),
                               "v": float(part * 100 + i)} for i in range(100)])
        if part < 2:
            c.admin("seal")
            c.admin("offload")
    c.close()
    yield n
    n.stop()


def read(spark, node, reader, **opts):
    r = (spark.read.format("terrascale").option("endpoint", node.base).option("table", "readings")
         .option("reader", reader))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def _rows(df):
    return sorted((r["sensor"], r["ts"], r["v"]) for r in df.toArrow().to_pylist())


@pytest.mark.parametrize("reader", ["jvm", "python"])
def test_both_readers_read_a_composite_key_table_as_the_node_scans_it(spark, node, reader):
    c = node.client()
    want = sorted((r["sensor"], r["ts"], r["v"]) for b in c.scan("readings") for r in b.to_pylist())
    c.close()
    assert len(want) == 300 and _rows(read(spark, node, reader)) == want
    one = _rows(read(spark, node, reader, where="sensor = 's3'"))
    assert one == [w for w in want if w[0] == "s3"]


def test_a_filter_on_the_partition_key_plans_one_partition_and_a_window_fewer_segments(node):
    c = node.client()

    def plan(where=None):
        doc = {"lease_s": 30, **({"where": where} if where else {})}
        return c._call("POST", "/v1/tables/readings/plan", doc)
    everything, one = plan(), plan([["sensor", "=", "s3"]])
    window = plan([["sensor", "=", "s3"], ["ts", "<", (T0 + dt.timedelta(minutes=50)).isoformat()]])
    c.close()
    assert len(everything["tail"]) > 1 and len(one["tail"]) == 1  # one partition's tail, not every one
    assert len(everything["sealed"]) > len(one["sealed"]) == 2  # its two offloaded segments of the eight
    assert len(window["sealed"]) == 1  # the first generation alone holds those keys
