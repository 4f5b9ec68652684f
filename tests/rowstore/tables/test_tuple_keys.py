"""The tuple key encoding (docs/format/keys.md): known answers pin every tag, width, escape
and the partition hash; properties hold it to the key order for every component type."""
from __future__ import annotations

import datetime as dt
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rowstore.errors import InvalidKeyError
from rowstore.tables.keys import partition_of
from rowstore.tables.tuple_keys import (END, KINDS, MAX_KEY_BYTES, TAGS, decode_tuple, encode_tuple,
                                        encode_tuple_and_head, encode_tuples, prefix_end, prefix_heads)
from rowstore.types import TS, Kind

# (kinds, values, encoding): part of the format — a change here is a new format version
KNOWN = [
    ((Kind.INT64,), (0,), "14800000000000000001"),
    ((Kind.INT64,), (-1,), "147fffffffffffffff01"),
    ((Kind.INT8,), (-128,), "110001"),
    ((Kind.INT16,), (258,), "12810201"),
    ((Kind.INT32,), (-2,), "137ffffffe01"),
    ((Kind.UINT8,), (255,), "15ff01"),
    ((Kind.UINT16,), (1,), "16000101"),
    ((Kind.UINT32,), (7,), "170000000701"),
    ((Kind.UINT64,), (2**64 - 1,), "18ffffffffffffffff01"),
    ((Kind.BOOL,), (True,), "100101"),
    ((Kind.DATE,), (19_000,), "1980004a3801"),
    ((Kind.TIMESTAMP,), (1_700_000_000_000_000,), "1a80060a24181e400001"),
    ((Kind.STRING,), ("s42",), "2073343200" + "01"),
    ((Kind.STRING,), ("a\x00b",), "206100ff620001"),
    ((Kind.STRING,), ("",), "200001"),
    ((Kind.BINARY,), (b"\x00\xff",), "2100ffff0001"),
    ((Kind.UUID,), (bytes(range(16)),), "30000102030405060708090a0b0c0d0e0f01"),
    ((Kind.STRING, Kind.TIMESTAMP), ("s42", 1), "20733432001a800000000000000101"),
]
# (partition-key kinds, values, partitions, partition): the hash is part of the format too
KNOWN_PARTITIONS = [
    ((Kind.STRING,), ("s42",), 16, 9),
    ((Kind.STRING,), ("sensor-0001",), 16, 12),
    ((Kind.INT32,), (7,), 10, 6),
    ((Kind.STRING, Kind.UINT8), ("vehicle-9", 3), 64, 60),
]


@pytest.mark.parametrize(("kinds", "values", "hexed"), KNOWN)
def test_known_answers(kinds, values, hexed):
    assert encode_tuple(values, kinds).hex() == hexed
    assert decode_tuple(bytes.fromhex(hexed), kinds) == tuple(
        uuid.UUID(bytes=v) if k == Kind.UUID else v for k, v in zip(kinds, values))


def test_the_tags_and_the_end_byte():
    """Every tag sits between END and 0xFF, so a whole component is always followed by a byte
    below any escape, and a key never ends in 0x00."""
    assert END == 0x01 and all(END < t < 0xFF for t in TAGS.values()) and len(set(TAGS.values())) == len(TAGS)


