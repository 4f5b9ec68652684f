"""A corpus of malformed requests against a real node: each gets the right 4xx with the
documented error shape, and none changes anything (both tables, their schemas and the
table list are compared before and after every case)."""
import json
import time

import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from rowstore.hlc import ts_from_ms
from tests.node.http.test_api import ALL_TYPES, ROW

ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"


def arrow(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def rows(*rs) -> bytes:
    return json.dumps({"rows": list(rs)}).encode()


def row(**over) -> dict:
    return {"id": 1000, **over}


def q(**doc) -> bytes:
    return json.dumps(doc).encode()


GOOD_ARROW = arrow(pa.table({"id": pa.array([1000, 1001], pa.int64()), "s": ["a", "b"]}))
FUTURE = ts_from_ms(int(time.time() * 1000) + 3_600_000)
R, Q = "/v1/tables/m/rows", "/v1/tables/m/query"

# (case id, method, path, body, content type, status, code)
CORPUS = [
    ("not-json", "POST", R, b'{"rows": [', JSON, 400, "invalid_json"),
    ("empty-body", "POST", R, b"", JSON, 400, "invalid_json"),
    ("binary-garbage-json", "POST", R, b"\xff\xfe\x00", JSON, 400, "invalid_json"),
    ("top-level-list", "POST", R, json.dumps([{"id": 1000}]).encode(), JSON, 400, "invalid_rows"),
    ("rows-not-list", "POST", R, q(rows={"id": 1000}), JSON, 400, "invalid_rows"),
    ("extra-top-level-key", "POST", R, q(rows=[row()], upsert=True), JSON, 400, "invalid_rows"),
    ("row-not-object", "POST", R, rows(1), JSON, 400, "invalid_rows"),
    ("unknown-column", "POST", R, rows(row(nope=1)), JSON, 400, "invalid_rows"),
    ("missing-key-column", "POST", R, rows({"s": "x"}), JSON, 400, "invalid_rows"),
    ("null-key", "POST", R, rows({"id": None, "s": "x"}), JSON, 400, "invalid_rows"),
    ("key-missing-in-one-row", "POST", R, rows(row(), {"s": "x"}), JSON, 400, "invalid_rows"),
    ("string-for-int64-key", "POST", R, rows({"id": "1000"}), JSON, 400, "bad_request"),
    ("int64-key-beyond-max", "POST", R, rows({"id": 2**63}), JSON, 400, "bad_request"),
    ("int64-key-wraps-to-row-7", "POST", R, rows({"id": 2**64 + 7, "s": "overwritten?"}), JSON, 400, "bad_request"),
    ("float-key", "POST", R, rows({"id": 7.0}), JSON, 400, "bad_request"),
    ("bool-key", "POST", R, rows({"id": True}), JSON, 400, "bad_request"),
    ("arrow-uint64-key-beyond-int64", "POST", R, arrow(pa.table({"id": pa.array([2**64 - 1], pa.uint64())})), ARROW,
     400, "bad_request"),
    ("float-for-int32", "POST", R, rows(row(i32=1.5)), JSON, 400, "invalid_rows"),
    ("int8-overflow", "POST", R, rows(row(i8=300)), JSON, 400, "invalid_rows"),
    ("negative-uint", "POST", R, rows(row(u32=-1)), JSON, 400, "invalid_rows"),
    ("int64-overflow", "POST", R, b'{"rows": [{"id": 1000, "u64": 1, "i32": 18446744073709551616000}]}', JSON,
     400, "invalid_rows"),
    ("bool-for-int", "POST", R, rows(row(i16=True)), JSON, 400, "invalid_rows"),
    ("number-for-bool", "POST", R, rows(row(b=1)), JSON, 400, "invalid_rows"),
    ("string-for-float", "POST", R, rows(row(f64="abc")), JSON, 400, "invalid_rows"),
    ("number-for-string", "POST", R, rows(row(s=5)), JSON, 400, "invalid_rows"),
    ("bad-base64", "POST", R, rows(row(bin="***")), JSON, 400, "invalid_rows"),
    ("bad-timestamp-string", "POST", R, rows(row(ts="yesterday")), JSON, 400, "invalid_rows"),
    ("float-timestamp", "POST", R, rows(row(ts=1.5)), JSON, 400, "invalid_rows"),
    ("bad-date", "POST", R, rows(row(d="2024-13-01")), JSON, 400, "invalid_rows"),
    ("date-as-number", "POST", R, rows(row(d=19000)), JSON, 400, "invalid_rows"),
    ("bad-uuid", "POST", R, rows(row(u="not-a-uuid")), JSON, 400, "invalid_rows"),
    ("point-missing-y", "POST", R, rows(row(p={"x": 1})), JSON, 400, "invalid_rows"),
    ("point-string-x", "POST", R, rows(row(p={"x": "1", "y": 2})), JSON, 400, "invalid_rows"),
    ("point-as-list", "POST", R, rows(row(p=[1, 2])), JSON, 400, "invalid_rows"),
    ("box-extra-field", "POST", R, rows(row(bx={"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1, "z": 0})), JSON, 400,
     "invalid_rows"),
    ("range-unknown-field", "POST", R, rows(row(ri={"lower": 1, "hi": 2})), JSON, 400, "invalid_rows"),
    ("range-flag-not-bool", "POST", R, rows(row(ri={"lower": 1, "upper": 2, "lower_inclusive": 1})), JSON, 400,
     "invalid_rows"),
    ("range-timestamp-bad-bound", "POST", R, rows(row(rt={"lower": "soon"})), JSON, 400, "invalid_rows"),
    ("good-row-then-bad-row", "POST", R, rows(row(), row(id=1001, i8="x")), JSON, 400, "invalid_rows"),
    ("wrong-content-type", "POST", R, rows(row()), "text/plain", 415, "unsupported_media_type"),
    ("arrow-garbage", "POST", R, b"this is not arrow at all", ARROW, 400, "invalid_rows"),
    ("arrow-truncated", "POST", R, GOOD_ARROW[: len(GOOD_ARROW) // 2], ARROW, 400, "invalid_rows"),
    ("arrow-empty", "POST", R, b"", ARROW, 400, "invalid_rows"),
    ("arrow-unknown-column", "POST", R, arrow(pa.table({"id": [1000], "zzz": [1]})), ARROW, 400, "invalid_rows"),
    ("arrow-wrong-type", "POST", R, arrow(pa.table({"id": ["1000"]})), ARROW, 400, "bad_request"),
    ("arrow-wrong-type-non-key", "POST", R, arrow(pa.table({"id": [1000], "i32": ["1"]})), ARROW, 400,
     "invalid_rows"),
    ("arrow-null-key", "POST", R, arrow(pa.table({"id": pa.array([1000, None], pa.int64())})), ARROW, 400,
     "invalid_rows"),
    ("arrow-missing-key", "POST", R, arrow(pa.table({"s": ["a"]})), ARROW, 400, "invalid_rows"),
    ("arrow-lossy-cast", "POST", R, arrow(pa.table({"id": [1000], "i8": pa.array([1000], pa.int64())})), ARROW,
     400, "invalid_rows"),
    ("oversized-json", "POST", R, rows(*[row(id=i, s="x" * 100) for i in range(12_000)]), JSON, 413, "too_large"),
    ("oversized-arrow", "POST", R, arrow(pa.table({"id": pa.array(range(200_000), pa.int64())})), ARROW, 413,
     "too_large"),
    ("rows-to-unknown-table", "POST", "/v1/tables/nope/rows", rows(row()), JSON, 404, "table_not_found"),
    ("get-from-unknown-table", "GET", "/v1/tables/nope/rows/1", None, None, 404, "table_not_found"),
    ("query-unknown-table", "POST", "/v1/tables/nope/query", q(), JSON, 404, "table_not_found"),
    ("delete-unknown-table", "POST", "/v1/tables/nope/delete", q(keys=[1]), JSON, 404, "table_not_found"),
    ("query-not-json", "POST", Q, b"where id=1", JSON, 400, "invalid_json"),
    ("query-not-object", "POST", Q, b"[1]", JSON, 400, "invalid_query"),
    ("where-not-list", "POST", Q, q(where="id = 1"), JSON, 400, "invalid_query"),
    ("where-term-short", "POST", Q, q(where=[["id", "="]]), JSON, 400, "invalid_query"),
    ("where-unknown-column", "POST", Q, q(where=[["zz", "=", 1]]), JSON, 400, "invalid_query"),
    ("where-bad-op", "POST", Q, q(where=[["id", "~", 1]]), JSON, 400, "invalid_query"),
    ("where-value-type", "POST", Q, q(where=[["i32", "=", "abc"]]), JSON, 400, "invalid_query"),
    ("where-null-value", "POST", Q, q(where=[["i32", "=", None]]), JSON, 400, "invalid_query"),
    ("where-on-point", "POST", Q, q(where=[["p", "=", 1]]), JSON, 400, "invalid_query"),
    ("where-on-json", "POST", Q, q(where=[["j", "=", "x"]]), JSON, 400, "invalid_query"),
    ("where-bad-timestamp", "POST", Q, q(where=[["ts", ">", "noon"]]), JSON, 400, "invalid_query"),
    ("bbox-missing-edge", "POST", Q, q(bbox={"column": "p", "xmin": 0, "ymin": 0, "xmax": 1}), JSON, 400,
     "invalid_query"),
    ("bbox-inverted", "POST", Q, q(bbox={"column": "p", "xmin": 2, "ymin": 0, "xmax": 1, "ymax": 1}), JSON, 400,
     "invalid_query"),
    ("bbox-non-spatial", "POST", Q, q(bbox={"column": "s", "xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}), JSON, 400,
     "invalid_query"),
    ("bbox-string-edge", "POST", Q, q(bbox={"column": "p", "xmin": "0", "ymin": 0, "xmax": 1, "ymax": 1}), JSON,
     400, "invalid_query"),
    ("columns-unknown", "POST", Q, q(columns=["id", "zz"]), JSON, 400, "invalid_query"),
    ("columns-not-list", "POST", Q, q(columns="id"), JSON, 400, "invalid_query"),
    ("limit-negative", "POST", Q, q(limit=-1), JSON, 400, "invalid_query"),
    ("limit-string", "POST", Q, q(limit="10"), JSON, 400, "invalid_query"),
    ("query-unknown-field", "POST", Q, q(filter=[]), JSON, 400, "invalid_query"),
    ("as-of-string", "POST", Q, q(as_of="yesterday"), JSON, 400, "invalid_as_of"),
    ("as-of-negative", "POST", Q, q(as_of=-5), JSON, 400, "invalid_as_of"),
    ("as-of-future", "POST", Q, q(as_of=FUTURE), JSON, 409, "future_timestamp"),
    ("as-of-purged", "POST", Q, q(as_of=1), JSON, 410, "history_purged"),
    ("get-as-of-garbage", "GET", "/v1/tables/m/rows/1?as_of=abc", None, None, 400, "invalid_as_of"),
    ("get-as-of-purged", "GET", "/v1/tables/m/rows/1?as_of=1", None, None, 410, "history_purged"),
    ("get-as-of-future", "GET", f"/v1/tables/m/rows/1?as_of={FUTURE}", None, None, 409, "future_timestamp"),
    ("get-non-integer-key", "GET", "/v1/tables/m/rows/abc", None, None, 400, "bad_request"),
    ("get-key-wraps-to-row-7", "GET", f"/v1/tables/m/rows/{2**64 + 7}", None, None, 400, "bad_request"),
    ("get-key-below-min", "GET", f"/v1/tables/m/rows/{-2**63 - 1}", None, None, 400, "bad_request"),
    ("get-key-unicode-digit", "GET", "/v1/tables/m/rows/%D9%A7", None, None, 400, "bad_request"),
    ("get-key-with-fraction", "GET", "/v1/tables/m/rows/7.5", None, None, 400, "bad_request"),
    ("get-key-5000-digits", "GET", "/v1/tables/m/rows/" + "7" * 5000, None, None, 400, "bad_request"),
    ("get-as-of-5000-digits", "GET", "/v1/tables/m/rows/7?as_of=" + "1" * 5000, None, None, 400, "invalid_as_of"),
    ("get-as-of-superscript-digit", "GET", "/v1/tables/m/rows/7?as_of=%C2%B2", None, None, 400, "invalid_as_of"),
    ("where-key-wraps-to-row-7", "POST", Q, q(where=[["id", "=", 2**64 + 7]]), JSON, 400, "bad_request"),
    ("where-key-beyond-max", "POST", Q, q(where=[["id", "<", 2**63]]), JSON, 400, "bad_request"),
    ("get-absent-row", "GET", "/v1/tables/m/rows/424242", None, None, 404, "row_not_found"),
    ("describe-as-of-garbage", "GET", "/v1/tables/m?as_of=-1", None, None, 400, "invalid_as_of"),
    ("delete-keys-not-list", "POST", "/v1/tables/m/delete", q(keys=1), JSON, 400, "invalid_rows"),
    ("delete-null-key", "POST", "/v1/tables/m/delete", q(keys=[1, None]), JSON, 400, "invalid_rows"),
    ("delete-object-key", "POST", "/v1/tables/m/delete", q(keys=[{"id": 1}]), JSON, 400, "bad_request"),
    ("delete-key-wraps-to-row-7", "POST", "/v1/tables/m/delete", q(keys=[2**64 + 7]), JSON, 400, "bad_request"),
    ("delete-float-key", "POST", "/v1/tables/m/delete", q(keys=[7.5]), JSON, 400, "bad_request"),
    ("delete-missing-keys", "POST", "/v1/tables/m/delete", q(ids=[1]), JSON, 400, "bad_request"),
    ("create-existing", "POST", "/v1/tables", q(name="m", columns=[{"name": "id", "type": "int64"}],
                                                primary_key="id"), JSON, 409, "table_exists"),
    ("create-bad-type", "POST", "/v1/tables", q(name="t2", columns=[{"name": "id", "type": "int128"}],
                                                primary_key="id"), JSON, 400, "invalid_schema"),
    ("create-pk-not-a-column", "POST", "/v1/tables", q(name="t2", columns=[{"name": "id", "type": "int64"}],
                                                       primary_key="key"), JSON, 400, "invalid_schema"),
    ("create-float-pk", "POST", "/v1/tables", q(name="t2", columns=[{"name": "id", "type": "float64"}],
                                                primary_key="id"), JSON, 400, "invalid_schema"),
    ("create-nullable-pk", "POST", "/v1/tables", q(name="t2", columns=[{"name": "id", "type": "int64",
                                                                        "nullable": True}], primary_key="id"),
     JSON, 400, "invalid_schema"),
    ("create-bad-name", "POST", "/v1/tables", q(name="1abc", columns=[{"name": "id", "type": "int64"}],
                                                primary_key="id"), JSON, 400, "invalid_schema"),
    ("create-index-unknown", "POST", "/v1/tables", q(name="t2", columns=[{"name": "id", "type": "int64"}],
                                                     primary_key="id", indexes=["zz"]), JSON, 400, "invalid_schema"),
    ("create-duplicate-columns", "POST", "/v1/tables", q(name="t2", columns=[
        {"name": "id", "type": "int64"}, {"name": "ID", "type": "string"}], primary_key="id"), JSON, 400,
     "invalid_schema"),
    ("create-missing-columns", "POST", "/v1/tables", q(name="t2", primary_key="id"), JSON, 400, "bad_request"),
    ("add-existing-column", "POST", "/v1/tables/m/columns", q(name="s", type="string"), JSON, 400, "invalid_schema"),
    ("add-column-bad-type", "POST", "/v1/tables/m/columns", q(name="zz", type="decimal"), JSON, 400,
     "invalid_schema"),
    ("add-not-null-column", "POST", "/v1/tables/m/columns", q(name="zz", type="int64", nullable=False), JSON, 400,
     "invalid_schema"),
    ("drop-primary-key", "DELETE", "/v1/tables/m/columns/id", None, None, 400, "invalid_schema"),
    ("drop-unknown-column", "DELETE", "/v1/tables/m/columns/zz", None, None, 400, "invalid_schema"),
    ("rename-to-existing", "PATCH", "/v1/tables/m/columns/s", q(name="f64"), JSON, 400, "invalid_schema"),
    ("rename-bad-name", "PATCH", "/v1/tables/m/columns/s", q(name="has space"), JSON, 400, "invalid_schema"),
    ("drop-unknown-table", "DELETE", "/v1/tables/nope", None, None, 404, "table_not_found"),
    # found by the decoder property test (tests/node/http/test_hostile_bodies.py) and the depth/terms limits:
    # each answered 500 before
    ("deeply-nested-query", "POST", Q, b"[" * 100_000 + b"]" * 100_000, JSON, 400, "invalid_json"),
    ("deeply-nested-where-value", "POST", Q, b'{"where": [["s", "=", ' + b"[" * 5000 + b"]" * 5000 + b"]]}", JSON,
     400, "invalid_json"),
    ("deeply-nested-rows", "POST", R, b'{"rows": [{"id": 1000, "j": ' + b"[" * 5000 + b"]" * 5000 + b"}]}", JSON, 400,
     "invalid_json"),
    ("nested-deeper-than-the-limit", "POST", R, b'{"rows": [{"id": 1000, "j": ' + b"[" * 70 + b"]" * 70 + b"}]}",
     JSON, 400, "invalid_json"),
    ("bare-nan-literal", "POST", R, b'{"rows": [{"id": 1000, "f64": NaN}]}', JSON, 400, "invalid_json"),
    ("bare-infinity-literal", "POST", Q, b'{"where": [["f64", ">", -Infinity]]}', JSON, 400, "invalid_json"),
    ("too-many-where-terms", "POST", Q, q(where=[["i32", "=", 1]] * 300), JSON, 413, "too_large"),
    ("huge-int-for-float", "POST", R, rows(row(f64=10**400)), JSON, 400, "invalid_rows"),
    ("huge-int-for-float32", "POST", R, rows(row(f32=-10**400)), JSON, 400, "invalid_rows"),
    ("huge-int-in-point", "POST", R, rows(row(p={"x": 10**400, "y": 0})), JSON, 400, "invalid_rows"),
    ("huge-int-in-float-range", "POST", R, rows(row(rf={"lower": 10**400})), JSON, 400, "invalid_rows"),
    ("overflowing-float-in-json-column", "POST", R, b'{"rows": [{"id": 1000, "j": [1e400]}]}', JSON, 400,
     "invalid_rows"),
    ("lone-surrogate-string", "POST", R, b'{"rows": [{"id": 1000, "s": "\\ud800"}]}', JSON, 400, "invalid_rows"),
    ("bbox-huge-int-edge", "POST", Q, q(bbox={"column": "p", "xmin": -10**400, "ymin": 0, "xmax": 1, "ymax": 1}),
     JSON, 400, "invalid_query"),
    ("where-number-for-uuid", "POST", Q, q(where=[["u", "=", 5]]), JSON, 400, "invalid_query"),
    ("where-object-for-uuid", "POST", Q, q(where=[["u", "<", {}]]), JSON, 400, "invalid_query"),
    ("where-lone-surrogate", "POST", Q, b'{"where": [["s", "=", "\\udc00"]]}', JSON, 400, "invalid_query"),
    # stored fine before, then every read of the row (point get, JSON query) answered 500
    ("timestamp-beyond-year-9999", "POST", R, rows(row(ts=2**62)), JSON, 400, "invalid_rows"),
    ("timestamp-range-beyond-year-9999", "POST", R, rows(row(rt={"lower": 2**62})), JSON, 400, "invalid_rows"),
    ("arrow-timestamp-before-year-1", "POST", R, arrow(pa.table({"id": [1000], "ts": pa.array(
        [-(2**63)], pa.timestamp("us", tz="UTC"))})), ARROW, 400, "invalid_rows"),
    ("arrow-date-beyond-year-9999", "POST", R, arrow(pa.table({"id": [1000], "d": pa.array([2**31 - 1], pa.date32())})),
     ARROW, 400, "invalid_rows"),
    ("arrow-json-column-not-json", "POST", R, arrow(pa.table({"id": [1000], "j": ["{not json"]})), ARROW, 400,
     "invalid_rows"),
    ("arrow-json-column-nan", "POST", R, arrow(pa.table({"id": [1000], "j": ["[NaN]"]})), ARROW, 400, "invalid_rows"),
    ("arrow-json-column-too-deep", "POST", R, arrow(pa.table({"id": [1000], "j": ["[" * 600 + "]" * 600]})), ARROW,
     400, "invalid_rows"),
    ("oversized-query", "POST", Q, q(where=[["s", "=", "x" * 2_000_000]]), JSON, 413, "too_large"),
    ("oversized-delete", "POST", "/v1/tables/m/delete", q(keys=list(range(300_000))), JSON, 413, "too_large"),
    # answered 500 at once
    ("arrow-uuid-column-not-a-uuid", "POST", R, arrow(pa.table({"id": [1000], "u": ["not-a-uuid"]})), ARROW, 400,
     "invalid_rows"),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("malformed"), extra='max_body = "1MiB"')
    n.start()
    with n.client() as c:
        c.create_table("m", [{"name": k, "type": t} for k, t in ALL_TYPES], "id", indexes=["p", "s", "i32"])
        c.upsert("m", [ROW, {**ROW, "id": 8, "s": "other"}, {"id": 9}])
        _settle(c)
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log


def _settle(c) -> None:
    """Wait until the segments stop changing: a multi-partition batch's COMMIT records (and
    the closed-timestamp PROGRESS records) are lazy, flushed up to 50 ms after the batch."""
    deadline = time.monotonic() + 10
    prev = c.segments("m")
    while time.monotonic() < deadline:
        time.sleep(0.2)
        cur = c.segments("m")
        if cur == prev:
            return
        prev = cur
    raise TimeoutError("segments kept changing")


def state(c) -> tuple:
    t = c.query("m", limit=1_000_000)
    d = c.describe("m")
    for p in d.get("placement", []):
        p.pop("watermark", None)  # follows the closed timestamp by itself (idle partitions, RFC 0010 §6)
    return (t, d, [d["name"] for d in c.list_tables()["tables"]], c.segments("m"))


def test_the_corpus_is_big_enough():
    assert len(CORPUS) >= 40 and len({case[0] for case in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", CORPUS, ids=[case[0] for case in CORPUS])
def test_malformed_request_is_refused_and_changes_nothing(node, case):
    _, method, path, body, ctype, want_status, want_code = case
    with node.client() as c:
        before = state(c)
        status, raw, headers = c.request(method, path, body, ctype)
        doc = json.loads(raw)
        assert (status, doc["error"]["code"]) == (want_status, want_code), doc
        assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}
        assert doc["error"]["message"] and "Traceback" not in doc["error"]["message"]
        assert headers["content-type"].startswith("application/json")
        after = state(c)
        assert after[0].equals(before[0]) and after[1:] == before[1:]
