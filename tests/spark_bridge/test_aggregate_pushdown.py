"""Aggregates pushed down from Spark to the node (RFC 0012, the JVM reader's
SupportsPushDownAggregates) equal Spark's own aggregation of the same rows at the same T (the
Python reader, which pushes nothing down): answered whole by the node where its answer is
Spark's, as per-partition partials that Spark merges where only Spark's merge is (float keys,
float min/max: -0.0/0.0 and NaN), and not pushed at all otherwise."""
from __future__ import annotations

import math

import pyarrow as pa
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


def read(spark, node, reader, table="a", **opts):
    r = spark.read.format("terrascale").option("endpoint", node.base).option("table", table).option("reader", reader)
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
    assert complete(plan_of(jvm)), plan_of(jvm)
    assert close(rows(jvm), rows(py)), (rows(jvm), rows(py))


def complete(plan: str) -> bool:
    """Answered whole by the node: no aggregation of Spark's above the scan."""
    return "aggregate=" in plan and "partial per partition" not in plan and "Aggregate(" not in plan


def partial(plan: str) -> bool:
    """Pushed as per-partition partials: the scan says so, and Spark's own aggregation (hash or sort) merges them."""
    return "partial per partition" in plan and "Aggregate(" in plan


def test_where_option_is_pushed_with_the_aggregate(spark, node):
    jvm = read(spark, node, "jvm", where="v > 0").groupBy("g").agg(F.count("*"), F.avg("v"))
    py = read(spark, node, "python", where="v > 0").groupBy("g").agg(F.count("*"), F.avg("v"))
    assert "aggregate=" in plan_of(jvm)
    assert close(rows(jvm), rows(py))


def test_what_the_node_cannot_answer_stays_spark_s(spark, node):
    for q in (lambda df: df.groupBy(F.floor("v")).count(),  # an expression
              lambda df: df.filter(F.col("k") > 1).groupBy("g").count(),  # a Spark filter above
              lambda df: df.groupBy("v").agg(F.countDistinct("k"))):  # DISTINCT cannot be partial
        jvm, py = q(read(spark, node, "jvm")), q(read(spark, node, "python"))
        assert "aggregate=" not in plan_of(jvm)
        assert close(rows(jvm), rows(py))


# -- partial pushdown: floats -----------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
FLOATS = [NAN, -0.0, 0.0, None, 1.5, -2.25, INF, -INF, 3.0, NAN, -0.0, 7.75, None, 0.0, 2.5]


@pytest.fixture(scope="module")
def floats(node):
    """Table "f": float keys and values with NaN, -0.0 and 0.0, infinities and nulls over 3 partitions, some rows
    offloaded, some in memtables, then changed: (T before the change, T after it)."""
    c = node.client()
    c.create_table("f", [{"name": "id", "type": "int64"}, {"name": "g", "type": "string"},
                         {"name": "k", "type": "int32"}, {"name": "v", "type": "float64"},
                         {"name": "f", "type": "float32"}, {"name": "ts", "type": "timestamp"}], "id",
                   indexes=["g", "v"])  # v from the index, f decoded

    def row(i, shift=0):
        v = FLOATS[(i + shift) % len(FLOATS)]
        f = FLOATS[(i * 7 + shift) % len(FLOATS)]
        return {"id": i, "g": f"g{i % 4}", "k": None if i % 11 == 0 else i % 5, "v": v, "f": f,
                "ts": 1_700_000_000_000_000 + i * 1_000_000}
    def arrow(rs):  # NaN goes as Arrow (JSON has no NaN)
        return pa.Table.from_pylist(rs, schema=pa.schema([("id", pa.int64()), ("g", pa.string()), ("k", pa.int32()),
                                                          ("v", pa.float64()), ("f", pa.float32()),
                                                          ("ts", pa.timestamp("us", tz="UTC"))]))
    c.upsert("f", arrow([row(i) for i in range(900)]))
    c.admin("seal")
    c.admin("offload")
    c.upsert("f", arrow([row(i, 3) for i in range(850, 1000)]))  # some rows rewritten, some new, in memtables
    c.delete("f", list(range(0, 1000, 17)))
    t1 = c.aggregate("f", [{"fn": "count"}])["as_of"]
    c.upsert("f", arrow([{**row(i, 5), "g": "late"} for i in range(0, 1000, 3)]))  # NaNs move, a new group
    c.delete("f", list(range(1, 1000, 19)))
    t2 = c.aggregate("f", [{"fn": "count"}])["as_of"]
    c.close()
    return t1, t2


