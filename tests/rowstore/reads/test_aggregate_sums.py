"""Integer sums are exact or refused, never wrapped: Arrow adds int64 modulo 2^64, so a sum
beyond 64 bits must be caught (at a partial or at the merge of partials that each fit), and a
mean of large integers is still answered — against Python's integers."""
import hypothesis.strategies as st
import pyarrow as pa
import pytest
from hypothesis import given, settings

from rowstore.errors import QueryError
from rowstore.reads.aggregates import finish, merge, partial
from rowstore.reads.agg_spec import cname, parse_spec
from rowstore.schema import Column, SchemaVersion
from rowstore.types import ColumnType

SCHEMA = SchemaVersion(1, (Column(0, "id", ColumnType.parse("int64"), False), Column(1, "g", ColumnType.parse("int32")),
                           Column(2, "w", ColumnType.parse("int64")), Column(3, "u", ColumnType.parse("uint64"))),
                       0, 4)
BIG = st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 5) | st.sampled_from([2**62, 2**63 - 1, -(2**63)])


def _rows(keys, w, u) -> pa.Table:
    return pa.table({"_row": pa.nulls(len(keys), pa.int8()), cname(SCHEMA.columns[1]): pa.array(keys, pa.int32()),
                     cname(SCHEMA.columns[2]): pa.array(w, pa.int64()),
                     cname(SCHEMA.columns[3]): pa.array(u, pa.uint64())})


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2), BIG, st.integers(0, 2**64 - 1) | st.integers(0, 9)),
                     min_size=1, max_size=12), cut=st.integers(0, 12), col=st.sampled_from(["w", "u"]))
def test_sums_are_exact_or_refused_however_the_rows_are_split(rows, cut, col):
    spec = parse_spec(SCHEMA, ["g"], [{"fn": "sum", "column": col}, {"fn": "mean", "column": col}])
    keys, w, u = map(list, zip(*rows))
    vals = w if col == "w" else u
    want = {}
    for k, v in zip(keys, vals):
        want[k] = want.get(k, 0) + v
    lo, hi = (-(2**63), 2**63 - 1) if col == "w" else (0, 2**64 - 1)
    fits = all(lo <= s <= hi for s in want.values())
    cut = min(cut, len(rows))
    try:
        parts = [partial(_rows(keys[a:b], w[a:b], u[a:b]), spec) for a, b in ((0, cut), (cut, len(rows)))]
        got = finish(merge(parts, spec), spec).to_pylist()
    except QueryError as e:
        assert not fits, (want, e)
        assert "beyond a 64-bit integer" in str(e)
        return
    assert fits, (want, got)
    assert {r["g"]: r[f"sum_{col}"] for r in got} == want
    counts = {k: keys.count(k) for k in want}
    for r in got:
        assert r[f"mean_{col}"] == pytest.approx(want[r["g"]] / counts[r["g"]], rel=1e-12)


def test_partials_that_each_fit_can_overflow_together():
    spec = parse_spec(SCHEMA, [], [{"fn": "sum", "column": "w"}])
    one = partial(_rows([0], [2**62 + 2**61], [0]), spec)
    with pytest.raises(QueryError, match="beyond a 64-bit integer"):
        finish(merge([one, one], spec), spec)
    back = partial(_rows([0], [-(2**62) - 1], [0]), spec)  # a partial beyond 64 bits, then a total within
    assert finish(merge([merge([one, one], spec), back], spec), spec).to_pylist() == [{"sum_w": 2**63 - 1}]
    mean = parse_spec(SCHEMA, [], [{"fn": "mean", "column": "w"}])
    p = partial(_rows([0], [2**62 + 2**61], [0]), mean)
    assert finish(merge([p, p], mean), mean).to_pylist() == [{"mean_w": float(2**62 + 2**61)}]
