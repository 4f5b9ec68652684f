"""Golden logs of both write-ahead versions (docs/format/segment.md §2): the bytes today's
writer makes for a fixed history are the files kept in ``golden/`` (a known-answer test of the
record layout and its constants), and the reader replays from each exactly the batches its
``.json`` lists. Regenerate (only for a new version, never to make a test pass):
``python -m tests.rowstore.segments.test_wal_golden``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from rowstore.codec.rows import decode_row_list, encode_rows
from rowstore.schema import parse_schema
from rowstore.segments.wal import BATCH_HEAD, DECIDED, REC, SPANS_NODES, U64, RecordKind, WalReader, batch_parts, \
    frame

HERE = Path(__file__).parent / "golden"
S = parse_schema("id int64 primary key, v string")


def _rows(lo: int, hi: int, ts: int, deleted: bool = False):
    b = pa.record_batch({"id": pa.array(range(lo, hi), pa.int64()), "v": pa.array([f"r{i}" for i in range(lo, hi)])})
    return encode_rows(b, S, ts, None if not deleted else [True] * (hi - lo))


def _rec(txn: int, ts: int, lo: int, hi: int, commit: bool = True, piece: bool = False, deleted: bool = False):
    parts, _ = batch_parts(txn, ts, hi - lo, [_rows(lo, hi, ts, deleted).buf], commit=commit, piece=piece)
    return b"".join(bytes(p) for p in parts)


def v1() -> bytes:
    """Version 1: a batch, progress, a dropped batch, an opaque record, a decided batch prepared
    then committed, a checkpoint mark."""
    x = DECIDED | SPANS_NODES | 0xABCDEF
    return (_rec(1, 100, 0, 3) + frame(RecordKind.PROGRESS, U64.pack(100)) + _rec(2, 101, 3, 5, commit=False)
            + frame(RecordKind.OPAQUE, b"caller") + _rec(x, 102, 5, 7, commit=False)
            + frame(RecordKind.COMMIT, U64.pack(x)) + frame(RecordKind.CHECKPOINT, U64.pack(9)))


def v2() -> bytes:
    """Version 2: version 1's history, then a delete in three pieces committed, a batch, and a
    batch in two pieces left open at the end (recovery asks the catalog about it)."""
    x, y = DECIDED | 0x51, DECIDED | SPANS_NODES | 0x52
    return (v1() + _rec(x, 103, 0, 2, piece=True, deleted=True) + _rec(x, 103, 2, 3, piece=True, deleted=True)
            + _rec(x, 103, 5, 6, piece=True, deleted=True) + frame(RecordKind.COMMIT, U64.pack(x))
            + _rec(3, 104, 10, 11) + _rec(y, 105, 20, 22, piece=True) + _rec(y, 105, 22, 23, piece=True))


def replay(data: bytes) -> dict:
    r = WalReader("golden")
    got = r.feed(data)
    r.finish()

    def rows(b):
        raws = [b.rows[s:e].tobytes() for s, e in zip(b.starts.tolist(), b.starts.tolist()[1:] + [len(b.rows)])]
        d = decode_row_list(raws, lambda v: S, S, "golden")
        return {"txn": f"{b.txn:016x}", "commit_ts": b.commit_ts, "ids": d.batch.column("id").to_pylist(),
                "deleted": [bool(x) for x in d.deleted], "file_offset": b.file_offset}
    return {"batches": [rows(b) for b in got], "dropped": r.state.dropped, "closed_ts": r.state.closed_ts,
            "checkpoints": r.state.checkpoints, "trailing": [rows(b) for b in r.state.trailing]}


CASES = {"wal-v1": v1, "wal-v2-pieces": v2}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_writer_makes_the_golden_bytes_and_the_reader_replays_them(name):
    data = (HERE / f"{name}.log").read_bytes()
    assert CASES[name]() == data, f"the writer no longer makes golden/{name}.log: a format change needs a version"
    want = json.loads((HERE / f"{name}.json").read_text())
    got = json.loads(json.dumps(replay(data)))
    assert got == want


def test_the_constants_of_the_record_layout():
    assert [int(k) for k in RecordKind] == [1, 2, 3, 4, 5, 6]
    assert (REC.size, BATCH_HEAD.size, DECIDED, SPANS_NODES) == (8, 20, 1 << 63, 1 << 62)
    piece = _rec(DECIDED | 1, 7, 0, 1, piece=True)
    assert piece[:4] == bytes([6, 0, 0, 0]) and piece[8:16] == (DECIDED | 1).to_bytes(8, "little")
    assert _rec(1, 7, 0, 1, commit=False)[0] == 1


def test_a_record_kind_of_a_later_version_is_refused_not_skipped():
    """As a version-1 reader refused kind 6 (its kinds stopped at 5), this one refuses kind 7:
    a node of an older release never replays part of a newer log."""
    from rowstore.errors import RowCorruptionError
    with pytest.raises(RowCorruptionError, match="unknown write-ahead record kind 7"):
        WalReader("old").feed(v1() + REC.pack(7, 0, 0, 8) + U64.pack(1))


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    for n, make in CASES.items():
        (HERE / f"{n}.log").write_bytes(make())
        (HERE / f"{n}.json").write_text(json.dumps(replay(make()), indent=1) + "\n")
        print(f"wrote golden/{n}.log and .json", file=sys.stderr)
