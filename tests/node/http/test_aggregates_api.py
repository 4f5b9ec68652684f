"""POST /v1/tables/{t}/aggregate and /histogram against a real node, compared with a model
computed from the rows /query returns at the same T; bad input is a 4xx that changes nothing."""
import datetime as dt
import struct

import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from node.errors import ApiError
from tests.fixtures.aggregate_model import grouped, same
from tests.fixtures.ts_model import check

TOKEN = "t0ken-for-tests"
COLUMNS = [("id", "int64"), ("ts", "timestamp"), ("loc", "point"), ("name", "string"), ("v", "float64"),
           ("n", "int64")]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("agg"), token=TOKEN)
    n.start()
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log


@pytest.fixture(scope="module")
def c(node):
    with node.client() as cl:
        cl.create_table("m", COLUMNS, "id", indexes=["loc", "name", "v"], partitions=4)
        cl.upsert("m", rows(range(2000), seed=1))
        cl.admin("checkpoint")  # some rows in runs ...
        cl.upsert("m", rows(range(1500, 2600), seed=2))  # ... overwrites and new rows in memtables
        cl.delete("m", list(range(0, 2600, 7)))
        yield cl


def rows(ids, seed=0) -> pa.Table:
    ids = np.asarray(ids, np.int64)
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": ids, "ts": pa.array(ids % 50 * 1_000_000, pa.timestamp("us", tz="UTC")),
        "loc": pa.StructArray.from_arrays([pa.array(rng.integers(0, 100, len(ids)).astype(float)),
                                           pa.array(rng.integers(0, 100, len(ids)).astype(float))], names=["x", "y"]),
        "name": pa.array([f"s{k}" for k in rng.integers(0, 9, len(ids))], mask=rng.random(len(ids)) < 0.05),
        "v": pa.array(rng.integers(-100, 100, len(ids)) / 4.0),
        "n": pa.array(ids % 17, pa.int64()),
    })


def model(c, T, group_by, aggs, where=None, bbox=None) -> list:
    t = c.query("m", where=where, bbox=bbox, as_of=T, limit=10**9)
    return grouped(t.to_pylist(), group_by, aggs)


REQUESTS = [
    ([], [{"fn": "count"}], None, None),
    (["name"], [{"fn": "count"}, {"fn": "mean", "column": "v"}, {"fn": "max", "column": "v"}], None, None),
    (["name"], [{"fn": "count"}, {"fn": "sum", "column": "v"}], [["v", ">=", 0]],
     {"column": "loc", "xmin": 10, "ymin": 10, "xmax": 60, "ymax": 70}),
    (["n"], [{"fn": "count_distinct", "column": "name"}, {"fn": "min", "column": "ts"},
             {"fn": "count", "column": "name"}], [["name", "!=", "s3"]], None),
    (["name", "n"], [{"fn": "sum", "column": "n"}], [["n", "<", 5]], None),
]


@pytest.mark.parametrize("group_by,aggs,where,bbox", REQUESTS)
def test_aggregate_equals_a_model_of_the_queried_rows(c, group_by, aggs, where, bbox):
    got = c.aggregate("m", aggs, group_by=group_by or None, where=where, bbox=bbox)
    T = got["as_of"]
    rows_ = [{k: _parse(k, v) for k, v in r.items()} for r in got["rows"]]
    assert same(rows_, model(c, T, group_by, aggs, where, bbox)), (rows_, model(c, T, group_by, aggs, where, bbox))
    unindexed = {"n", "ts"} & (set(group_by) | {a.get("column") for a in aggs} | {w[0] for w in where or []})
    assert got["stats"]["path"] == ("decode" if unindexed else "index")
    assert set(got["stats"]["decoded_columns"]) == unindexed


def _parse(k, v):
    """JSON timestamps back to datetimes (the model has Arrow's values)."""
    if isinstance(v, str) and k.endswith("ts") and v.endswith("Z"):
        return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    return v


def test_arrow_answer_equals_json_and_keeps_types(c):
    aggs = [{"fn": "count"}, {"fn": "min", "column": "ts"}, {"fn": "mean", "column": "v"}]
    j = c.aggregate("m", aggs, group_by=["name"])
    t = c.aggregate("m", aggs, group_by=["name"], as_of=j["as_of"], arrow=True)
    assert t.schema.field("min_ts").type == pa.timestamp("us", tz="UTC")
    assert t.column_names == ["name", "count", "min_ts", "mean_v"]
    assert sorted(t.column("count").to_pylist()) == sorted(r["count"] for r in j["rows"])


