"""JSON <-> Arrow row conversion (node/wire.py): every column type round-trips, column-wise
output equals value-wise output, and misfits are refused naming row and column."""
import datetime as dt
import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.wire import read_arrow_stream, row_to_json, rows_to_table, table_to_rows, write_arrow_stream
from rowstore.errors import RowValidationError
from rowstore.schema import parse_schema
from rowstore.tables.conform import conform

SCHEMA = parse_schema(
    "id int64 primary key, i8 int8, u64 uint64, f32 float32, f64 float64, b bool, s string, bin binary, "
    "ts timestamp, d date, u uuid, j json, p point, bx box, ri range<int64>, rf range<float64>, "
    "rt range<timestamp>")

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
f32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
ts_us = st.integers(-(2**62) // 1000, 2**62 // 1000)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                           max_leaves=6)


def _iso(us: int) -> str:
    t = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def _range(elem):
    return st.fixed_dictionaries({"lower": st.none() | elem, "upper": st.none() | elem,
                                  "lower_inclusive": st.booleans(), "upper_inclusive": st.booleans()})


row = st.fixed_dictionaries({
    "id": st.integers(-(2**63), 2**63 - 1),
    "i8": st.none() | st.integers(-128, 127),
    "u64": st.none() | st.integers(0, 2**64 - 1),
    "f32": st.none() | f32,
    "f64": st.none() | finite | st.sampled_from(["NaN", "Infinity", "-Infinity"]),
    "b": st.none() | st.booleans(),
    "s": st.none() | st.text(max_size=20),
    "bin": st.none() | st.binary(max_size=20).map(lambda b: __import__("base64").b64encode(b).decode()),
    "ts": st.none() | ts_us.map(_iso),
    "d": st.none() | st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)).map(lambda d: d.isoformat()),
    "u": st.none() | st.uuids().map(str),
    "j": json_values,
    "p": st.none() | st.fixed_dictionaries({"x": finite, "y": finite}),
    "bx": st.none() | st.fixed_dictionaries({"xmin": finite, "ymin": finite, "xmax": finite, "ymax": finite}),
    "ri": st.none() | _range(st.integers(-(2**63), 2**63 - 1)),
    "rf": st.none() | _range(finite),
    "rt": st.none() | _range(ts_us.map(_iso)),
})


def _norm(r: dict) -> dict:
    """Expected output: ISO dates with 4-digit years, float32 rounding, 'NaN' stays 'NaN'."""
    out = dict(r)
    if isinstance(out["f32"], float):
        out["f32"] = float(pa.array([out["f32"]], pa.float32())[0].as_py())
    for k in ("p", "bx", "rf"):
        if out[k] is not None:
            out[k] = {f: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                      for f, v in out[k].items()}
    if isinstance(out["f64"], int):
        out["f64"] = float(out["f64"])
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=1, max_size=5))
def test_json_rows_round_trip_through_arrow_and_ipc(rows):
    t = rows_to_table(rows, SCHEMA)
    batch = conform(t, SCHEMA)  # the engine accepts exactly what the codec produced
    back = read_arrow_stream(write_arrow_stream(pa.Table.from_batches([batch])))
    got = table_to_rows(back)
    assert got == [_norm(r) for r in rows]
    # value-wise conversion (point reads) agrees with column-wise conversion (queries)
    for g, py in zip(got, back.to_pylist()):
        assert row_to_json(py, SCHEMA) == g


@pytest.mark.parametrize("bad,where", [
    ({"id": 1, "i8": 128}, "rows[0].i8"), ({"id": 1, "u64": -1}, "rows[0].u64"),
    ({"id": 1, "b": "true"}, "rows[0].b"), ({"id": 1, "f64": "nan"}, "rows[0].f64"),
    ({"id": 1, "ts": "2024-01-01 25:00"}, "rows[0].ts"), ({"id": 1, "p": {"x": 1, "y": math.inf}}, "rows[0].p"),
    ({"id": 1, "rt": {"lower": 1.5}}, "rows[0].rt"), ({"id": 1, "zz": 1}, "unknown column 'zz'"),
])
def test_misfits_name_row_and_column(bad, where):
    with pytest.raises(RowValidationError) as ei:
        rows_to_table([{"id": 0}, bad][1:], SCHEMA)
    assert where in str(ei.value)
