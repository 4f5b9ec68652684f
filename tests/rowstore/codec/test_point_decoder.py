"""The scalar point-read paths equal the vectorized ones: row decode, key encoding, partition."""
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rowstore.errors import RowCorruptionError
from rowstore.tables.keys import encode_keys, encode_one, partition_of, partition_one
from rowstore.codec.point_decoder import decode_one
from rowstore.codec.rows import decode_rows, encode_rows
from tests.rowstore.codec.test_rows import SCHEMA, _values


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_values(SCHEMA), min_size=1, max_size=10))
def test_decode_one_equals_vectorized_decode(rows):
    table = pa.Table.from_pylist(rows, schema=SCHEMA.arrow())
    enc = encode_rows(table, SCHEMA, 9)
    want = decode_rows(enc.buf, enc.starts, lambda v: SCHEMA, SCHEMA).batch.to_pylist()
    ends = np.append(enc.starts[1:], enc.nbytes)
    for i, (a, b) in enumerate(zip(enc.starts, ends)):
        assert decode_one(enc.buf[a:b].tobytes(), lambda v: SCHEMA, SCHEMA) == want[i]


def test_decode_one_across_schema_versions():
    v1 = SCHEMA
    v2 = v1.drop_column("k").add_column("k", "int32").rename_column("a", "a2")
    row = {c.name: None for c in v1.columns} | {"id": 5, "a": 3, "k": "old"}
    enc = encode_rows(pa.Table.from_pylist([row], schema=v1.arrow()), v1, 1)
    raw = enc.buf.tobytes()
    got = decode_one(raw, {v1.version: v1, v2.version: v2}.__getitem__, v2)
    want = decode_rows(enc.buf, enc.starts, {v1.version: v1, v2.version: v2}.__getitem__, v2).batch.to_pylist()[0]
    assert got == want and got["a2"] == 3 and got["k"] is None
    with pytest.raises(RowCorruptionError):
        decode_one(raw[:-1], lambda v: v1, v1)


@settings(deadline=None)  # the first example compiles the numba partition kernel
@given(keys=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=50), parts=st.integers(1, 64))
def test_scalar_int_keys_match(keys, parts):
    enc = encode_keys(pa.array(keys, pa.int64()), "int64")
    assert [encode_one(k, "int64") for k in keys] == enc.tolist()
    assert [partition_one(encode_one(k, "int64"), parts) for k in keys] == partition_of(enc, parts).tolist()


@settings(deadline=None)
@given(keys=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                             max_size=40), min_size=1,
                     max_size=30), parts=st.integers(1, 64))
def test_scalar_string_keys_match(keys, parts):
    enc = encode_keys(pa.array(keys, pa.string()), "string")
    assert [encode_one(k, "string") for k in keys] == enc.tolist()
    assert [partition_one(encode_one(k, "string"), parts) for k in keys] == partition_of(enc, parts).tolist()


@given(keys=st.lists(st.uuids(), min_size=1, max_size=30), parts=st.integers(1, 64))
def test_scalar_uuid_keys_match(keys, parts):
    raw = [u.bytes for u in keys] + [uuid.UUID(int=1 << 8).bytes]  # trailing zero bytes included
    enc = encode_keys(pa.array(raw, pa.binary(16)), "uuid")
    assert [partition_one(encode_one(k, "uuid"), parts) for k in raw] == partition_of(enc, parts).tolist()
