"""Incoming rows: regrouping encoded rows by partition equals encoding each group."""
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rowstore.rowcodec import decode_rows, encode_rows
from rowstore.table_io import split_encoded
from tests.rowstore.test_rowcodec import SCHEMA, _values


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_values(SCHEMA), min_size=1, max_size=30), parts=st.integers(1, 5), seed=st.integers(0, 99))
def test_split_encoded_equals_encoding_each_piece(rows, parts, seed):
    table = pa.Table.from_pylist(rows, schema=SCHEMA.arrow())
    pids = np.random.default_rng(seed).integers(0, parts, len(rows))
    order = np.argsort(pids, kind="stable")
    counts = [int(c) for c in np.bincount(pids) if c]
    pieces = split_encoded(encode_rows(table, SCHEMA, 5), order, counts)
    at = 0
    for piece, n in zip(pieces, counts):
        want = encode_rows(table.take(pa.array(order[at : at + n])), SCHEMA, 5)
        assert piece.buf.tobytes() == want.buf.tobytes() and piece.starts.tolist() == want.starts.tolist()
        got = decode_rows(piece.buf, piece.starts, lambda v: SCHEMA, SCHEMA).batch
        assert got.to_pylist() == table.take(pa.array(order[at : at + n])).to_pylist()
        at += n
