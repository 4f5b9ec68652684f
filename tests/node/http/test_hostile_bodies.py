"""The JSON and Arrow body decoders (node/wire.py, rowstore/tables/conform.py, rowstore/reads/predicates.py)
fed hostile values by hypothesis: nesting depth, NaN/Infinity anywhere, huge integers where
floats or timestamps go, unicode digits and non-ASCII text, lone surrogates, strings where
numbers go and numbers where strings go. Every input either is refused with the package's
own error (a 4xx at the HTTP edge) or is stored and reads back as JSON — by point get and by
query — never another exception (a 500). Query parameters get the same over real HTTP."""
from __future__ import annotations

import asyncio
import json
import math
from urllib.parse import quote

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.node_proc import NodeProc
from node.wire import (BodyError, json_depth_over, parse_json_body, read_arrow_stream, row_to_json, rows_to_table,
                        table_to_rows)
from rowstore.errors import RowstoreError
from rowstore.reads.predicates import batch_mask, parse_bbox, parse_where
from rowstore.schema import parse_schema
from rowstore.tables.conform import conform
from tests.node.http.test_api import ALL_TYPES, ROW
from tests.rowstore.tables_world import TablesWorld

SCHEMA = parse_schema(", ".join(f"{n} {t}" + (" primary key" if n == "id" else "") for n, t in ALL_TYPES))
NAMES = [n for n, _ in ALL_TYPES]
SETTINGS = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

# -- hostile values --------------------------------------------------------------------------------

_DIGITS = "0123456789٠١٢٣٤٥٦٧٨٩０１２３４５６７８９²³¹߀०"
numberish_text = st.one_of(
    st.text(alphabet=_DIGITS + "+-._eE ", min_size=1, max_size=30),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "1e400", "-1e400", "0x10", "1_000", " 5", "5 ",
                     "2024-02-29T12:34:56Z", "+275760-09-13T00:00:00Z", "9999-12-31T23:59:59.999999Z",
                     "0001-01-01", "2024-13-01", "12345678-1234-5678-1234-567812345678", "", "\x00"]),
)
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**64 - 1, 10**300, -(10**300),
                     253_402_300_799_999_999, 253_402_300_800_000_000, -62_135_596_800_000_001]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(codec=None, categories=None), max_size=20),  # any code point, lone surrogates too
    numberish_text,
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(
        ["x", "y", "xmin", "ymin", "xmax", "ymax", "lower", "upper", "lower_inclusive", "upper_inclusive"]),
        st.text(max_size=5)), inner, max_size=5)), max_leaves=12)
rows = st.lists(st.fixed_dictionaries({"id": st.integers(0, 10**6)},
                                      optional={n: json_values for n in NAMES if n != "id"}), min_size=1, max_size=4)


def _to_json_text(v) -> str:
    """As a client would send it: Python's json with NaN/Infinity literals allowed, lone surrogates escaped."""
    return json.dumps(v)


# -- JSON bodies: depth and strictness ---------------------------------------------------------------

nested = st.recursive(st.one_of(st.integers(), st.text(alphabet='[]{}"\\,: ab', max_size=6)),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), inner,
                                                              max_size=3)), max_leaves=40)


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


@given(nested, st.integers(1, 8))
@SETTINGS
def test_the_depth_scan_agrees_with_the_parsed_depth_whatever_the_strings_hold(v, limit):
    body = json.dumps(v).encode()
    assert json_depth_over(body, limit) == (_depth(v) > limit)
    if _depth(v) > limit:
        with pytest.raises(BodyError, match="max_json_depth"):
            parse_json_body(body, limit)
    else:
        assert parse_json_body(body, limit) == v


@given(st.binary(max_size=200), st.integers(1, 64))
@SETTINGS
def test_any_bytes_parse_or_are_refused_as_invalid_json(body, limit):
    try:
        parse_json_body(body, limit)
    except BodyError as e:
        assert e.status == 400 and e.code == "invalid_json"


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_deep_bodies_are_refused_before_parsing(depth):
    for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth, b"[" * depth):
        with pytest.raises(BodyError, match="64 deep"):
            parse_json_body(body, 64)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_bare_nan_and_infinity_are_not_json(literal):
    with pytest.raises(BodyError, match="not JSON"):
        parse_json_body(b'{"rows": [{"f64": ' + literal + b"}]}", 64)
    assert parse_json_body(b'{"f64": "' + literal.lstrip(b"-") + b'"}', 64)  # the strings are fine


# -- JSON rows in, stored, read back -------------------------------------------------------------------


