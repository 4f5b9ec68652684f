"""The numba ISO-8601 writer against Arrow's strftime (the formatting it replaces): the same
text for every microsecond timestamp, nulls, years outside 0001-9999 and other zones/units."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings, strategies as st

from node.json_columns import iso_strings, rows_of_columns

_US = pa.timestamp("us", tz="UTC")


def _arrow(arr: pa.Array) -> list[str | None]:
    return pc.strftime(arr.cast(_US), format="%Y-%m-%dT%H:%M:%SZ").to_pylist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-62135596800000000, 253402300799999999)), max_size=50))
def test_same_text_as_arrow(values):
    arr = pa.array(values, _US)
    assert iso_strings(arr) == _arrow(arr)


def test_known_answers_and_edges():
    arr = pa.array([0, -1, 951782400000000, 1782907200123456, -62135596800000000, 253402300799999999], _US)
    assert iso_strings(arr) == [
        "1970-01-01T00:00:00.000000Z", "1969-12-31T23:59:59.999999Z", "2000-02-29T00:00:00.000000Z",
        "2026-07-01T12:00:00.123456Z", "0001-01-01T00:00:00.000000Z", "9999-12-31T23:59:59.999999Z"]


def test_other_units_and_zones_are_utc_microseconds():
    t = dt.datetime(2026, 5, 1, 12, 0, 0, 500000, tzinfo=dt.timezone.utc)
    for typ in (pa.timestamp("ms", tz="UTC"), pa.timestamp("us"), pa.timestamp("s", tz="Europe/Berlin"),
                pa.timestamp("ns", tz="America/New_York")):
        arr = pa.array([t.replace(microsecond=0 if typ.unit == "s" else 500000)], typ)
        assert iso_strings(arr) == _arrow(arr)
    assert iso_strings(pa.array([], _US)) == []


def test_years_past_9999_take_arrows_text():
    arr = pa.array([253402300800000000, None, 0], _US)
    assert iso_strings(arr) == _arrow(arr)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=6), st.integers(0, 5))
def test_rows_of_columns_are_dicts_of_the_columns(names, n):
    cols = [[f"{j}:{i}" for i in range(n)] for j in range(len(names))]
    assert rows_of_columns(names, cols) == [dict(zip(names, vals)) for vals in zip(*cols)]


def test_a_name_is_never_code():
    names = ["'); import os; os._exit(1); ('", "a\\", '"\n', "__import__('os')"]
    assert rows_of_columns(names, [[1], [2], [3], [4]]) == [dict(zip(names, [1, 2, 3, 4]))]
    assert rows_of_columns([], []) == []
