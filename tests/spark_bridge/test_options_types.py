"""Options (the CLI's where/bbox syntax, one-line errors) and the vectorized conversions
between the engine's Arrow types and Spark's, checked value by value against Python's own
uuid and int — no Spark session needed."""
from __future__ import annotations

import decimal
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowstore.schema import parse_schema
from spark_bridge.errors import BridgeError, OptionError
from spark_bridge.options import Options, parse_bbox, parse_where
from spark_bridge.types import (
    spark_arrow_schema, spark_schema, to_spark_batch, to_table_batch, uuid_bytes, uuid_strings,
)
from tests.spark_bridge.test_read import COLUMNS


def test_where_takes_the_clis_terms_joined_with_and():
    assert parse_where("speed > 30") == [["speed", ">", "30"]]
    assert parse_where("speed>=30 AND name = 'a and b' and x != \"q\"") == \
        [["speed", ">=", "30"], ["name", "=", "a and b"], ["x", "!=", "q"]]
    assert parse_where("ts < 2024-05-01T12:00:00Z") == [["ts", "<", "2024-05-01T12:00:00Z"]]
    for bad in ("speed ~ 3", "speed >", "> 3", "speed > 3 and", "1x = 2"):
        with pytest.raises(OptionError, match="option where"):
            parse_where(bad)


def test_bbox_and_the_other_options():
    assert parse_bbox("loc:13,52,14.5,53") == {"column": "loc", "xmin": 13, "ymin": 52, "xmax": 14.5, "ymax": 53}
    for bad in ("loc:1,2,3", "loc 1,2,3,4", ":1,2,3,4", "loc:1,2,3,nan"):
        with pytest.raises(OptionError, match="option bbox"):
            parse_bbox(bad)
    o = Options.parse({"Endpoint": "http://127.0.0.1:7400", "TABLE": "t", "as_of": "12", "sealed_only": "TRUE",
                       "lease_s": "30", "where": "a = 1", "bbox": "loc:0,0,1,1"})
    assert (o.endpoint, o.table, o.as_of, o.sealed_only, o.lease_s) == ("http://127.0.0.1:7400", "t", 12, True, 30.0)
    assert o.where == [["a", "=", "1"]] and o.bbox["column"] == "loc"
    for raw, text in [({"table": "t"}, "option endpoint"), ({"endpoint": "http://h:1"}, "option table"),
                      ({"endpoint": "ftp://h", "table": "t"}, "option endpoint"),
                      ({"endpoint": "http://h:1", "table": "t", "as_of": "-1"}, "option as_of"),
                      ({"endpoint": "http://h:1", "table": "t", "sealed_only": "maybe"}, "option sealed_only"),
                      ({"endpoint": "http://h:1", "table": "t", "lease_s": "0"}, "option lease_s"),
                      ({"endpoint": "http://h:1", "table": "t", "starting_ts": "soon"}, "option starting_ts"),
                      ({"endpoint": "http://h:1", "table": "t", "colour": "red"}, "unknown option(s) colour")]:
        with pytest.raises(OptionError, match=text.replace("(", r"\(").replace(")", r"\)")):
            Options.parse(raw)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(min_size=16, max_size=16)), max_size=40), st.integers(0, 5))
def test_uuids_both_ways_equal_pythons(values, cut):
    arr = pa.array(values, pa.binary(16)).slice(min(cut, len(values)))
    want = [None if v is None else str(uuid.UUID(bytes=v)) for v in arr.to_pylist()]
    text = uuid_strings(arr)
    assert text.to_pylist() == want
    back = uuid_bytes(text)
    assert back.to_pylist() == arr.to_pylist()
    upper = pa.array([None if v is None else v.upper().replace("-", "") for v in want], pa.string())
    assert uuid_bytes(upper).to_pylist() == arr.to_pylist()