@pytest.fixture(scope="module")
def world():
    loop = asyncio.new_event_loop()
    w = TablesWorld(2)
    db = loop.run_until_complete(w.start())
    loop.run_until_complete(db.create_table("h", ", ".join(
        f"{n} {t}" + (" primary key" if n == "id" else "") for n, t in ALL_TYPES), indexes=["p", "s", "i32", "ts"]))
    yield loop, db
    loop.close()


def _refused_or_readable(loop, db, table: pa.Table):
    """Store ``table`` (or have it refused), then read every row back as JSON both ways."""
    try:
        loop.run_until_complete(db.upsert("h", table))
    except RowstoreError:
        return
    for k in table.column("id").to_pylist():
        row = loop.run_until_complete(db.get("h", k))
        json.dumps(row_to_json(row, SCHEMA), allow_nan=False)
    t, _ = loop.run_until_complete(db.query("h", where=[["id", "=", table.column("id")[0].as_py()]]))
    json.dumps(table_to_rows(t), allow_nan=False)


@given(rows)
@SETTINGS
def test_hostile_json_rows_are_refused_or_read_back(world, rs):
    loop, db = world
    body = _to_json_text({"rows": rs}).encode()
    try:
        doc = parse_json_body(body, 64)
        table = rows_to_table(doc["rows"], SCHEMA)
    except (BodyError, RowstoreError):
        return
    _refused_or_readable(loop, db, table)


@given(st.sampled_from(NAMES), json_values)
@SETTINGS
def test_strings_where_numbers_go_and_numbers_where_strings_go(world, name, value):
    loop, db = world
    kind = dict(ALL_TYPES)[name]
    try:
        table = rows_to_table([{"id": 1, name: value}], SCHEMA)
    except RowstoreError:
        return
    got = table.column(name)[0].as_py()
    if value is None:  # null fits every nullable column
        assert got is None
        return
    if kind.startswith(("int", "uint")):
        assert type(value) is int and got == value  # never a string, a float or a bool taken as a number
    if kind in ("string", "binary", "date", "uuid"):
        assert isinstance(value, str)
    if kind == "bool":
        assert type(value) is bool
    if kind.startswith("float"):
        assert type(value) in (int, float) or value in ("NaN", "Infinity", "-Infinity")
    _refused_or_readable(loop, db, table)


# -- Arrow bodies ----------------------------------------------------------------------------------------


def _arrow(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


GOOD = _arrow(rows_to_table([ROW, {**ROW, "id": 8}], SCHEMA))
HOSTILE_ARROW = [
    pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([2**62], pa.timestamp("us", tz="UTC"))}),
    pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([-(2**63)], pa.timestamp("us"))}),
    pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([2**62], pa.timestamp("ns"))}),
    pa.table({"id": pa.array([1], pa.int64()), "d": pa.array([2**31 - 1], pa.date32())}),
    pa.table({"id": pa.array([1], pa.int64()), "d": pa.array([-(2**31)], pa.date32())}),
    pa.table({"id": pa.array([1], pa.int64()), "f32": pa.array([math.nan], pa.float32())}),
    pa.table({"id": pa.array([1], pa.int64()), "f64": pa.array([math.inf])}),
    pa.table({"id": pa.array([1], pa.int64()), "p": pa.array([{"x": math.nan, "y": math.inf}])}),
    pa.table({"id": pa.array([1], pa.int64()), "u64": pa.array([2**64 - 1], pa.uint64())}),
    pa.table({"id": pa.array([1], pa.int64()), "i8": pa.array([2**63 - 1], pa.int64())}),
    pa.table({"id": pa.array([1], pa.int64()), "s": pa.array(["a\0b"])}),
    pa.table({"id": pa.array([1], pa.int64()), "s": pa.array([["nested"]])}),
    pa.table({"id": pa.array([1], pa.int64()), "j": pa.array(["{not json"])}),
    pa.table({"id": pa.array([1], pa.int64()), "u": pa.array(["not-a-uuid"])}),
    pa.table({"id": pa.array([1], pa.int64()), "bin": pa.array([b"\xff" * 10])}),
    pa.table({"id": pa.array([1], pa.int64()), "rt": pa.array([{"lower": 2**62, "upper": None,
                                                               "lower_inclusive": True, "upper_inclusive": False}],
                                                             pa.struct([("lower", pa.int64()), ("upper", pa.int64()),
                                                                        ("lower_inclusive", pa.bool_()),
                                                                        ("upper_inclusive", pa.bool_())]))}),
]


