"""`terrascale aggregate` and `terrascale histogram` against a real node: every output format
gives the HTTP answer, and malformed arguments are usage errors (exit 2) sent nowhere."""
import csv
import io
import json

import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from tests.node.test_cli import ts

TOKEN = "cli-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("cli-agg"), token=TOKEN)
    n.start()
    with n.client() as c:
        c.create_table("m", [("id", "int64"), ("g", "string"), ("v", "float64"), ("p", "point")], "id",
                       indexes=["g", "p"], partitions=2)
        c.upsert("m", [{"id": i, "g": f"g{i % 3}", "v": i / 2, "p": {"x": i % 10, "y": i // 10}}
                       for i in range(100)])
    yield n
    rc, _ = n.stop()
    assert rc == 0


def test_aggregate_in_every_format(node):
    args = ["aggregate", "m", "--group-by", "g", "--agg", "count", "--agg", "sum:v", "--where", "v >= 10"]
    doc = json.loads(ts(node, *args, "-o", "json", check=0).stdout)
    want = {f"g{k}": (sum(1 for i in range(20, 100) if i % 3 == k), sum(i / 2 for i in range(20, 100) if i % 3 == k))
            for k in range(3)}
    assert {r["g"]: (r["count"], r["sum_v"]) for r in doc["rows"]} == want
    assert doc["stats"]["path"] == "decode" and doc["stats"]["decoded_columns"] == ["v"]
    rows = list(csv.DictReader(io.StringIO(ts(node, *args, "-o", "csv", check=0).stdout)))
    assert {r["g"]: int(r["count"]) for r in rows} == {g: n for g, (n, _) in want.items()}
    t = pa.ipc.open_stream(ts(node, *args, "-o", "arrow", binary=True, check=0).stdout).read_all()
    assert t.column_names == ["g", "count", "sum_v"] and t.num_rows == 3
    table = ts(node, *args, check=0).stdout
    assert table.splitlines()[0].split() == ["g", "count", "sum_v"]


def test_aggregate_by_buckets_with_a_quantile_and_a_last_value(node):
    args = ["aggregate", "m", "--bucket", "v:10", "--agg", "count", "--agg", "quantile:v:0.5", "--agg", "last:g:v"]
    doc = json.loads(ts(node, *args, "-o", "json", check=0).stdout)
    assert {r["bucket_v"]: (r["count"], r["last_g"]) for r in doc["rows"]} == {
        float(k): (20, f"g{(2 * k + 19) % 3}") for k in range(0, 50, 10)}
    assert all(r["bucket_v"] <= r["quantile_0.5_v"] < r["bucket_v"] + 10 for r in doc["rows"])


def test_histogram_in_every_format(node):
    args = ["histogram", "m", "p", "--bbox", "0,0,9,9", "--cells", "2,5"]
    doc = json.loads(ts(node, *args, "-o", "json", check=0).stdout)
    assert doc["counts"] == [[10, 10]] * 5
    rows = list(csv.DictReader(io.StringIO(ts(node, *args, "-o", "csv", check=0).stdout)))
    assert [int(r["x1"]) for r in rows] == [10] * 5


@pytest.mark.parametrize("args,code,text", [
    (["aggregate", "m", "--agg", "sum"], 2, "FN:COLUMN"),
    (["aggregate", "m", "--agg", "percentile:v"], 2, "FN:COLUMN"),
    (["histogram", "m", "p", "--bbox", "0,0,9", "--cells", "2,2"], 2, "4 comma-separated"),
    (["histogram", "m", "p", "--bbox", "0,0,9,9", "--cells", "2"], 2, "2 comma-separated"),
    (["aggregate", "m", "--agg", "sum:g"], 1, "invalid_query"),
    (["histogram", "m", "p", "--bbox", "0,0,9,9", "--cells", "5000,2"], 1, "invalid_query"),
])
def test_bad_arguments(node, args, code, text):
    r = ts(node, *args, check=code)
    assert text in r.stderr
