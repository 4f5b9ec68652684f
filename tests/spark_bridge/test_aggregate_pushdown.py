"""Aggregates pushed down from Spark to the node (RFC 0012, the JVM reader's
SupportsPushDownAggregates) equal Spark's own aggregation of the same rows at the same T (the
Python reader, which pushes nothing down); what the node cannot answer as Spark would stays
Spark's, with the same results."""
from __future__ import annotations

import math

import pytest
from pyspark.sql import functions as F

from tests.spark_bridge.conftest import started_node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "spark-agg", 3)
    c = n.client()
    c.create_table("a", [{"name": "id", "type": "int64"}, {"name": "g", "type": "string"},
                         {"name": "k", "type": "int32"}, {"name": "v", "type": "float64"},
                         {"name": "ts", "type": "timestamp"}], "id", indexes=["g", "v"])
    c.upsert("a", [{"id": i, "g": f"g{i % 5}", "k": None if i % 9 == 0 else i % 4, "v": (i % 40) / 2 - 7,
                    "ts": 1_700_000_000_000_000 + i * 1_000_000} for i in range(3000)])
    c.admin("seal")
    c.admin("offload")
    c.upsert("a", [{"id": i, "g": "g9", "k": 7, "v": 0.5, "ts": 1_800_000_000_000_000} for i in range(100, 160)])
    c.delete("a", list(range(0, 3000, 13)))
    yield n
    c.close()
    n.stop()


def read(spark, node, reader, **opts):
    r = spark.read.format("terrascale").option("endpoint", node.base).option("table", "a").option("reader", reader)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def plan_of(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def rows(df) -> list:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def close(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        for u, w in zip(x, y):
            if isinstance(u, float) and isinstance(w, float):
                if not (math.isclose(u, w, rel_tol=1e-12, abs_tol=1e-12) or (math.isnan(u) and math.isnan(w))):
                    return False
            elif u != w:
                return False
    return True


QUERIES = {
    "grouped": lambda df: df.groupBy("g").agg(F.count("*"), F.count("k"), F.sum("k"), F.avg("v"), F.min("k"),
                                              F.max("ts"), F.countDistinct("k"), F.sum("v")),
    "global": lambda df: df.agg(F.sum("v"), F.avg("k"), F.max("g"), F.count("*")),
    "two keys": lambda df: df.groupBy("g", "k").agg(F.count("*"), F.min("ts")),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_pushed_aggregates_equal_spark_s_own(spark, node, name):
    c = node.client()
    T = c.aggregate("a", [{"fn": "count"}])["as_of"]
    c.close()
    jvm = QUERIES[name](read(spark, node, "jvm", as_of=T))
    py = QUERIES[name](read(spark, node, "python", as_of=T))
    assert "aggregate=" in plan_of(jvm), plan_of(jvm)  # answered by the node: no aggregation in Spark
    assert close(rows(jvm), rows(py)), (rows(jvm), rows(py))


def test_where_option_is_pushed_with_the_aggregate(spark, node):
    jvm = read(spark, node, "jvm", where="v > 0").groupBy("g").agg(F.count("*"), F.avg("v"))
    py = read(spark, node, "python", where="v > 0").groupBy("g").agg(F.count("*"), F.avg("v"))
    assert "aggregate=" in plan_of(jvm)
    assert close(rows(jvm), rows(py))


def test_what_the_node_cannot_answer_stays_spark_s(spark, node):
    for q in (lambda df: df.groupBy(F.floor("v")).count(),  # an expression
              lambda df: df.filter(F.col("k") > 1).groupBy("g").count(),  # a Spark filter above
              lambda df: df.groupBy("v").agg(F.max("v"))):  # floats: Spark's -0.0 and NaN rules
        jvm, py = q(read(spark, node, "jvm")), q(read(spark, node, "python"))
        assert "aggregate=" not in plan_of(jvm)
        assert close(rows(jvm), rows(py))
