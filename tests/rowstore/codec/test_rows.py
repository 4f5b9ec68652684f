"""Row codec: the worked example, round trips over every type (hypothesis), schema history."""
import datetime as dt
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowstore.errors import RowCorruptionError, RowValidationError, SchemaError
from rowstore.codec.rows import decode_rows, encode_rows
from rowstore.schema import parse_schema
from rowstore.types import ColumnType

ALL = ("id int64 primary key, a int8, b int16, c int32, d uint8, e uint16, f uint32, g uint64, "
       "h float32, i float64, j bool, k string, l binary, m timestamp, n date, o uuid, p json, "
       "q point, r box, s range<int64>, t range<float64>, u range<timestamp>")


def test_worked_example():
    s = parse_schema("id int64 primary key, temp float32, name string", version=3)
    batch = pa.record_batch({"id": [7], "temp": pa.array([None], pa.float32()), "name": ["ab"]})
    enc = encode_rows(batch, s, commit_ts=100)
    assert enc.buf.tobytes().hex(" ") == (
        "24 00 00 00 03 00 00 00 64 00 00 00 00 00 00 00 00 02 "
        "07 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 61 62")


def _values(schema):
    """A hypothesis strategy for one row as {column: python value or None}."""
    f64 = st.floats(allow_nan=False, width=64)
    ts = st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1),
                      timezones=st.just(dt.timezone.utc))

    def rng(elem):
        return st.one_of(st.none(), st.fixed_dictionaries({
            "lower": st.none() | elem, "upper": st.none() | elem,
            "lower_inclusive": st.booleans(), "upper_inclusive": st.booleans()}))

    per = {
        "id": st.integers(-2**63, 2**63 - 1), "a": st.integers(-128, 127), "b": st.integers(-2**15, 2**15 - 1),
        "c": st.integers(-2**31, 2**31 - 1), "d": st.integers(0, 255), "e": st.integers(0, 2**16 - 1),
        "f": st.integers(0, 2**32 - 1), "g": st.integers(0, 2**64 - 1),
        "h": st.floats(allow_nan=False, width=32), "i": f64, "j": st.booleans(), "k": st.text(max_size=30),
        "l": st.binary(max_size=30), "m": ts, "n": st.dates(), "o": st.uuids().map(lambda u: u.bytes),
        "p": st.text(max_size=10).map(lambda s: '{"v": %s}' % len(s)),
        "q": st.fixed_dictionaries({"x": f64, "y": f64}),
        "r": st.fixed_dictionaries({k: f64 for k in ("xmin", "ymin", "xmax", "ymax")}),
        "s": None, "t": None, "u": None,
    }
    per["s"] = rng(st.integers(-2**63, 2**63 - 1))
    per["t"] = rng(f64)
    per["u"] = rng(ts)
    return st.fixed_dictionaries({k: (v if k in ("id", "s", "t", "u") else st.none() | v)
                                  for k, v in per.items()})


SCHEMA = parse_schema(ALL, version=5)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_values(SCHEMA), max_size=40), ts=st.integers(0, 2**64 - 1),
       dels=st.lists(st.booleans(), max_size=40))
def test_round_trip_every_type(rows, ts, dels):
    table = pa.Table.from_pylist(rows, schema=SCHEMA.arrow())
    deleted = np.array((dels + [False] * len(rows))[: len(rows)], bool)
    enc = encode_rows(table, SCHEMA, ts, deleted)
    dec = decode_rows(enc.buf, enc.starts, lambda v: SCHEMA, SCHEMA)
    assert dec.batch.to_pylist() == table.to_pylist()
    assert (dec.commit_ts == ts).all() and (dec.deleted == deleted).all()
    # a subset of rows, in another order
    pick = np.arange(len(rows))[::-1][::2]
    sub = decode_rows(enc.buf, enc.starts[pick], lambda v: SCHEMA, SCHEMA)
    assert sub.batch.to_pylist() == [table.to_pylist()[i] for i in pick]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_values(SCHEMA), max_size=40), seed=st.integers(0, 99), dels=st.lists(st.booleans(), max_size=40))
