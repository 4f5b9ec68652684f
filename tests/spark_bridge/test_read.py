"""Batch reads through Spark equal the node's HTTP query API at the same timestamp: every
column type, updates, deletes and schema changes spread over offloaded segments (read by
the executors from the object store) and unsealed tails (read from the node); now and as of
past timestamps; with the where/bbox options; sealed_only; one Spark partition per segment."""
from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

import numpy as np
import pytest

from tests.spark_bridge.conftest import api_rows, spark_rows, started_node

COLUMNS = [("id", "int64"), ("i8", "int8"), ("i16", "int16"), ("i32", "int32"), ("u8", "uint8"), ("u16", "uint16"),
           ("u32", "uint32"), ("u64", "uint64"), ("f32", "float32"), ("f64", "float64"), ("b", "bool"),
           ("s", "string"), ("bin", "binary"), ("ts", "timestamp"), ("d", "date"), ("u", "uuid"), ("j", "json"),
           ("loc", "point"), ("bx", "box"), ("ri", "range<int64>"), ("rf", "range<float64>"),
           ("rt", "range<timestamp>")]
ALL = 10_000


def make_rows(keys, version: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for k in keys:
        k = int(k)
        r = {"id": k, "i8": int(rng.integers(-128, 128)), "i16": int(rng.integers(-2**15, 2**15)),
             "i32": int(rng.integers(-2**31, 2**31)), "u8": int(rng.integers(0, 256)),
             "u16": int(rng.integers(0, 2**16)), "u32": int(rng.integers(0, 2**32)),
             "u64": int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)), "f32": float(np.float32(rng.random())),
             "f64": float(rng.normal()), "b": bool(rng.integers(0, 2)), "s": f"name-{k}-v{version}",
             "bin": base64.b64encode(rng.bytes(int(rng.integers(0, 9)))).decode(),
             "ts": int(rng.integers(0, 2**50)),
             "d": (dt.date(1970, 1, 1) + dt.timedelta(days=int(rng.integers(0, 30000)))).isoformat(),
             "u": str(uuid.UUID(bytes=rng.bytes(16))), "j": {"k": k, "v": [version, None, "x"]},
             "loc": {"x": float(rng.uniform(-10, 10)), "y": float(rng.uniform(-10, 10))},
             "bx": {"xmin": 0.0, "ymin": 1.0, "xmax": float(k), "ymax": 2.5},
             "ri": {"lower": k, "upper": k + 10, "lower_inclusive": True, "upper_inclusive": False},
             "rf": {"lower": None, "upper": 1.5, "lower_inclusive": False, "upper_inclusive": True},
             "rt": {"lower": 1_000_000, "upper": None, "lower_inclusive": True, "upper_inclusive": False}}
        for c, _ in COLUMNS[1:]:
            if rng.random() < 0.05:
                r[c] = None  # every column has nulls somewhere
        rows.append(r)
    return rows


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "spark-read", 4)
    yield n
    n.stop()


@pytest.fixture(scope="module")
def history(node):
    """A table whose rows are spread over offloaded segments and tails, with updates,
    deletes and schema changes between them; the commit timestamps of each stage."""
    c = node.client()
    c.create_table("all", [{"name": n, "type": t} for n, t in COLUMNS], "id", indexes=["loc", "s"])
    ts = {}
    for lo in range(0, 3000, 1000):
        ts["loaded"] = c.upsert("all", make_rows(range(lo, lo + 1000), 1, lo))["commit_ts"]
    c.admin("seal")
    c.admin("offload")
    ts["updated"] = c.upsert("all", make_rows(range(500, 1500), 2, 7))["commit_ts"]  # newer versions in the tail
    ts["deleted"] = c.delete("all", list(range(0, 3000, 7)))["commit_ts"]
    c.admin("seal")
    c.admin("offload")
    c.add_column("all", "extra", "float64")
    c.rename_column("all", "s", "label")
    c.drop_column("all", "i8")
    rows = make_rows(range(2500, 3500), 3, 9)
    for r in rows:
        r["label"] = r.pop("s")
        r.pop("i8")
        r["extra"] = r["id"] / 2
    ts["evolved"] = c.upsert("all", rows)["commit_ts"]  # in the tails only
    c.close()
    return ts


@pytest.fixture(params=["jvm", "python"])
def reader(request):
    """Every read test runs against both readers (docs/spark.md, "Readers")."""
    return request.param