PARTIAL = {
    "float64 key": lambda df: df.groupBy("v").agg(F.count("*"), F.count("k"), F.sum("k"), F.min("k"), F.max("ts")),
    "float32 key (decoded)": lambda df: df.groupBy("f").agg(F.count("*"), F.max("g"), F.sum("v")),
    "float min/max": lambda df: df.groupBy("g").agg(F.max("v"), F.min("v"), F.max("f"), F.min("f"), F.count("*")),
    "global, avg split": lambda df: df.agg(F.max("v"), F.min("f"), F.count("*"), F.sum("v"), F.avg("v"),
                                           F.avg("k")),
    "two keys, avg split": lambda df: df.groupBy("g", "f").agg(F.avg("k"), F.max("v"), F.count("v")),
}


def keys(rs: list, n: int) -> list:
    """The group keys, -0.0 apart from 0.0 (repr), so a key Spark folds must come out folded on both sides."""
    return sorted(repr(r[:n]) for r in rs)


@pytest.mark.parametrize("when", ["before", "after", "now"])
@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_partially_pushed_aggregates_equal_spark_s_own(spark, node, floats, name, when):
    as_of = {"before": {"as_of": floats[0]}, "after": {"as_of": floats[1]}, "now": {}}[when]
    if when == "now":
        c = node.client()
        as_of = {"as_of": c.aggregate("f", [{"fn": "count"}])["as_of"]}
        c.close()
    jvm = PARTIAL[name](read(spark, node, "jvm", "f", **as_of))
    py = PARTIAL[name](read(spark, node, "python", "f", **as_of))
    assert partial(plan_of(jvm)), plan_of(jvm)
    got, want = rows(jvm), rows(py)
    assert close(got, want), (got, want)
    n = {"float64 key": 1, "float32 key (decoded)": 1, "float min/max": 1, "two keys, avg split": 2}.get(name, 0)
    assert keys(got, n) == keys(want, n)


def test_float_keys_fold_as_spark_folds_them(spark, node, floats):
    """-0.0 and 0.0 are one group, every NaN one group, null one group: each partition's partial keeps them
    apart (the node groups by bits), Spark's merge folds them."""
    got = rows(read(spark, node, "jvm", "f", as_of=floats[0]).groupBy("v").count())
    ks = [r[0] for r in got]
    assert sum(1 for k in ks if k is not None and k == 0.0) == 1
    assert repr([k for k in ks if k is not None and k == 0.0][0]) == "0.0"  # Spark's normalized zero
    assert sum(1 for k in ks if k is not None and math.isnan(k)) == 1
    assert ks.count(None) == 1
    assert sum(r[1] for r in got) == read(spark, node, "python", "f", as_of=floats[0]).count()


def test_nan_is_the_largest_in_a_partial_max(spark, node, floats):
    """A group holding NaN has max NaN (Spark's order) though the other partitions' partials are numbers; min is
    the smallest number."""
    got = {r[0]: r[1:] for r in rows(read(spark, node, "jvm", "f", as_of=floats[0]).groupBy("g").agg(
        F.max("v"), F.min("v")))}
    assert got and all(math.isnan(mx) and not math.isnan(mn) for mx, mn in got.values()), got


def test_where_option_and_an_empty_answer_are_partial_too(spark, node, floats):
    for where, q in (("v >= 0", lambda df: df.groupBy("f").agg(F.count("*"), F.max("v"))),
                     ("k = 99", lambda df: df.agg(F.count("*"), F.max("v"), F.sum("f")))):  # no rows: one row, 0
        jvm = q(read(spark, node, "jvm", "f", as_of=floats[1], where=where))
        py = q(read(spark, node, "python", "f", as_of=floats[1], where=where))
        assert partial(plan_of(jvm)), plan_of(jvm)
        assert close(rows(jvm), rows(py)), (rows(jvm), rows(py))
    assert rows(q(read(spark, node, "jvm", "f", as_of=floats[1], where="k = 99"))) == [(0, None, None)]