def test_encoding_in_an_order_equals_encoding_the_taken_rows(rows, seed, dels):
    table = pa.Table.from_pylist(rows, schema=SCHEMA.arrow())
    deleted = np.array((dels + [False] * len(rows))[: len(rows)], bool)
    order = np.random.default_rng(seed).permutation(len(rows))
    got = encode_rows(table, SCHEMA, 7, deleted, order)
    want = encode_rows(table.take(pa.array(order, pa.int64())), SCHEMA, 7, deleted[order])
    assert got.buf.tobytes() == want.buf.tobytes() and got.starts.tolist() == want.starts.tolist()


def test_schema_history_by_column_id():
    v1 = parse_schema("id int64 primary key, temp float64, note string")
    v2 = v1.add_column("hum", "float32")
    v3 = v2.rename_column("temp", "celsius")
    v4 = v3.drop_column("note")
    v5 = v4.add_column("note", "string")  # same name, a different column
    b1 = pa.record_batch({"id": [1], "temp": [20.5], "note": ["old"]})
    b5 = pa.record_batch({"id": [2], "celsius": [21.0], "hum": pa.array([0.5], pa.float32()), "note": ["new"]},
                         schema=v5.arrow())
    e1, e5 = encode_rows(b1, v1, 10), encode_rows(b5, v5, 20)
    buf = np.concatenate([e1.buf, e5.buf])
    starts = np.concatenate([e1.starts, e5.starts + e1.nbytes])
    versions = {1: v1, 5: v5}
    got = decode_rows(buf, starts, versions.__getitem__, v5).batch.to_pylist()
    assert got == [{"id": 1, "celsius": 20.5, "hum": None, "note": None},
                   {"id": 2, "celsius": 21.0, "hum": 0.5, "note": "new"}]
    old = decode_rows(buf, starts, versions.__getitem__, v1).batch.to_pylist()
    assert old == [{"id": 1, "temp": 20.5, "note": "old"}, {"id": 2, "temp": 21.0, "note": None}]


def test_validation():
    s = parse_schema("id int64 primary key, v float64")
    with pytest.raises(RowValidationError, match="expected double"):
        encode_rows(pa.record_batch({"id": [1], "v": ["x"]}), s, 1)
    with pytest.raises(RowValidationError, match="missing"):
        encode_rows(pa.record_batch({"v": [1.0]}), s, 1)
    with pytest.raises(RowValidationError, match="not nullable"):
        encode_rows(pa.record_batch({"id": pa.array([None], pa.int64())}), s, 1)
    for bad in ["id float64 primary key", "x int64", "id int64 primary key, id string",
                "id int64 primary key, r range<string>", "id int64 primary key, z complex"]:
        with pytest.raises(SchemaError):
            parse_schema(bad)
    assert str(ColumnType.parse("RANGE<Timestamp>")) == "range<timestamp>"


def test_damaged_row_is_detected():
    s = parse_schema("id int64 primary key, name string")
    enc = encode_rows(pa.record_batch({"id": [1, 2], "name": ["a", "bb"]}), s, 1)
    buf = enc.buf.copy()
    buf[int(enc.starts[1])] ^= 0x40  # row_len of row 1
    with pytest.raises(RowCorruptionError) as ei:
        decode_rows(buf, enc.starts, lambda v: s, s)
    assert ei.value.offset == int(enc.starts[1])


def test_uuid_and_empty():
    s = parse_schema("id uuid primary key, v int64")
    u = uuid.uuid4().bytes
    b = pa.record_batch({"id": pa.array([u], pa.binary(16)), "v": [5]})
    enc = encode_rows(b, s, 3)
    assert decode_rows(enc.buf, enc.starts, lambda v: s, s).batch.to_pylist() == [{"id": u, "v": 5}]
    empty = encode_rows(b.slice(0, 0), s, 3)
    assert decode_rows(empty.buf, empty.starts, lambda v: s, s).batch.num_rows == 0