def read(spark, node, reader="auto", **opts):
    r = spark.read.format("terrascale").option("endpoint", node.base).option("table", "all").option("reader", reader)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def test_reads_equal_the_query_api_now_and_as_of_the_past(spark, node, reader, history):
    c = node.client()
    for as_of in (None, history["loaded"], history["updated"], history["deleted"]):
        got = spark_rows(read(spark, node, reader, **({} if as_of is None else {"as_of": as_of})), "id")
        want = api_rows(c.query("all", as_of=as_of, limit=ALL), "id")  # None: nothing was written since
        assert got == want, f"as_of={as_of}"
        assert 2500 < len(got) < 3500
    c.close()


def test_schema_is_the_schema_at_the_snapshot(spark, node, reader, history):
    now = read(spark, node, reader)
    assert now.columns == ["label" if n == "s" else n for n, _ in COLUMNS if n != "i8"] + ["extra"]
    past = read(spark, node, reader, as_of=history["updated"])
    assert [f.name for f in past.schema.fields] == [n for n, _ in COLUMNS]
    types = {f.name: f.dataType.simpleString() for f in past.schema.fields}
    assert types == {
        "id": "bigint", "i8": "tinyint", "i16": "smallint", "i32": "int", "u8": "smallint", "u16": "int",
        "u32": "bigint", "u64": "decimal(20,0)", "f32": "float", "f64": "double", "b": "boolean", "s": "string",
        "bin": "binary", "ts": "timestamp", "d": "date", "u": "string", "j": "string",
        "loc": "struct<x:double,y:double>", "bx": "struct<xmin:double,ymin:double,xmax:double,ymax:double>",
        "ri": "struct<lower:bigint,upper:bigint,lower_inclusive:boolean,upper_inclusive:boolean>",
        "rf": "struct<lower:double,upper:double,lower_inclusive:boolean,upper_inclusive:boolean>",
        "rt": "struct<lower:timestamp,upper:timestamp,lower_inclusive:boolean,upper_inclusive:boolean>"}
    assert not past.schema["id"].nullable and past.schema["u8"].nullable
    assert past.schema["u64"].metadata == {"terrascale.type": "uint64"}


def test_one_partition_per_offloaded_segment_plus_tails(spark, node, reader, history):
    c = node.client()
    segs = [s for s in c.segments("all")["segments"] if s["state"] == "offloaded"]
    c.close()
    df = read(spark, node, reader)
    n = df.rdd.getNumPartitions()
    assert len(segs) >= 8 and n >= len(segs)
    # every partition of the sealed_only read is one offloaded segment holding visible rows
    sealed = read(spark, node, reader, sealed_only="true")
    assert 0 < sealed.rdd.getNumPartitions() <= len(segs)
    assert sealed.rdd.getNumPartitions() < n


def test_sealed_only_reads_the_offloaded_part_of_the_snapshot(spark, node, reader, history):
    c = node.client()
    df_all = read(spark, node, reader, as_of=history["evolved"])
    df_sealed = read(spark, node, reader, as_of=history["evolved"], sealed_only="true")
    every, sealed = spark_rows(df_all, "id"), spark_rows(df_sealed, "id")
    want = api_rows(c.query("all", as_of=history["evolved"], limit=ALL), "id")
    assert every == want
    keys = {r["id"] for r in sealed}
    assert sealed == [r for r in want if r["id"] in keys]  # a subset, each row the visible version
    assert not keys & set(range(2500, 3500))  # their visible versions (v3) are in the tails
    assert keys == {r["id"] for r in want} - set(range(2500, 3500))  # everything else was offloaded
    c.close()


@pytest.mark.parametrize("where,bbox,api_where,api_bbox", [
    ("u32 >= 2000000000 and label != 'name-7-v1'", None,
     [["u32", ">=", 2000000000], ["label", "!=", "name-7-v1"]], None),
    ("label = name-2600-v3", None, [["label", "=", "name-2600-v3"]], None),
    (None, "loc:-2,-3,4.5,5", None, {"column": "loc", "xmin": -2, "ymin": -3, "xmax": 4.5, "ymax": 5}),
    ("ts < 2022-01-01T00:00:00Z", "loc:0,0,10,10", [["ts", "<", "2022-01-01T00:00:00Z"]],
     {"column": "loc", "xmin": 0, "ymin": 0, "xmax": 10, "ymax": 10}),
])
def test_where_and_bbox_options_equal_the_query_api(spark, node, reader, history, where, bbox, api_where, api_bbox):
    opts = {k: v for k, v in (("where", where), ("bbox", bbox)) if v is not None}
    got = spark_rows(read(spark, node, reader, as_of=history["evolved"], **opts), "id")
    c = node.client()
    want = api_rows(c.query("all", where=api_where, bbox=api_bbox, as_of=history["evolved"], limit=ALL), "id")
    c.close()
    assert got == want and 0 < len(got) < 3000


