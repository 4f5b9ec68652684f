"""Write-ahead records of an active segment (docs/format/segment.md §2).

A batch is framed ``BATCH … COMMIT`` and written as one TerrascaleFS append
(an atomic write group); a prepared batch too large to hold is ``PIECE X``… then
``COMMIT X`` (log version 2). :class:`WalReader` parses the file's logical bytes
as they stream in (records may span blocks) and yields only committed
batches; a batch without its COMMIT is dropped.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

import numba
import numpy as np
import numpy.typing as npt

from rowstore.errors import RowCorruptionError
from terrafs.abc import Buffer

REC = struct.Struct("<BBHI")  # kind, reserved, reserved, body length — part of the format
BATCH_HEAD = struct.Struct("<QQI")  # txn id, commit_ts, row count
U64 = struct.Struct("<Q")


class RecordKind(enum.IntEnum):
    BATCH = 1
    COMMIT = 2
    PROGRESS = 3
    CHECKPOINT = 4
    OPAQUE = 5
    PIECE = 6  # one piece of a prepared batch written in pieces (log version 2)


def frame(kind: RecordKind, body: bytes | memoryview) -> bytes:
    return REC.pack(int(kind), 0, 0, len(body)) + bytes(body)


DECIDED = 1 << 63  # txn ids with this bit are decided in the catalog (RFC 0003; part of the format)
# ... and with this one too, the batch spans nodes (RFC 0010): recovery must not delete its
# decision, another node's share may still need it (part of the format)
SPANS_NODES = 1 << 62


def batch_parts(txn: int, commit_ts: int, nrows: int, bufs: list[np.ndarray],
                commit: bool = True, piece: bool = False) -> tuple[list[Buffer], int]:
    """``BATCH`` (+ ``COMMIT`` unless a prepare; ``piece``: a ``PIECE``, never with its
    ``COMMIT``) for one append, as buffers to write one after the other (the rows are not
    copied here); also the offset of the first row."""
    head = BATCH_HEAD.pack(txn, commit_ts, nrows)
    size = sum(b.shape[0] for b in bufs)
    kind = RecordKind.PIECE if piece else RecordKind.BATCH
    commit = commit and not piece
    parts: list[Buffer] = [REC.pack(int(kind), 0, 0, len(head) + size) + head,
                          *(np.ascontiguousarray(b).data for b in bufs)]
    if commit:
        parts.append(commit_bytes(txn))
    return parts, REC.size + BATCH_HEAD.size


def commit_bytes(txn: int) -> bytes:
    return frame(RecordKind.COMMIT, U64.pack(txn))


@numba.njit(cache=True, nogil=True)
def row_offsets(buf: npt.NDArray[np.uint8], start: int, n: int, end: int) -> npt.NDArray[np.int64]:
    """Offsets of ``n`` consecutive rows from ``start``; -1 if a length runs past ``end``."""
    out = np.empty(n, np.int64)
    pos = start
    for i in range(n):
        if pos + 4 > end:
            out[0] = -1
            return out
        ln = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16) | (np.int64(buf[pos + 3]) << 24)
        if ln < 17 or pos + ln > end:
            out[0] = -1
            return out
        out[i] = pos
        pos += ln
    if pos != end:
        out[0] = -1
    return out


@dataclass
class CommittedBatch:
    txn: int
    commit_ts: int
    rows: np.ndarray  # uint8 bytes of the rows
    starts: np.ndarray  # int64 offsets of rows within ``rows``
    file_offset: int  # logical file offset of ``rows[0]``


@dataclass
class WalState:
    """What recovery learns besides the batches."""

    closed_ts: int = 0
    checkpoints: list[tuple[int, int]] = field(default_factory=list)  # (id, file offset)
    dropped: int = 0  # batches without COMMIT (a batch in pieces counts once)
    # the last batch, if it has no COMMIT (recovery decides): one BATCH, or every PIECE of one txn
    trailing: list[CommittedBatch] = field(default_factory=list)


class WalReader:
    """Incremental parser: feed logical bytes in order, collect committed batches."""

    def __init__(self, where: str):
        self.where = where
        self._buf = bytearray()
        self._base = 0  # file offset of _buf[0]
        # the open batch: one BATCH, or the PIECEs of one txn so far (``_pieced``); each
        # (txn, ts, n, rows, offset)
        self._open: list[tuple[int, int, int, bytes, int]] = []
        self._pieced = False
        self.state = WalState()

    def feed(self, data: bytes) -> list[CommittedBatch]:
        self._buf += data
        out, pos = [], 0
        with memoryview(self._buf) as mv:  # released before the buffer is resized
            while len(mv) - pos >= REC.size:
                kind, _a, _b, blen = REC.unpack_from(mv, pos)
                if len(mv) - pos - REC.size < blen:
                    break
                out += self._record(kind, mv[pos + REC.size : pos + REC.size + blen], self._base + pos)
                pos += REC.size + blen
        del self._buf[:pos]
        self._base += pos
        return out

    def _record(self, kind: int, body: memoryview, at: int) -> list[CommittedBatch]:
        if kind in (RecordKind.BATCH, RecordKind.PIECE):
            txn, ts, n = BATCH_HEAD.unpack_from(body, 0)
            piece = kind == RecordKind.PIECE
            if self._open and not (piece and self._pieced and self._open[0][0] == txn):
                self.state.dropped += 1  # the previous batch never committed
                self._open = []
            if self._open and self._open[0][1] != ts:
                raise RowCorruptionError(self.where, at, f"pieces of txn {txn} at two commit timestamps")
            self._pieced = piece
            self._open.append((txn, ts, n, bytes(body[BATCH_HEAD.size :]), at + REC.size + BATCH_HEAD.size))
        elif kind == RecordKind.COMMIT:
            (txn,) = U64.unpack_from(body, 0)
            if not self._open or self._open[0][0] != txn:
                raise RowCorruptionError(self.where, at, f"COMMIT of txn {txn} without its BATCH")
            return self._take_open()
        elif kind == RecordKind.PROGRESS:
            self.state.closed_ts = max(self.state.closed_ts, U64.unpack_from(body, 0)[0])
        elif kind == RecordKind.CHECKPOINT:
            self.state.checkpoints.append((U64.unpack_from(body, 0)[0], at))
        elif kind != RecordKind.OPAQUE:
            raise RowCorruptionError(self.where, at, f"unknown write-ahead record kind {kind}")
        return []

    def _take_open(self) -> list[CommittedBatch]:
        out = [self._batch(*o) for o in self._open]
        self._open = []
        return out

    def _batch(self, txn: int, ts: int, n: int, rows: bytes, off: int) -> CommittedBatch:
        arr = np.frombuffer(rows, np.uint8)
        starts = row_offsets(arr, 0, n, arr.shape[0]) if n else np.zeros(0, np.int64)
        if n and starts[0] < 0:
            raise RowCorruptionError(self.where, off, f"rows of txn {txn} do not add up to the batch")
        return CommittedBatch(txn, ts, arr, starts, off)

    def finish(self) -> None:
        """End of file: an open batch never committed (kept in ``state.trailing`` so recovery can
        ask the catalog about a decided txn); a partial record is corruption."""
        if self._open:
            self.state.dropped += 1
            self.state.trailing = self._take_open()
        if self._buf:
            raise RowCorruptionError(self.where, self._base, "partial write-ahead record at the end")
