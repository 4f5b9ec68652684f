"""Incoming rows: a batch split by partition equals encoding each partition's rows."""
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rowstore.codec.rows import decode_rows, encode_rows
from rowstore.tables.conform import split_by_partition
from tests.rowstore.codec.test_rows import SCHEMA, _values


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_values(SCHEMA), min_size=1, max_size=30), parts=st.integers(1, 5), seed=st.integers(0, 99),
       with_deleted=st.booleans())
def test_split_by_partition_equals_encoding_each_piece(rows, parts, seed, with_deleted):
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA.arrow())
    rng = np.random.default_rng(seed)
    pids = rng.integers(0, parts, len(rows))
    keys = rng.permutation(len(rows)).astype(np.uint64)  # distinct, as after last-wins
    deleted = rng.random(len(rows)) < 0.3 if with_deleted else None
    keep = [SCHEMA.columns[0].name]
    pieces = split_by_partition(batch, SCHEMA, keys, deleted, pids, keep)
    assert [p.pid for p in pieces] == sorted(set(pids.tolist()))
    for piece in pieces:
        mine = np.flatnonzero(pids == piece.pid)
        mine = mine[np.argsort(keys[mine])]  # key order within the partition
        want = encode_rows(batch.take(pa.array(mine)), SCHEMA, 0, None if deleted is None else deleted[mine])
        assert piece.enc.buf.tobytes() == want.buf.tobytes() and piece.enc.starts.tolist() == want.starts.tolist()
        assert piece.keys.tolist() == keys[mine].tolist()
        rows = piece.batch if piece.pos is None else piece.batch.take(pa.array(piece.pos))
        assert rows.to_pylist() == batch.select(keep).take(pa.array(mine)).to_pylist()
        assert (piece.deleted is None) == (deleted is None)
        if deleted is not None:
            assert piece.deleted.tolist() == deleted[mine].tolist()
        got = decode_rows(piece.enc.buf, piece.enc.starts, lambda v: SCHEMA, SCHEMA).batch
        assert got.num_rows == len(mine)