def test_a_dataframe_stays_its_snapshot_while_segments_move(spark, node, reader, history):
    """Spark plans a DataFrame once and every later action reuses that plan: rows that were
    in a tail at planning and are offloaded before the next action still come back once."""
    df = read(spark, node, reader)
    first = spark_rows(df, "id")
    c = node.client()
    c.upsert("all", [{"id": 99_999, "label": "after the snapshot"}])
    c.admin("seal")
    moved = c.admin("offload")["offloaded"]
    assert moved
    assert spark_rows(df, "id") == first
    assert df.count() == len(first)
    assert read(spark, node, reader).count() == len(first) + 1
    c.delete("all", [99_999])
    c.close()


def test_bad_options_fail_with_one_line_naming_the_option(spark, node, reader, history):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    for opts, text in [({"where": "label ~ 3"}, "option where"), ({"bbox": "loc:1,2,3"}, "option bbox"),
                       ({"as_of": "yesterday"}, "option as_of"), ({"nope": "1"}, "unknown option"),
                       ({"where": "nosuch = 1"}, "no column")]:
        with pytest.raises((PySparkException, Py4JJavaError)) as e:
            read(spark, node, reader, **opts).count()
        assert text in str(e.value), (opts, str(e.value)[-2000:])


def test_json_column_is_its_text(spark, node, reader, history):
    row = read(spark, node, reader, as_of=history["updated"]).where("id = 600").collect()[0]
    assert row["j"] is None or json.loads(row["j"]) == {"k": 600, "v": [2, None, "x"]}


def test_columns_option_reads_only_those_columns(spark, node, reader, history):
    c = node.client()
    as_of = history["evolved"]
    df = read(spark, node, reader, as_of=as_of, columns="u64, LABEL,loc", where="i32 > 0", bbox="loc:-5,-5,5,5")
    assert df.columns == ["u64", "label", "loc"]  # the option's order, the table's spelling
    got = sorted(df.toArrow().to_pylist(), key=lambda r: (r["label"] or "", str(r["u64"])))
    want = api_rows(c.query("all", where=[["i32", ">", 0]], bbox={"column": "loc", "xmin": -5, "ymin": -5,
                                                                   "xmax": 5, "ymax": 5}, as_of=as_of,
                            columns=["u64", "label", "loc"], limit=ALL), "label")
    assert got == sorted(want, key=lambda r: (r["label"] or "", str(r["u64"]))) and len(got) > 100
    with pytest.raises(Exception, match="has no column 'nope'"):
        read(spark, node, reader, columns="id,nope")
    c.close()


def test_an_empty_table_reads_as_no_rows_with_its_schema(spark, node, reader):
    c = node.client()
    if "empty" not in {t["name"] for t in c.list_tables()["tables"]}:  # the other reader's run made it
        c.create_table("empty", [{"name": "id", "type": "string"}, {"name": "u", "type": "uuid"}], "id")
    df = spark.read.format("terrascale").option("endpoint", node.base).option("table", "empty").option(
        "reader", reader).load()
    assert df.count() == 0 and df.columns == ["id", "u"] and df.toArrow().num_rows == 0
    c.close()


def test_a_schema_given_with_dot_schema_must_be_the_tables(spark, node, reader, history):
    right = read(spark, node, reader, as_of=history["updated"]).schema
    df = (spark.read.format("terrascale").schema(right).option("endpoint", node.base).option("table", "all")
          .option("as_of", str(history["updated"])).option("reader", reader).load())
    c = node.client()
    assert spark_rows(df, "id") == api_rows(c.query("all", as_of=history["updated"], limit=ALL), "id")
    c.close()
    wrong = (spark.read.format("terrascale").schema("id long, i8 byte").option("endpoint", node.base)
             .option("table", "all").option("reader", reader).load())
    with pytest.raises(Exception, match="leave it out"):
        wrong.count()