def test_time_travel_sees_the_table_as_it_was(c):
    before = c.aggregate("m", [{"fn": "count"}])
    c.upsert("m", rows(range(5000, 5100), seed=3))
    after = c.aggregate("m", [{"fn": "count"}])
    assert after["rows"][0]["count"] == before["rows"][0]["count"] + 100
    again = c.aggregate("m", [{"fn": "count"}], as_of=before["as_of"])
    assert again["rows"] == before["rows"]
    c.delete("m", list(range(5000, 5100)))


@pytest.mark.parametrize("nx,ny,bbox", [(4, 3, {"xmin": 0, "ymin": 0, "xmax": 99, "ymax": 99}),
                                        (7, 5, {"xmin": 10.5, "ymin": 20, "xmax": 40, "ymax": 80}),
                                        (1, 1, {"xmin": 50, "ymin": 50, "xmax": 50, "ymax": 50})])
def test_histogram_equals_a_model_of_the_queried_points(c, nx, ny, bbox):
    got = c.histogram("m", "loc", bbox, [nx, ny], where=[["v", ">", -10]])
    pts = c.query("m", where=[["v", ">", -10]], bbox={"column": "loc", **bbox}, as_of=got["as_of"], limit=10**9)
    want = np.zeros((ny, nx), int)
    for p in pts.column("loc").to_pylist():
        want[_cell(p["y"], bbox["ymin"], bbox["ymax"], ny), _cell(p["x"], bbox["xmin"], bbox["xmax"], nx)] += 1
    assert got["counts"] == want.tolist() and got["stats"]["path"] == "index"


def _cell(v, lo, hi, n):
    i = 0
    while i + 1 < n and v >= lo + (hi - lo) * ((i + 1) / n):
        i += 1
    return i


BAD_AGGREGATES = [
    ({"aggregates": [{"fn": "count"}], "group_by": ["nope"]}, "invalid_query"),
    ({"aggregates": [{"fn": "sum", "column": "name"}]}, "invalid_query"),
    ({"aggregates": [{"fn": "avg", "column": "v"}]}, "invalid_query"),
    ({"aggregates": []}, "invalid_query"),
    ({"aggregates": [{"fn": "count"}], "where": [["nope", "=", 1]]}, "invalid_query"),
    ({"aggregates": [{"fn": "count"}], "bbox": {"column": "loc", "xmin": 0, "ymin": 0, "xmax": 1}},
     "invalid_query"),
    ({"aggregates": [{"fn": "count"}], "limit": 3}, "invalid_query"),
    ({"aggregates": [{"fn": "count"}], "as_of": -1}, "invalid_as_of"),
    *(({"aggregates": [{"fn": "count"}], "partitions": p}, "invalid_query")
      for p in ([], [4], [-1], [0, 0], ["0"], [True], [1.0], 0, "0", {"0": 1}, [[0]])),
    *(({"aggregates": [{"fn": "max", "column": "v"}], "nan": n}, "invalid_query")
      for n in ("smallest", "", "LARGEST", 1, True, ["largest"])),
    *(({"aggregates": [{"fn": "count"}], "group_by": [g]}, "invalid_query") for g in (
        {"bucket": "ts", "width": "0m"}, {"bucket": "ts", "width": "-5m"},
        {"bucket": "ts", "width": "99999999999999999d"},
        {"bucket": "ts", "width": 60}, {"bucket": "ts", "width": "5m", "origin": "yesterday"},
        {"bucket": "v", "width": 0}, {"bucket": "n", "width": -3}, {"bucket": "n", "width": 2**63},
        {"bucket": "name", "width": 5}, {"bucket": "loc", "width": 5}, {"bucket": "nope", "width": 5},
        {"bucket": "v", "width": 5, "size": 1})),
    *(({"aggregates": [a]}, "invalid_query") for a in (
        {"fn": "quantile", "column": "v", "q": 1.5}, {"fn": "quantile", "column": "v", "q": -0.01},
        {"fn": "quantile", "column": "v", "q": "0.5"}, {"fn": "quantile", "column": "v"},
        {"fn": "last", "column": "v"}, {"fn": "first", "column": "v", "by": "nope"}, {"fn": "last", "column": "v",
                                                                                   "by": "loc"},
        {"fn": "percentile", "column": "v"}, {"fn": "approx_count_distinct", "column": "nope"},
        {"fn": "count", "as": 7})),
]