@pytest.mark.parametrize("i", range(len(HOSTILE_ARROW)))
def test_hostile_arrow_values_are_refused_or_read_back(world, i):
    loop, db = world
    t = read_arrow_stream(_arrow(HOSTILE_ARROW[i]))
    try:
        t = pa.Table.from_batches([conform(t, SCHEMA)])
    except RowstoreError:
        return
    _refused_or_readable(loop, db, t)


@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), max_size=6),
       st.integers(0, len(GOOD)))
@SETTINGS
def test_damaged_arrow_streams_are_refused_or_read_back(world, flips, cut):
    loop, db = world
    body = bytearray(GOOD[:cut] if cut else GOOD)
    for at, b in flips:
        if at < len(body):
            body[at] = b
    try:
        t = read_arrow_stream(bytes(body))
        _refused_or_readable(loop, db, pa.Table.from_batches([conform(t, SCHEMA)]))
    except RowstoreError:
        pass


# -- query values --------------------------------------------------------------------------------------


@given(st.sampled_from(NAMES), st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), json_values)
@SETTINGS
def test_hostile_where_values_are_refused_or_evaluated(world, name, op, value):
    loop, db = world
    batch = conform(rows_to_table([ROW, {**ROW, "id": 8}, {"id": 9}], SCHEMA), SCHEMA)
    try:
        terms = parse_where(SCHEMA, [[name, op, value]])
    except RowstoreError:
        return
    batch_mask(batch, terms, None)
    t, _ = loop.run_until_complete(db.query("h", where=[[name, op, value]], limit=5))
    json.dumps(table_to_rows(t), allow_nan=False)


@given(st.dictionaries(st.sampled_from(["column", "xmin", "ymin", "xmax", "ymax", "z"]), json_values))
@SETTINGS
def test_hostile_bounding_boxes_are_refused_or_evaluated(world, box):
    loop, db = world
    try:
        parse_bbox(SCHEMA, {**box, "column": box.get("column", "p") if box.get("column") != "z" else "p"})
    except RowstoreError:
        return


# -- query parameters over HTTP ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("hostile"), extra="max_json_depth = 8\nmax_query_terms = 2")
    n.start()
    with n.client() as c:
        c.create_table("q", [{"name": k, "type": t} for k, t in ALL_TYPES], "id")
        c.upsert("q", [ROW])
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log, log[-3000:]


def test_the_configured_limits_hold_over_http(node):
    with node.client() as c:
        ok = {"rows": [{"id": 70, "j": [[[[1]]]]}]}  # 7 deep
        assert c.request("POST", "/v1/tables/q/rows", json.dumps(ok).encode(), "application/json")[0] == 200
        deep = {"rows": [{"id": 71, "j": [[[[[1]]]]]}]}  # 8 deep: the limit
        assert c.request("POST", "/v1/tables/q/rows", json.dumps(deep).encode(), "application/json")[0] == 200
        deeper = {"rows": [{"id": 72, "j": [[[[[[1]]]]]]}]}
        status, body, _ = c.request("POST", "/v1/tables/q/rows", json.dumps(deeper).encode(), "application/json")
        assert (status, json.loads(body)["error"]["code"]) == (400, "invalid_json")
        assert "max_json_depth" in json.loads(body)["error"]["message"]
        for path in ("/v1/tables/q/query", "/v1/tables/q/plan"):
            two = {"where": [["i32", ">", 0], ["i32", "<", 9]]}
            assert c.request("POST", path, json.dumps(two).encode(), "application/json")[0] == 200
            three = {"where": two["where"] * 2}
            status, body, _ = c.request("POST", path, json.dumps(three).encode(), "application/json")
            assert (status, json.loads(body)["error"]["code"]) == (413, "too_large"), body
        assert c.get("q", 72) is None


PATHS = ["/v1/tables?as_of={}", "/v1/tables/q?as_of={}", "/v1/tables/q/rows/7?as_of={}", "/v1/tables/q/rows/{}",
         "/v1/tables/q/snapshot?as_of={}", "/v1/admin/segments?table={}", "/v1/tables/{}", "/v1/tables/{}/rows/1"]


@pytest.mark.slow
@given(st.one_of(numberish_text, st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
                 st.integers(-(2**70), 2**70).map(str)))
@SETTINGS
def test_unicode_digits_and_non_ascii_in_every_parameter_get_a_4xx_or_an_answer(node, text):
    with node.client() as c:
        for path in PATHS:
            status, body, headers = c.request("GET", path.format(quote(text, safe="")))
            assert status < 500, (path, text, status, body[:300])
            doc = json.loads(body)
            if status >= 400:
                assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}, doc
