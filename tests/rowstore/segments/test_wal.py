"""Write-ahead records: committed batches replay, a batch without COMMIT is dropped."""
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
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
    return encode_rows(pa.record_batch({"id": pa.array(range(lo, hi), pa.int64()),
                                        "v": pa.array([str(i) for i in range(lo, hi)], pa.string())}), S, 9)


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


def piece_bytes(txn, ts, buf, n):
    parts, _ = batch_parts(txn, ts, n, [buf], piece=True)
    return b"".join(bytes(p) for p in parts)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["batch", "commit", "drop"]), st.lists(st.integers(0, 3), min_size=1,
                                                                                  max_size=4)), max_size=8),
       st.integers(1, 97), st.booleans())
def test_pieces_replay_as_one_batch_or_not_at_all(ops, cut, open_end):
    """Log version 2 against a model: a batch in pieces commits every piece at its COMMIT and
    drops every piece without one, however the stream is cut; ``trailing`` holds every piece
    of a txn left open at the end."""
    stream, want, dropped, lo, txn, trail = b"", [], 0, 0, 1 << 63, []
    ops = ops + ([("open", [2, 0, 1])] if open_end else [])
    for kind, sizes in ops:
        txn += 1
        if kind == "batch":  # a plain committed batch (one record, its COMMIT in the same append)
            stream += batch_bytes(txn, 5, sizes[0], rows(lo, lo + sizes[0]).buf)[0]
            want.append((txn, list(range(lo, lo + sizes[0]))))
            lo += sizes[0]
            trail = []
            continue
        got = []
        for n in sizes:
            stream += piece_bytes(txn, 7, rows(lo, lo + n).buf, n)
            got.append((txn, list(range(lo, lo + n))))
            lo += n
        trail = [] if kind == "commit" else [txn] * len(sizes)  # left open: the end holds it
        if kind == "commit":
            stream += frame(RecordKind.COMMIT, U64.pack(txn))
            want += got
        else:
            dropped += 1
    r, out = WalReader("wal"), []
    for i in range(0, len(stream), cut):
        out += r.feed(stream[i : i + cut])
    r.finish()
    assert _decoded(out) == want
    assert r.state.dropped == dropped
    assert [b.txn for b in r.state.trailing] == trail


def _decoded(batches):
    from rowstore.codec.rows import decode_row_list
    out = []
    for b in batches:
        raws = [b.rows[s : e].tobytes() for s, e in zip(b.starts, list(b.starts[1:]) + [len(b.rows)])]
        out.append((b.txn, decode_row_list(raws, lambda v: S, S, "wal").batch.column("id").to_pylist()
                    if raws else []))
    return out


def test_a_piece_of_another_txn_or_a_batch_drops_the_open_pieces():
    a = piece_bytes((1 << 63) | 1, 5, rows(0, 2).buf, 2)
    b = piece_bytes((1 << 63) | 2, 5, rows(2, 3).buf, 1)
    c, _ = batch_bytes(3, 6, 1, rows(3, 4).buf)
    r = WalReader("wal")
    got = r.feed(a + b + c)
    r.finish()
    assert [x.txn for x in got] == [3] and r.state.dropped == 2 and r.state.trailing == []
    with pytest.raises(RowCorruptionError, match="two commit timestamps"):
        WalReader("wal").feed(a + piece_bytes((1 << 63) | 1, 6, rows(5, 6).buf, 1))
    with pytest.raises(RowCorruptionError, match="without its BATCH"):  # a COMMIT of other pieces
        WalReader("wal").feed(a + frame(RecordKind.COMMIT, U64.pack(2)))
