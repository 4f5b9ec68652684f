"""The fast row encoder (node/http/fast_encoder.py) against the full path: wherever it accepts a row,
its bytes are exactly ``encode_rows(conform(rows_to_table(...)))``'s; values it is unsure of are
``NotFast`` (the full path decides), never a different encoding."""
import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.wire import rows_to_table
from node.http.fast_encoder import NotFast, encoder, index_key
from rowstore.codec.rows import encode_rows
from rowstore.db.write.committer import _filler
from rowstore.errors import RowValidationError
from rowstore.schema import parse_schema
from rowstore.tables.conform import TS_RANGE_US, conform
from rowstore.tables.key_check import check_keys
from rowstore.tables.keys import encode_one

SCHEMA = parse_schema(
    "id int64 primary key, i8 int8, u16 uint16, u64 uint64, f32 float32, f64 float64, b bool, s string, "
    "bin binary, ts timestamp, d date, u uuid, p point, bx box, n int32 not null, s2 string not null")


def _full(rows, schema=SCHEMA) -> list[bytes]:
    enc = encode_rows(conform(rows_to_table(rows, schema), schema), schema, 0)
    ends = [*enc.starts.tolist(), enc.nbytes]
    return [enc.buf[a:b].tobytes() for a, b in zip(ends, ends[1:])]


def _tomb_full(key, schema=SCHEMA) -> bytes:
    karr = check_keys([key], schema.pk.columns[0])
    cols = [karr if c.id in schema.primary_key else _filler(c, 1) for c in schema.columns]
    b = pa.RecordBatch.from_arrays(cols, schema=schema.arrow())
    return encode_rows(b, schema, 0, np.ones(1, bool)).buf.tobytes()


def _iso(us: int) -> str:
    t = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond:06d}"[: 1 + (us % 7)] if us % 7 else "") + "Z"


finite = st.floats(allow_nan=False, allow_infinity=False)
opt = st.none
row = st.fixed_dictionaries({
    "id": st.integers(-(2**63), 2**63 - 1),
    "n": st.integers(-(2**31), 2**31 - 1),
    "s2": st.text(max_size=8),
}, optional={
    "i8": opt() | st.integers(-128, 127), "u16": opt() | st.integers(0, 65535),
    "u64": opt() | st.integers(0, 2**64 - 1), "f32": opt() | st.floats(width=32, allow_nan=False,
                                                                         allow_infinity=False),
    "f64": opt() | finite | st.integers(-(2**53), 2**53), "b": opt() | st.booleans(), "s": opt() | st.text(max_size=12),
    "bin": opt() | st.binary(max_size=8).map(lambda b: __import__("base64").b64encode(b).decode()),
    "ts": opt() | st.integers(*TS_RANGE_US) | st.integers(0, 4 * 10**15).map(_iso),  # years 0001-9999
    "d": opt() | st.dates().map(str), "u": opt() | st.uuids().map(str),
    "p": opt() | st.fixed_dictionaries({"x": finite, "y": finite}),
    "bx": opt() | st.fixed_dictionaries({"xmin": finite, "ymin": finite, "xmax": finite, "ymax": finite}),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(row, min_size=1, max_size=4))
def test_fast_rows_equal_the_full_path(rows):
    rows = json.loads(json.dumps(rows))  # exactly what a request body parses to
    enc = encoder(SCHEMA)
    fast = [enc.row(r) for r in rows]
    assert [b for b, _ in fast] == _full(rows)
    assert [index_key(k, "int64") for _, k in fast] == [encode_one(r["id"], "int64") for r in rows]


@settings(max_examples=100, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_fast_tombstone_equals_the_delete_path(key):
    b, k = encoder(SCHEMA).tombstone(key)
    assert b == _tomb_full(key) and k == key


@pytest.mark.parametrize("spec", ["k string primary key, v float64", "k uuid primary key, v int64 not null, t string"])
def test_other_key_types(spec):
    schema = parse_schema(spec)
    enc = encoder(schema)
    key = "sensor-7" if "string" in spec.split(",")[0] else "12345678-1234-5678-1234-567812345678"
    r = {"k": key, "v": 3}
    assert enc.row(r)[0] == _full([r], schema)[0]
    assert enc.tombstone(key)[0] == _tomb_full(key, schema)


BAD = [{"id": True}, {"id": 1.0}, {"id": None}, {"n": 1, "s2": ""}, {"id": 1, "n": 1, "s2": "", "zz": 1},
       {"id": 1, "n": 2**31, "s2": ""}, {"id": 1, "n": 1, "s2": None}, {"id": 1, "n": 1, "s2": "", "i8": 128},
       {"id": 1, "n": 1, "s2": "", "f64": "NaN"}, {"id": 1, "n": 1, "s2": "", "b": 1},
       {"id": 1, "n": 1, "s2": "", "ts": "2024-01-01 00:00:00"},
       {"id": 1, "n": 1, "s2": "", "ts": "2024-02-30T00:00:00Z"},
       {"id": 1, "n": 1, "s2": "", "u": "{12345678-1234-5678-1234-567812345678}"},
       {"id": 1, "n": 1, "s2": "", "p": {"x": 1}}, {"id": 1, "n": 1, "s2": "", "p": {"x": 1, "y": float("inf")}},
       {"id": 1, "n": 1, "s2": "", "bin": "not base64!"}, {"id": 1, "n": 1, "s2": "", "f32": 1e39},
       {"id": 1, "n": 1, "s2": "", "s": "\ud800"}, {"id": 1, "n": 1, "s2": "", "d": "2024-13-01"}]


@pytest.mark.parametrize("r", BAD, ids=range(len(BAD)))
def test_unsure_values_take_the_full_path(r):
    with pytest.raises(NotFast):
        encoder(SCHEMA).row(r)


def test_timestamps_a_read_could_not_write_back_are_refused_on_both_paths():
    for us in (TS_RANGE_US[0] - 1, TS_RANGE_US[1] + 1, 2**62, -(2**63)):
        with pytest.raises(NotFast):
            encoder(SCHEMA).row({"id": 1, "n": 1, "s2": "", "ts": us})
        with pytest.raises(RowValidationError):
            _full([{"id": 1, "n": 1, "s2": "", "ts": us}])


def test_json_and_range_tables_have_no_fast_path():
    assert encoder(parse_schema("id int64 primary key, j json")) is None
    assert encoder(parse_schema("id int64 primary key, r range<int64>")) is None


def test_string_keys_the_full_path_judges():
    for k in ("", "a\0b", "x" * 1025):
        with pytest.raises(NotFast):
            index_key(k, "string")
    with pytest.raises(RowValidationError):
        check_keys(["a\0b"], parse_schema("k string primary key").pk.columns[0])
    with pytest.raises(RowValidationError):
        encode_one("a\0b", "string")
    for k in (2**63, -(2**63) - 1, 2**64 + 5):  # the fast path never wraps a key either
        with pytest.raises(NotFast):
            index_key(k, "int64")