def test_complete_pushdown_is_still_complete(spark, node, floats):
    """What the node answers as Spark would stays answered whole, also next to the float table."""
    for q in (lambda df: df.groupBy("g").agg(F.count("*"), F.sum("v"), F.avg("v"), F.countDistinct("k")),
              lambda df: df.groupBy("k").agg(F.min("ts"), F.max("g"), F.count("f"))):
        jvm = q(read(spark, node, "jvm", "f", as_of=floats[1]))
        assert complete(plan_of(jvm)), plan_of(jvm)
        assert close(rows(jvm), rows(read_q := q(read(spark, node, "python", "f", as_of=floats[1])))), read_q


def test_sealed_only_reads_are_aggregated_over_the_offloaded_rows_only(spark, node, floats):
    """The node's /aggregate counts every row at T, memtables too, so a sealed_only read is not pushed to it
    (count() alone is still answered from the plan's bitmaps, which sealed_only narrows)."""
    for q in (lambda df: df.groupBy("g").agg(F.count("*"), F.sum("k")),  # complete otherwise
              lambda df: df.groupBy("v").count()):  # partial otherwise
        jvm = q(read(spark, node, "jvm", "f", as_of=floats[1], sealed_only="true"))
        py = q(read(spark, node, "python", "f", as_of=floats[1], sealed_only="true"))
        assert "aggregate=" not in plan_of(jvm), plan_of(jvm)
        assert close(rows(jvm), rows(py)), (rows(jvm), rows(py))
    assert read(spark, node, "jvm", "f", as_of=floats[1], sealed_only="true").count() == \
        read(spark, node, "python", "f", as_of=floats[1], sealed_only="true").count()


def test_random_floats_with_nan_payloads_equal_spark_s_own(spark, node):
    """Seeded random rows whose floats include NaNs of several bit patterns (negative, with payloads), both zeros,
    infinities and nulls: the node groups NaNs by bits, Spark's merge must fold them all into one group."""
    import random
    import struct
    nans = [struct.unpack("<d", struct.pack("<Q", bits))[0]
            for bits in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FF4000000000000)]
    pool = [*nans, -0.0, 0.0, INF, -INF, None, 1.0, -1.0, 2.5, 1e300, -1e-300]
    rng = random.Random(2025)
    c = node.client()
    c.create_table("r", [{"name": "id", "type": "int64"}, {"name": "g", "type": "int16"},
                         {"name": "v", "type": "float64"}, {"name": "w", "type": "float64"}], "id", indexes=["v"])
    rs = [{"id": i, "g": rng.randrange(4), "v": rng.choice(pool), "w": rng.choice(pool)} for i in range(600)]
    schema = pa.schema([("id", pa.int64()), ("g", pa.int16()), ("v", pa.float64()), ("w", pa.float64())])
    c.upsert("r", pa.Table.from_pylist(rs[:400], schema=schema))
    c.admin("seal")
    c.admin("offload")
    c.upsert("r", pa.Table.from_pylist(rs[300:], schema=schema))
    T = c.aggregate("r", [{"fn": "count"}])["as_of"]
    c.close()
    for q in (lambda df: df.groupBy("v").agg(F.count("*"), F.max("w"), F.min("w"), F.sum("g")),
              lambda df: df.groupBy("g", "w").agg(F.count("v"), F.max("v")),
              lambda df: df.groupBy("g").agg(F.max("v"), F.min("v"), F.avg("w"))):
        jvm, py = q(read(spark, node, "jvm", "r", as_of=T)), q(read(spark, node, "python", "r", as_of=T))
        assert partial(plan_of(jvm)), plan_of(jvm)
        got, want = rows(jvm), rows(py)
        assert close(got, want), (got, want)
        assert keys(got, 2) == keys(want, 2)
    ks = [r[0] for r in rows(read(spark, node, "jvm", "r", as_of=T).groupBy("v").count())]
    assert sum(1 for k in ks if k is not None and math.isnan(k)) == 1
