"""Column pages (docs/format/segment.md §7.3): the worked examples, each encoding's known
answer, round trips of every type against Arrow (hypothesis), damaged pages refused."""
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowstore.codec.columns import (BITS, BSS, DELTA, DICT, FOR, PLAIN, PLAIN_VAR, decode_page, decode_page_rows,
                                   encode_page)
from rowstore.errors import ColumnCorruptionError
from rowstore.types import ColumnType

from tests.rowstore.codec.test_rows import ALL, SCHEMA, _values


def _page(values, type_text, arrow_type=None):
    t = ColumnType.parse(type_text)
    return encode_page(pa.array(values, arrow_type or t.arrow()), t), t


def test_worked_examples():
    """The three pages of docs/format/segment.md §7.3, byte for byte."""
    assert _page([7, 8, 9, 10], "int64")[0].hex(" ") == (
        "04 00 00 00 00 01 00 00 03 01 00 00 0c 00 00 00 07 00 00 00 00 00 00 00 00 01 02 03")
    assert _page([None, 1.5], "float32")[0].hex(" ") == (
        "02 00 00 00 01 01 00 00 02 05 04 00 00 08 00 00 00 00 00 00 00 00 c0 00 3f")
    assert _page(["ab", "ab", "ab"], "string")[0].hex(" ") == (
        "03 00 00 00 00 01 00 00 02 01 00 00 11 00 00 00 01 00 00 00 00 00 00 00 02 00 00 00 61 62 00 00 00")


def test_encoding_constants_are_the_formats():
    assert (PLAIN, PLAIN_VAR, DICT, FOR, DELTA, BSS, BITS) == (0, 1, 2, 3, 4, 5, 6)


@pytest.mark.parametrize("values, type_text, encoding, width", [
    ([5, 5, 5, 5], "int64", FOR, 0),  # every value the base
    (list(range(0, 4000, 4)), "int64", DELTA, 0),  # a constant step
    ([-(2**63), 2**63 - 1], "int64", PLAIN, 8),
    ([2**64 - 1, 0, 2**63], "uint64", PLAIN, 8),
    ([2**64 - 1, 0, 17], "uint64", DELTA, 1),  # steps 1 and 17, modulo 2^64
    ([3, 1, 2], "int8", PLAIN, 1),
    ([True, False, True], "bool", BITS, 1),
    ([1.5, -2.0], "float64", BSS, 8),
    (["a", "bb", "ccc"], "string", PLAIN_VAR, 0),
    ([b"\x00" * 16], "uuid", PLAIN, 16),
])
def test_each_encoding(values, type_text, encoding, width):
    raw, t = _page(values, type_text)
    assert (raw[8], raw[9]) == (encoding, width)  # the first stream's header
    assert decode_page(raw, t).equals(pa.array(values, t.arrow()))


def test_delta_and_for_wrap_at_64_bits():
    """Offsets and steps are modular: the extremes of int64 and uint64 round-trip."""
    for vals, tt in [([2**63 - 1, -(2**63), 2**63 - 1, -(2**63)], "int64"), ([0, 2**64 - 1] * 3, "uint64"),
                     ([-(2**63) + 5, -(2**63) + 6, -(2**63) + 7], "int64")]:
        raw, t = _page(vals, tt)
        assert decode_page(raw, t).to_pylist() == vals


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_values(SCHEMA), max_size=50), cut=st.integers(0, 10))
def test_every_type_round_trips_against_arrow(rows, cut):
    """Every column type, with nulls, empty pages and sliced arrays: what the page decodes to
    equals the Arrow array it was written from."""
    batch = pa.Table.from_pylist(rows, schema=SCHEMA.arrow()).combine_chunks()
    for col in SCHEMA.columns:
        arr = batch.column(col.name).combine_chunks() if batch.num_rows else pa.array([], col.type.arrow())
        arr = arr.slice(min(cut, len(arr)))  # an offset into the buffers
        got = decode_page(encode_page(arr, col.type), col.type)
        assert got.type == arr.type and got.to_pylist() == arr.to_pylist(), col.name


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_values(SCHEMA), max_size=60), pick=st.lists(st.integers(0, 59), max_size=12),
       repeat=st.booleans())
def test_some_rows_of_a_page_equal_the_page_taken(rows, pick, repeat):
    """``decode_page_rows`` (a point read's one value) equals the whole page decoded and taken,
    for every column type and encoding (repeated values: dictionaries, frames of reference)."""
    if repeat:
        rows = (rows * 8)[:60]
    batch = pa.Table.from_pylist(rows, schema=SCHEMA.arrow()).combine_chunks()
    want = np.array(sorted({i for i in pick if i < batch.num_rows}), np.int64)
    for col in SCHEMA.columns:
        arr = batch.column(col.name).combine_chunks() if batch.num_rows else pa.array([], col.type.arrow())
        page = encode_page(arr, col.type)
        got = decode_page_rows(page, col.type, want)
        assert got.type == arr.type and got.to_pylist() == decode_page(page, col.type).take(want).to_pylist(), col.name


def test_a_row_past_the_page_or_a_damaged_page_is_corruption():
    raw, t = _page(list(range(100)), "int32")
    with pytest.raises(ColumnCorruptionError, match="no row 100"):
        decode_page_rows(raw, t, np.array([3, 100]))
    with pytest.raises(ColumnCorruptionError):
        decode_page_rows(raw[:-3], t, np.array([3]))
    assert decode_page_rows(raw, t, np.array([0, 99])).to_pylist() == [0, 99]


def test_nan_and_negative_zero_keep_their_bits():
    raw, t = _page([float("nan"), -0.0, 0.0, float("inf")], "float64")
    got = decode_page(raw, t).to_numpy()
    assert got.view(np.uint64).tolist() == np.array([float("nan"), -0.0, 0.0, float("inf")]).view(np.uint64).tolist()


def test_all_null_and_empty():
    raw, t = _page([None, None, None], "string")
    assert decode_page(raw, t).to_pylist() == [None] * 3
    raw, t = _page([], "point")
    assert len(decode_page(raw, t)) == 0


@pytest.mark.parametrize("type_text, values", [("int64", [1, 2, 300]), ("string", ["a", "b", "a", "a"]),
                                              ("float32", [1.0, 2.0]), ("range<int64>", [None])])
def test_a_damaged_page_is_corruption_naming_where(type_text, values):
    """Truncated, extended, or with a stream header changed: a ColumnCorruptionError naming the
    segment and column the caller passed, never a wrong array or a numpy error."""
    raw, t = _page(values, type_text)
    h = 8 + ((len(values) + 7) // 8 if raw[4] & 1 else 0)  # the first stream's header
    bad = [raw[:-1], raw + b"\0", raw[: h + 1] + bytes([raw[h + 1] ^ 0x40]) + raw[h + 2 :],
           raw[:h] + b"\x09" + raw[h + 1 :], bytes([raw[0] + 1]) + raw[1:]]
    for b in bad:
        with pytest.raises(ColumnCorruptionError) as ei:
            decode_page(b, t, "objects/x segment 5 column id 3", 4096)
        assert ei.value.where == "objects/x segment 5 column id 3" and ei.value.offset >= 4096


def test_a_dictionary_index_past_the_dictionary_is_refused():
    raw, t = _page(["a", "b", "a", "a"], "string")
    assert raw[8] == DICT
    bad = raw[:-1] + b"\x07"
    with pytest.raises(ColumnCorruptionError, match="dictionary index"):
        decode_page(bad, t, "w")


def test_all_types_listed():
    assert len(SCHEMA.columns) == len(ALL.split(","))