def test_bad_uuids_and_out_of_range_integers_are_refused_naming_the_column():
    schema = parse_schema("id int64 primary key, u uuid, small uint8, big uint64")
    for batch, text in [
        (pa.record_batch({"id": [1], "u": ["not-a-uuid"]}), "column 'u'"),
        (pa.record_batch({"id": [1], "u": ["zz" * 16]}), "not a hex digit"),
        (pa.record_batch({"id": [1], "small": pa.array([256], pa.int16())}), "column 'small'"),
        (pa.record_batch({"id": [1], "big": pa.array([decimal.Decimal(2**64)], pa.decimal128(20, 0))}), "column 'big'"),
        (pa.record_batch({"id": [1], "big": pa.array([decimal.Decimal(-1)], pa.decimal128(20, 0))}), "column 'big'"),
        (pa.record_batch({"id": [1], "nope": [1]}), "column 'nope' is not a column"),
    ]:
        with pytest.raises(BridgeError, match=text):
            to_table_batch(batch, schema)


def test_written_keys_go_through_the_nodes_one_key_check_before_anything_is_sent():
    ints = parse_schema("id int64 primary key, v string")
    strs = parse_schema("id string primary key, v string")
    uuids = parse_schema("id uuid primary key, v string")
    big = pa.array([decimal.Decimal(2**64 + 5)], pa.decimal128(38, 0))
    for batch, schema in [
        (pa.record_batch({"id": big}), ints),  # 2^64 + 5 must not become key 5
        (pa.record_batch({"id": pa.array([decimal.Decimal(2**63)], pa.decimal128(38, 0))}), ints),
        (pa.record_batch({"id": ["x" * 1025]}), strs),
        (pa.record_batch({"id": ["a\0b"]}), strs),
        (pa.record_batch({"id": ["12345678-1234-5678-1234-56781234567"]}), uuids),
    ]:
        with pytest.raises(BridgeError, match="column 'id'"):
            to_table_batch(batch, schema)
    edge = to_table_batch(pa.record_batch({"id": pa.array([-(2**63), 2**63 - 1], pa.int64())}), ints)
    assert edge.column(0).to_pylist() == [-(2**63), 2**63 - 1]


def test_every_type_converts_to_exactly_the_arrow_schema_spark_checks():
    from tests.spark_bridge.test_read import make_rows
    from rowstore.tables.conform import conform

    schema = parse_schema(", ".join(f"{n} {t}" + (" primary key" if n == "id" else "") for n, t in COLUMNS))
    rows = make_rows(range(200), 1, 5)
    for r in rows:  # JSON forms -> Arrow values the way the node's JSON path does
        r["bin"] = None if r["bin"] is None else __import__("base64").b64decode(r["bin"])
        r["j"] = None if r["j"] is None else __import__("json").dumps(r["j"])
        r["u"] = None if r["u"] is None else uuid.UUID(r["u"]).bytes
        r["d"] = None if r["d"] is None else __import__("datetime").date.fromisoformat(r["d"])
    batch = conform(pa.Table.from_pylist(rows, schema=pa.schema(
        [pa.field(f.name, f.type) for f in schema.arrow()])), schema)
    target = spark_arrow_schema(spark_schema(schema))
    out = to_spark_batch(batch.slice(3), [c.type for c in schema.columns], target)
    assert out.schema.equals(target) and out.num_rows == 197
    got = out.to_pylist()
    for want, row in zip(batch.slice(3).to_pylist(), got):
        assert row["u64"] == (None if want["u64"] is None else decimal.Decimal(want["u64"]))
        assert row["u"] == (None if want["u"] is None else str(uuid.UUID(bytes=want["u"])))
        assert row["u8"] == want["u8"] and row["loc"] == want["loc"] and row["rt"] == want["rt"]
    back = to_table_batch(out, schema)
    assert back.to_pylist() == batch.slice(3).to_pylist()  # and back to the table's types, losslessly
    big = pa.array(np.array([0, 2**63, 2**64 - 1], np.uint64))
    from spark_bridge.types import to_spark_column
    from rowstore.types import ColumnType
    assert to_spark_column(big, ColumnType.parse("uint64")).to_pylist() == [decimal.Decimal(v) for v in
                                                                            (0, 2**63, 2**64 - 1)]


def test_reader_option_picks_a_reader():
    base = {"endpoint": "http://127.0.0.1:1", "table": "t"}
    assert Options.parse(base).reader == "auto"
    assert Options.parse({**base, "READER": "Python"}).reader == "python"
    with pytest.raises(OptionError, match="option reader: auto, jvm or python"):
        Options.parse({**base, "reader": "scala"})
