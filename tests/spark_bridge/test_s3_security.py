"""Reads with offloaded segments on S3 (moto server, real HTTP) — the executors read the
objects from S3 themselves — and from a node with a bearer token and at-rest encryption
(the executors need the node's key file)."""
from __future__ import annotations

import base64
import os

import pytest

from bench.node_proc import NodeProc
from tests.fixtures.moto import make_bucket, s3_uri
from tests.spark_bridge.conftest import api_rows, spark_rows
from tests.spark_bridge.test_read import COLUMNS, make_rows

TOKEN = "spark-secret-token"


def moto_url(uri: str) -> str:
    return uri.split("endpoint_url=")[1].split("&")[0]


def fill(c, table: str) -> int:
    c.create_table(table, [{"name": n, "type": t} for n, t in COLUMNS], "id", indexes=["loc"])
    c.upsert(table, make_rows(range(1200), 1, 11))
    c.admin("seal")
    c.admin("offload")
    c.upsert(table, make_rows(range(900, 1500), 2, 12))
    ts = c.delete(table, list(range(0, 1500, 9)))["commit_ts"]
    c.admin("seal")
    c.admin("offload")
    c.upsert(table, make_rows(range(1400, 1600), 3, 13))  # a tail
    return ts


@pytest.fixture(scope="module")
def s3_node(tmp_path_factory, moto_server):
    uri = s3_uri(moto_server, make_bucket(moto_server))
    n = NodeProc(tmp_path_factory.mktemp("spark-s3"), extra="[tables]\npartitions = 2\n")
    text = n.config.read_text()
    n.config.write_text(text.replace(f'objects = "trfs://{n.data}/objects"', f'objects = "{uri}"'))
    n.start()
    yield n, uri
    n.stop()


def test_offloaded_segments_on_s3_read_by_the_executors(spark, s3_node):
    node, uri = s3_node
    c = node.client()
    past = fill(c, "s3t")
    # the JVM reader: objects through the URLs the node presigns in the plan (no credentials given)
    for as_of in (None, past):
        r = spark.read.format("terrascale").option("endpoint", node.base).option("table", "s3t").option("reader", "jvm")
        df = (r if as_of is None else r.option("as_of", str(as_of))).load()
        assert spark_rows(df, "id") == api_rows(c.query("s3t", as_of=as_of, limit=10_000), "id")
    presigned = c._call("POST", "/v1/tables/s3t/plan", {"lease_s": 5, "presign": True})
    assert all(s["url"].startswith(moto_url(uri)) and "Signature" in s["url"] for s in presigned["sealed"])
    plan = c._call("POST", "/v1/tables/s3t/plan", {"lease_s": 5})
    assert plan["objects"].startswith("trs3://") and "secret_access_key" not in plan["objects"]
    assert len(plan["sealed"]) >= 3
    for as_of in (None, past):
        # the plan's URI carries no credentials; executors get them with the objects option
        r = (spark.read.format("terrascale").option("endpoint", node.base).option("table", "s3t")
             .option("objects", uri))
        df = (r if as_of is None else r.option("as_of", str(as_of))).load()
        assert spark_rows(df, "id") == api_rows(c.query("s3t", as_of=as_of, limit=10_000), "id")
    c.close()


@pytest.fixture(scope="module")
def secure_node(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark-secure")
    key = root / "kek"
    key.write_bytes(os.urandom(32))
    n = NodeProc(root, token=TOKEN, extra="[tables]\npartitions = 2\n")
    sec = f'[security]\ntoken = "{TOKEN}"\n'
    n.config.write_text(n.config.read_text().replace(sec, sec + f'encryption_key_file = "{key}"\n'))
    n.start()
    yield n, str(key)
    n.stop()


def test_token_and_encrypted_segments(spark, secure_node):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    node, key = secure_node
    c = node.client()
    fill(c, "sec")
    want = api_rows(c.query("sec", limit=10_000), "id")

    def reader(**opts):
        r = spark.read.format("terrascale").option("endpoint", node.base).option("table", "sec")
        for k, v in opts.items():
            r = r.option(k, v)
        return r

    for which in ("jvm", "python"):
        assert spark_rows(reader(token=TOKEN, key_file=key, reader=which).load(), "id") == want
        with pytest.raises((PySparkException, Py4JJavaError)) as e:
            reader(reader=which).load()
        assert "401 unauthorized" in str(e.value)
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        reader(token=TOKEN, reader="python").load().count()
    assert "give option key_file" in str(e.value)
    # the JVM reader without key_file: the plan carries each object's data key, unwrapped by the node
    assert spark_rows(reader(token=TOKEN, reader="jvm").load(), "id") == want
    plan = c._call("POST", "/v1/tables/sec/plan", {"lease_s": 5, "keys": True})
    assert plan["sealed"] and all(len(base64.b64decode(s["data_key"])) == 32 for s in plan["sealed"])
    assert "data_key" not in c._call("POST", "/v1/tables/sec/plan", {"lease_s": 5})["sealed"][0]
    other = os.path.join(os.path.dirname(key), "other-kek")
    with open(other, "w") as f:
        f.write(os.urandom(32).hex())  # the hex form of a key file
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        reader(token=TOKEN, key_file=other, reader="jvm", sealed_only="true").load().collect()  # count(): no read
    assert "is encrypted with key id" in str(e.value)
    df = spark.createDataFrame([(7, "written with a token")], "id long, s string")
    df.write.format("terrascale").option("endpoint", node.base).option("table", "sec").option("token", TOKEN) \
        .mode("append").save()
    assert c.get("sec", 7)["s"] == "written with a token"
    c.close()