def _fnv1a64(data: bytes) -> int:
    """The definition (docs/format/keys.md), written out: FNV-1a, 64 bits."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


@pytest.mark.parametrize(("kinds", "values", "parts", "pid"), KNOWN_PARTITIONS)
def test_known_partitions(kinds, values, parts, pid):
    """A key's partition: FNV-1a 64 of its partition key encoded as a key, modulo the table's
    partitions."""
    one = encode_tuple(values, kinds)
    assert _fnv1a64(one) % parts == pid
    arr = np.array([one], f"S{len(one)}")
    assert int(partition_of(arr, parts)[0]) == pid


# -- properties -------------------------------------------------------------------------------

_VALUE = {
    Kind.INT8: st.integers(-2**7, 2**7 - 1), Kind.INT16: st.integers(-2**15, 2**15 - 1),
    Kind.INT32: st.integers(-2**31, 2**31 - 1), Kind.INT64: st.integers(-2**63, 2**63 - 1),
    Kind.UINT8: st.integers(0, 2**8 - 1), Kind.UINT16: st.integers(0, 2**16 - 1),
    Kind.UINT32: st.integers(0, 2**32 - 1), Kind.UINT64: st.integers(0, 2**64 - 1),
    Kind.BOOL: st.booleans(), Kind.DATE: st.integers(-2**31, 2**31 - 1),
    Kind.TIMESTAMP: st.integers(-2**63, 2**63 - 1),
    Kind.STRING: st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(["", "\x00", "a\x00", "a"]),
    Kind.BINARY: st.binary(max_size=6) | st.sampled_from([b"", b"\x00", b"\x00\xff", b"\xff"]),
    Kind.UUID: st.binary(min_size=16, max_size=16),
}
_ARROW = {Kind.INT8: pa.int8(), Kind.INT16: pa.int16(), Kind.INT32: pa.int32(), Kind.INT64: pa.int64(),
          Kind.UINT8: pa.uint8(), Kind.UINT16: pa.uint16(), Kind.UINT32: pa.uint32(), Kind.UINT64: pa.uint64(),
          Kind.BOOL: pa.bool_(), Kind.DATE: pa.date32(), Kind.TIMESTAMP: TS, Kind.STRING: pa.string(),
          Kind.BINARY: pa.binary(), Kind.UUID: pa.binary(16)}


def _arrow(values, kind):
    if kind == Kind.DATE:
        return pa.array(values, pa.int32()).view(pa.date32())
    if kind == Kind.TIMESTAMP:
        return pa.array(values, pa.int64()).view(TS)
    return pa.array(values, _ARROW[kind])


@st.composite
def _tables(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS, key=lambda k: k.value)), min_size=1, max_size=3))
    rows = draw(st.lists(st.tuples(*[_VALUE[k] for k in kinds]), min_size=1, max_size=30))
    return tuple(kinds), rows


@settings(max_examples=300, deadline=None)
@given(_tables())
def test_byte_order_is_key_order_and_the_batch_encoder_agrees_with_the_scalar_one(table):
    kinds, rows = table
    one = [encode_tuple(r, kinds) for r in rows]
    many = encode_tuples([_arrow([r[i] for r in rows], k) for i, k in enumerate(kinds)], kinds)
    assert [bytes(x) for x in many] == one  # a numpy S array holds every key exactly (no trailing NUL)
    assert [rows[i] for i in np.argsort(many, kind="stable")] == sorted(rows)  # numpy's order too
    for a in range(len(rows)):
        for b in range(len(rows)):
            assert (one[a] < one[b]) == (rows[a] < rows[b]) and (one[a] == one[b]) == (rows[a] == rows[b])


@settings(max_examples=200, deadline=None)
@given(_tables())
def test_round_trip_and_prefixes(table):
    kinds, rows = table
    for r in rows:
        enc = encode_tuple(r, kinds)
        assert decode_tuple(enc, kinds) == tuple(uuid.UUID(bytes=v) if k == Kind.UUID else v
                                                 for k, v in zip(kinds, r))
        for n in range(len(kinds) + 1):  # every leading run of components bounds the key
            p = encode_tuple(r[:n], kinds[:n], end=False)
            assert enc.startswith(p) and p <= enc < prefix_end(p)
        for other in rows:  # and only the keys that start with those components
            p = encode_tuple(other[:1], kinds[:1], end=False)
            assert (p <= enc < prefix_end(p)) == (r[:1] == other[:1])
        assert not any(encode_tuple(o, kinds) != enc and encode_tuple(o, kinds).startswith(enc) for o in rows)


def test_a_key_over_the_limit_is_refused_by_both_encoders():
    big = "x" * MAX_KEY_BYTES
    with pytest.raises(InvalidKeyError, match="key limit"):
        encode_tuple((big,), (Kind.STRING,))
    with pytest.raises(InvalidKeyError, match="key limit"):
        encode_tuples([pa.array([big])], [Kind.STRING])


def test_bytes_that_are_not_an_encoding_are_refused():
    for bad, kinds in [("14800000", (Kind.INT64,)), ("20616201", (Kind.STRING,)), ("1401", (Kind.INT64,)),
                       ("2061000101", (Kind.STRING,))]:
        with pytest.raises(ValueError):
            decode_tuple(bytes.fromhex(bad), kinds)


def test_dates_and_timestamps_encode_their_integers():
    day = dt.date(2022, 1, 8)
    days = (day - dt.date(1970, 1, 1)).days
    arr = pa.array([day], pa.date32())
    assert bytes(encode_tuples([arr], [Kind.DATE])[0]) == encode_tuple((days,), (Kind.DATE,))


@settings(max_examples=200, deadline=None)
@given(_tables(), st.integers(1, 3))
def test_a_key_and_its_head_encoded_once_are_the_two_encodings(table, n):
    """``encode_tuple_and_head``: the key, and its first n components as a key of their own
    (the partition hash's input), as the two separate encodings give them."""
    kinds, rows = table
    n = min(n, len(kinds))
    for r in rows:
        assert encode_tuple_and_head(r, kinds, n) == (encode_tuple(r, kinds), encode_tuple(r[:n], kinds[:n]))


@settings(max_examples=200, deadline=None)
@given(_tables())
def test_prefix_heads_start_each_run_of_equal_leading_components(table):
    kinds, rows = table
    rows = sorted(set(rows))
    many = encode_tuples([_arrow([r[i] for r in rows], k) for i, k in enumerate(kinds)], kinds)
    order = np.argsort(many, kind="stable")
    keys, ordered = many[order], [rows[i] for i in order]
    for n in range(len(kinds)):
        want = [i for i in range(len(ordered)) if i == 0 or ordered[i][:n] != ordered[i - 1][:n]]
        assert prefix_heads(keys, n).tolist() == want
