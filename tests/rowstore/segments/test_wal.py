"""Write-ahead records: committed batches replay, a batch without COMMIT is dropped."""
import pyarrow as pa
import pytest

from rowstore.errors import RowCorruptionError
from rowstore.codec.rows import encode_rows
from rowstore.schema import parse_schema
from rowstore.segments.wal import BATCH_HEAD, REC, U64, RecordKind, WalReader, batch_parts, frame

S = parse_schema("id int64 primary key, v string")


def batch_bytes(txn, ts, n, buf):
    parts, first = batch_parts(txn, ts, n, [buf[: len(buf) // 2], buf[len(buf) // 2 :]])  # rows may span buffers
    return b"".join(parts), first


def rows(lo, hi):
    return encode_rows(pa.record_batch({"id": list(range(lo, hi)), "v": [str(i) for i in range(lo, hi)]}), S, 9)


def test_replay_drops_uncommitted_and_keeps_the_rest():
    a, _ = batch_bytes(1, 10, 3, rows(0, 3).buf)
    enc = rows(3, 5)
    uncommitted = frame(RecordKind.BATCH, BATCH_HEAD.pack(2, 11, 2) + enc.buf.tobytes())
    c, first = batch_bytes(3, 12, 2, rows(5, 7).buf)
    stream = a + frame(RecordKind.PROGRESS, U64.pack(10)) + uncommitted + frame(RecordKind.OPAQUE, b"x") + c
    for cut in (1, 7, 64, len(stream)):  # any split into chunks parses the same
        r = WalReader("wal")
        got = []
        for i in range(0, len(stream), cut):
            got += r.feed(stream[i : i + cut])
        r.finish()
        assert [b.txn for b in got] == [1, 3] and r.state.dropped == 1 and r.state.closed_ts == 10
        assert [len(b.starts) for b in got] == [3, 2]
        assert got[1].file_offset == len(stream) - len(c) + first


def test_commit_without_batch_and_partial_record_are_corruption():
    with pytest.raises(RowCorruptionError, match="without its BATCH"):
        WalReader("wal").feed(frame(RecordKind.COMMIT, U64.pack(4)))
    r = WalReader("wal")
    a, _ = batch_bytes(1, 10, 3, rows(0, 3).buf)
    r.feed(a[:-3])
    with pytest.raises(RowCorruptionError, match="partial"):
        r.finish()
    bad = bytearray(a)
    bad[REC.size + BATCH_HEAD.size] = 5  # first row's length now too short
    with pytest.raises(RowCorruptionError, match="do not add up"):
        WalReader("wal").feed(bytes(bad))