def test_decode_run_checks_rows_chain_and_names_offsets():
    from rowstore.codec.rows import decode_run

    v1 = parse_schema("id int64 primary key, name string")
    v2 = v1.add_column("x", "float64")
    e1 = encode_rows(pa.record_batch({"id": [1, 2], "name": ["a", "bb"]}), v1, 5)
    e2 = encode_rows(pa.record_batch({"id": [3], "name": ["ccc"], "x": [1.5]}, schema=v2.arrow()), v2, 6)
    buf = np.concatenate([e1.buf, e2.buf])
    starts = np.concatenate([e1.starts, e2.starts + e1.nbytes])
    got = decode_run(buf, starts, {1: v1, 2: v2}.__getitem__, v2, "seg", base=1000)
    assert got.batch.to_pylist() == [{"id": 1, "name": "a", "x": None}, {"id": 2, "name": "bb", "x": None},
                                     {"id": 3, "name": "ccc", "x": 1.5}]
    assert got.commit_ts.tolist() == [5, 5, 6] and got.schema_ver.tolist() == [1, 1, 2]
    for schemas, cut in (({1: v1}, e1.nbytes), ({1: v1, 2: v2}, len(buf))):
        extra = np.concatenate([buf[:cut], np.zeros(3, np.uint8)])  # 3 stray bytes after the last row
        with pytest.raises(RowCorruptionError, match="does not end where") as ei:
            decode_run(extra, starts[: 2 if cut == e1.nbytes else 3], schemas.__getitem__, v1, "seg", base=1000)
        assert ei.value.where == "seg" and ei.value.offset >= 1000
    with pytest.raises(RowCorruptionError, match="header past the end"):
        decode_rows(buf, np.array([len(buf) - 4]), lambda v: v1, v1)


def test_decode_projects_every_type_into_other_versions():
    """Dropped, renamed and added columns of every type, decoded from one version into another."""
    s = SCHEMA
    t = s
    for name in ("b", "k", "q", "s", "o"):
        t = t.drop_column(name)
    t = t.rename_column("i", "i2").add_column("k", "string").add_column("z", "range<float64>")
    row = {"id": 1, "a": 2, "b": 3, "c": None, "d": 4, "e": 5, "f": 6, "g": 7, "h": 1.5, "i": 2.5, "j": True,
           "k": "kk", "l": b"ll", "m": dt.datetime(2020, 1, 2, tzinfo=dt.timezone.utc), "n": dt.date(2021, 3, 4),
           "o": b"u" * 16, "p": '{"v": 1}', "q": {"x": 1.0, "y": 2.0}, "r": None,
           "s": {"lower": None, "upper": 5, "lower_inclusive": False, "upper_inclusive": True},
           "t": None, "u": None}
    table = pa.Table.from_pylist([row, dict(row, id=2, j=None, k=None)], schema=s.arrow())
    enc = encode_rows(table, s, 9)
    got = decode_rows(enc.buf, enc.starts, lambda v: s, t).batch.to_pylist()
    keep = {k: v for k, v in row.items() if k not in ("b", "k", "q", "s", "o", "i")}
    assert got[0] == dict(keep, i2=2.5, k=None, z=None)
    assert got[1] == dict(keep, id=2, j=None, i2=2.5, k=None, z=None)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_values(SCHEMA), min_size=1, max_size=30),
       cut=st.tuples(st.integers(0, 30), st.integers(0, 30)))
def test_sliced_arrays_encode_like_fresh_ones(rows, cut):
    """Encoding reads Arrow buffers directly: a slice (non-zero offsets, also inside bitmaps and
    struct children) must give exactly the bytes of the same rows built fresh."""
    lo, hi = sorted(c % (len(rows) + 1) for c in cut)
    sliced = pa.RecordBatch.from_pylist(rows, schema=SCHEMA.arrow()).slice(lo, hi - lo)
    assert hi == lo or sliced.column(0).offset == lo
    fresh = pa.Table.from_pylist(rows[lo:hi], schema=SCHEMA.arrow())
    a, b = encode_rows(sliced, SCHEMA, 77), encode_rows(fresh, SCHEMA, 77)
    assert a.buf.tobytes() == b.buf.tobytes() and a.starts.tolist() == b.starts.tolist()
    assert decode_rows(a.buf, a.starts, lambda v: SCHEMA, SCHEMA).batch.to_pylist() == rows[lo:hi]