@pytest.mark.parametrize("doc,code", BAD_AGGREGATES)
def test_bad_aggregates_are_400_and_change_nothing(c, doc, code):
    before = c.aggregate("m", [{"fn": "count"}, {"fn": "sum", "column": "v"}])
    with pytest.raises(ApiError) as e:
        c._call("POST", "/v1/tables/m/aggregate", doc)
    assert e.value.status == 400 and e.value.code == code
    assert c.aggregate("m", [{"fn": "count"}, {"fn": "sum", "column": "v"}], as_of=before["as_of"]) == before


@pytest.mark.parametrize("doc", [
    {"column": "loc", "bbox": {"xmin": 0, "ymin": 0, "xmax": "NaN", "ymax": 1}, "cells": [2, 2]},
    {"column": "loc", "bbox": {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, "cells": [4097, 4096]},
    {"column": "loc", "bbox": {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, "cells": [0, 2]},
    {"column": "v", "bbox": {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, "cells": [2, 2]},
    {"column": "nope", "bbox": {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, "cells": [2, 2]},
])
def test_bad_histograms_are_400(c, doc):
    with pytest.raises(ApiError) as e:
        c._call("POST", "/v1/tables/m/histogram", doc)
    assert e.value.status == 400 and e.value.code == "invalid_query"


def test_nan_in_a_raw_body_is_400(node, c):
    """Python's json writes NaN as a bare token: the node refuses it before any work."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", node.port)
    conn.request("POST", "/v1/tables/m/histogram", body=b'{"column": "loc", "bbox": {"xmin": 0, "ymin": 0, '
                 b'"xmax": NaN, "ymax": 1}, "cells": [2, 2]}',
                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    r = conn.getresponse()
    assert 400 <= r.status < 500


def test_unknown_table_is_404(c):
    with pytest.raises(ApiError) as e:
        c.aggregate("nope", [{"fn": "count"}])
    assert e.value.status == 404


def test_non_finite_values_answer_in_their_json_form(c):
    c.create_table("nf", [("id", "int64"), ("g", "string"), ("v", "float64")], "id", indexes=["g", "v"])
    c.upsert("nf", pa.table({"id": [1, 2, 3, 4], "g": ["a", "a", "b", "b"],
                             "v": [1.0, float("nan"), float("inf"), 2.0]}))
    got = c.aggregate("nf", [{"fn": "sum", "column": "v"}, {"fn": "count", "column": "v"}], group_by=["g"])
    assert {r["g"]: (r["sum_v"], r["count_v"]) for r in got["rows"]} == {"a": ("NaN", 2), "b": ("Infinity", 2)}


def test_a_sum_beyond_64_bits_is_400_and_its_mean_is_answered(c):
    """Arrow adds int64 modulo 2^64: the node adds such sums exactly and refuses one that does not
    fit, across partitions (each partition's sum fits, the total does not)."""
    c.create_table("big", [("id", "int64"), ("w", "int64")], "id", indexes=["w"], partitions=4)
    w = [2**62 + k for k in range(8)]
    c.upsert("big", pa.table({"id": list(range(8)), "w": w}))
    with pytest.raises(ApiError) as e:
        c.aggregate("big", [{"fn": "sum", "column": "w"}])
    assert e.value.status == 400 and e.value.code == "invalid_query" and "64-bit" in e.value.message
    got = c.aggregate("big", [{"fn": "mean", "column": "w"}, {"fn": "sum", "column": "id"}])
    assert got["rows"] == [{"mean_w": sum(w) / 8, "sum_id": 28}]
    c.upsert("big", pa.table({"id": [0, 8, 9], "w": [-(2**63)] * 3}))  # the total comes back within 64 bits
    assert c.aggregate("big", [{"fn": "sum", "column": "w"}])["rows"] == [{"sum_w": sum(w[1:]) - 3 * 2**63}]


def test_a_grid_of_4096_cells_on_an_axis_is_answered(c):
    bbox = {"xmin": 0, "ymin": 0, "xmax": 99, "ymax": 99}
    got = c.histogram("m", "loc", bbox, [4096, 3])
    assert len(got["counts"]) == 3 and {len(r) for r in got["counts"]} == {4096}
    small = c.histogram("m", "loc", bbox, [1, 1], as_of=got["as_of"])
    assert sum(map(sum, got["counts"])) == small["counts"][0][0] > 0


def _combined(answers: list[dict]) -> dict:
    """Per-partition answers of count/sum/min/max by name, combined as Spark merges partials."""
    out: dict = {}
    for a in answers:
        for r in a["rows"]:
            got = out.setdefault(r["name"], {"count": 0, "sum_n": None, "min_v": None, "max_ts": None})
            got["count"] += r["count"]
            if r["sum_n"] is not None:
                got["sum_n"] = r["sum_n"] + (got["sum_n"] or 0)
            for k, pick in (("min_v", min), ("max_ts", max)):
                if r[k] is not None:
                    got[k] = r[k] if got[k] is None else pick(got[k], r[k])
    return out


PARTIAL_AGGS = [{"fn": "count"}, {"fn": "sum", "column": "n"}, {"fn": "min", "column": "v"},
                {"fn": "max", "column": "ts"}]


def test_partitions_answer_their_rows_only_and_add_up_to_the_whole(c):
    whole = c.aggregate("m", PARTIAL_AGGS, group_by=["name"], where=[["v", ">", -20]])
    T = whole["as_of"]
    each = [c.aggregate("m", PARTIAL_AGGS, group_by=["name"], where=[["v", ">", -20]], as_of=T, partitions=[p])
            for p in range(4)]
    assert all(a["as_of"] == T and a["stats"]["partitions"] == 1 for a in each)
    assert all(sum(r["count"] for r in a["rows"]) > 0 for a in each)  # every partition holds rows
    assert sum(r["count"] for a in each for r in a["rows"]) == sum(r["count"] for r in whole["rows"])
    assert _combined(each) == _combined([whole])
    two = c._call("POST", "/v1/tables/m/aggregate", {"aggregates": PARTIAL_AGGS, "group_by": ["name"],
                                                      "where": [["v", ">", -20]], "as_of": T, "partitions": [3, 1]})
    assert _combined([two]) == _combined([each[1], each[3]])
    every = c._call("POST", "/v1/tables/m/aggregate", {"aggregates": PARTIAL_AGGS, "group_by": ["name"],
                                                        "where": [["v", ">", -20]], "as_of": T,
                                                        "partitions": [0, 1, 2, 3]})
    assert same(every["rows"], whole["rows"])


def test_a_partition_without_rows_answers_the_empty_global_row(c):
    c.create_table("one", [("id", "int64"), ("v", "float64")], "id", partitions=4)
    c.upsert("one", pa.table({"id": [7], "v": [1.5]}))
    got = [c._call("POST", "/v1/tables/one/aggregate", {"aggregates": [{"fn": "count"}, {"fn": "max", "column": "v"}],
                                                         "partitions": [p]})["rows"] for p in range(4)]
    assert sorted((r[0]["count"], r[0]["max_v"]) for r in got) == [(0, None)] * 3 + [(1, 1.5)]


NAN = float("nan")
SNAN = struct.unpack("<d", struct.pack("<Q", 0x7FF4000000000000))[0]  # Arrow's min/max alone follow row order


def _nan_max(vals):
    """max with NaN above every number (Spark's, PostgreSQL's order)."""
    vals = [v for v in vals if v is not None]
    return None if not vals else NAN if any(v != v for v in vals) else max(vals)


@pytest.mark.parametrize("indexed", [True, False])
def test_nan_largest_makes_nan_the_max_of_a_group_holding_one(c, indexed):
    name = "nans_i" if indexed else "nans_d"
    c.create_table(name, [("id", "int64"), ("g", "string"), ("v", "float64"), ("f", "float32")], "id",
                   indexes=["g", "v", "f"] if indexed else [], partitions=4)
    vals = {"a": [1.0, NAN, 3.0, None], "b": [2.0, -0.0, 0.0, None], "c": [NAN, NAN, None, None],
            "d": [None, None, None, None], "e": [-5.0, float("inf"), NAN, 1.0],
            "f": [1.0, -1.0, SNAN, None], "h": [SNAN, SNAN, None, None]}  # a signalling NaN, not first
    ids, gs, vs = [], [], []
    for g, v in vals.items():
        for k, x in enumerate(v * 5):  # spread over the partitions
            ids.append(len(ids))
            gs.append(g)
            vs.append(x if k % 4 != 1 or x is None or x != x else x + k)
    c.upsert(name, pa.table({"id": ids, "g": gs, "v": vs, "f": pa.array(vs, pa.float32())}))
    aggs = [{"fn": "max", "column": "v"}, {"fn": "min", "column": "v"}, {"fn": "max", "column": "f"},
            {"fn": "min", "column": "f"}]
    by_g = {g: [v for gg, v in zip(gs, vs) if gg == g] for g in vals}

    def check(rows, nan):
        for r in rows:
            v = by_g[r["g"]]
            want_max = _nan_max(v) if nan == "largest" else _skip(max, v)
            for col in ("v", "f"):
                assert _same(r[f"max_{col}"], want_max), (nan, r)
                assert _same(r[f"min_{col}"], _skip(min, v)), (nan, r)  # min is one in both orders
    for nan in (None, "ignore", "largest"):
        doc = {"aggregates": aggs, "group_by": ["g"], **({"nan": nan} if nan else {})}
        check(c._call("POST", f"/v1/tables/{name}/aggregate", doc, arrow=True).to_pylist(), nan)
    T = c.aggregate(name, [{"fn": "count"}])["as_of"]
    merged: dict = {}  # each partition's maxima, merged with NaN largest, give the whole table's
    for p in range(4):
        doc = {"aggregates": aggs, "group_by": ["g"], "nan": "largest", "partitions": [p], "as_of": T}
        for r in c._call("POST", f"/v1/tables/{name}/aggregate", doc, arrow=True).to_pylist():
            merged.setdefault(r["g"], []).append(r["max_v"])
    assert set(merged) == set(vals)
    assert all(_same(_nan_max(m), _nan_max(by_g[g])) for g, m in merged.items()), merged


@pytest.mark.parametrize("indexed", [True, False])
def test_a_signalling_nan_is_a_nan_like_any_other(c, indexed):
    """Arrow's min and max alone answer NaN, or skip numbers, by the rows' order once a signalling NaN is among
    them; the node makes every NaN the quiet one first."""
    name = "snan_i" if indexed else "snan_d"
    c.create_table(name, [("id", "int64"), ("v", "float64")], "id", indexes=["v"] if indexed else [], partitions=1)
    c.upsert(name, pa.table({"id": [1, 2, 3, 4], "v": [1.0, -1.0, SNAN, 0.5]}))
    for nan, want in ((None, (-1.0, 1.0)), ("largest", (-1.0, NAN))):
        got = c.aggregate(name, [{"fn": "min", "column": "v"}, {"fn": "max", "column": "v"}], nan=nan)["rows"][0]
        got = tuple(NAN if x == "NaN" else x for x in (got["min_v"], got["max_v"]))
        assert _same(got[0], want[0]) and _same(got[1], want[1]), (nan, got)


def _skip(pick, vals):
    """Arrow's min/max: NaN left out unless every value is NaN."""
    vals = [v for v in vals if v is not None]
    nums = [v for v in vals if v == v]
    return pick(nums) if nums else (NAN if vals else None)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (a != a and b != b) or a == b
    return a == b


def test_buckets_sketches_and_picks_equal_a_model_of_the_queried_rows(c):
    group_by = ["name", {"bucket": "ts", "width": "7s", "origin": "1970-01-01T00:00:02Z", "as": "t7"},
                {"bucket": "n", "width": 5}]
    aggs = [{"fn": "count"}, {"fn": "quantile", "column": "v", "q": 0.95}, {"fn": "median", "column": "v"},
            {"fn": "approx_count_distinct", "column": "v", "as": "dv"}, {"fn": "last", "column": "v", "by": "ts"},
            {"fn": "first", "column": "name", "by": "v"}]
    got = c.aggregate("m", aggs, group_by=group_by, where=[["v", ">", -20]])
    t = c.query("m", where=[["v", ">", -20]], as_of=got["as_of"], limit=10**9)
    rows = pa.table([t.column(n).cast(pa.int64()) if n == "ts" else t.column(n) for n in t.column_names],
                    names=t.column_names).to_pylist()
    answer = c.aggregate("m", aggs, group_by=group_by, where=[["v", ">", -20]], as_of=got["as_of"], arrow=True)
    assert answer.schema.field("t7").type == pa.timestamp("us", tz="UTC") and answer.schema.field("bucket_n").type \
        == pa.int64() and answer.schema.field("quantile_0.95_v").type == pa.float64()
    answer = pa.table([answer.column("t7").cast(pa.int64()) if n == "t7" else answer.column(n)
                       for n in answer.column_names], names=answer.column_names)
    group_by[1]["origin"] = 2_000_000  # the model's origin in µs
    check(answer.to_pylist(), rows, group_by, aggs, {"ts": "timestamp", "n": "int64"})
    assert len(got["rows"]) == answer.num_rows
