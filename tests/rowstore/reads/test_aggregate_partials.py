"""Partials of aggregates (rowstore.reads.aggregates) merge to the same answer however the rows
are split, and ``nan: "largest"`` orders NaN above every number in max (Spark's order), at the
partial and at the merge, against a row-by-row model."""
import math
import struct

import hypothesis.strategies as st
import pyarrow as pa
from hypothesis import given, settings

from rowstore.reads.aggregates import finish, merge, partial
from rowstore.reads.agg_spec import cname, parse_spec
from rowstore.schema import Column, SchemaVersion
from rowstore.types import ColumnType

SCHEMA = SchemaVersion(1, (Column(0, "id", ColumnType.parse("int64"), False), Column(1, "g", ColumnType.parse("int32")),
                           Column(2, "v", ColumnType.parse("float64")), Column(3, "f", ColumnType.parse("float32"))),
                       0, 4)
AGGS = [{"fn": "max", "column": "v"}, {"fn": "min", "column": "v"}, {"fn": "max", "column": "f"},
        {"fn": "count", "column": "v"}]
# NaNs of several bit patterns: quiet, negative, with a payload, signalling (Arrow's min/max alone answer by row
# order when a signalling NaN is among the values)
NANS = [struct.unpack("<d", struct.pack("<Q", b))[0]
        for b in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FF4000000000000)]
VALUES = st.one_of(st.none(), st.sampled_from([*NANS, -0.0, 0.0, math.inf, -math.inf, 1.5, -2.0]),
                   st.floats(-1e6, 1e6, width=32))


def _rows(keys, vals) -> pa.Table:
    cols = {"_row": pa.nulls(len(keys), pa.int8()), cname(SCHEMA.columns[1]): pa.array(keys, pa.int32()),
            cname(SCHEMA.columns[2]): pa.array(vals, pa.float64()),
            cname(SCHEMA.columns[3]): pa.array(vals, pa.float32())}
    return pa.table(cols)


def _spark_max(vals):
    vals = [v for v in vals if v is not None]
    return None if not vals else math.nan if any(math.isnan(v) for v in vals) else max(vals)


def _min(vals):
    vals = [v for v in vals if v is not None]
    nums = [v for v in vals if not math.isnan(v)]
    return min(nums) if nums else (math.nan if vals else None)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.tuples(st.integers(0, 3), VALUES), max_size=40), cuts=st.lists(st.integers(0, 40), max_size=4),
       nan=st.sampled_from([None, "ignore", "largest"]))
def test_split_partials_merge_to_the_model(data, cuts, nan):
    spec = parse_spec(SCHEMA, ["g"], AGGS, nan)
    keys, vals = [k for k, _ in data], [v for _, v in data]
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    parts = [partial(_rows(keys[a:b], vals[a:b]), spec) for a, b in zip(bounds, bounds[1:])] or \
        [partial(_rows([], []), spec)]
    got = finish(merge(parts, spec), spec).to_pylist()
    assert sorted(r["g"] for r in got) == sorted(set(keys))
    for r in got:
        vs = [v for k, v in data if k == r["g"]]
        want_max = _spark_max(vs) if nan == "largest" else _min([-v if v is not None else None for v in vs])
        if nan != "largest" and want_max is not None:
            want_max = -want_max  # Arrow's max: NaN left out unless every value is NaN
        assert _same(r["max_v"], want_max), (r, vs, nan)
        f32 = [None if v is None else float(pa.scalar(v, pa.float32()).as_py()) for v in vs]
        assert _same(r["max_f"], _spark_max(f32) if nan == "largest" else (None if want_max is None else
                                                                           r["max_f"])), (r, vs)
        assert _same(r["min_v"], _min(vs)), (r, vs, nan)
        assert r["count_v"] == sum(v is not None for v in vs)
