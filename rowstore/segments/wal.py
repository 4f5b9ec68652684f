"""Write-ahead records of an active segment (docs/format/segment.md §2).

A batch is framed ``BATCH … COMMIT`` and written as one TerrascaleFS append
(an atomic write group). :class:`WalReader` parses the file's logical bytes
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


def frame(kind: RecordKind, body: bytes | memoryview) -> bytes:
    return REC.pack(int(kind), 0, 0, len(body)) + bytes(body)


DECIDED = 1 << 63  # txn ids with this bit are decided in the catalog (RFC 0003; part of the format)
# ... and with this one too, the batch spans nodes (RFC 0010): recovery must not delete its
# decision, another node's share may still need it (part of the format)
SPANS_NODES = 1 << 62


def batch_parts(txn: int, commit_ts: int, nrows: int, bufs: list[np.ndarray],
                commit: bool = True) -> tuple[list[Buffer], int]:
    """``BATCH`` (+ ``COMMIT`` unless a prepare) for one append, as buffers to write one after
    the other (the rows are not copied here); also the offset of the first row."""
    head = BATCH_HEAD.pack(txn, commit_ts, nrows)
    size = sum(b.shape[0] for b in bufs)
    parts: list[Buffer] = [REC.pack(int(RecordKind.BATCH), 0, 0, len(head) + size) + head,
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
    dropped: int = 0  # batches without COMMIT
    trailing: CommittedBatch | None = None  # the last batch, if it has no COMMIT (recovery decides)


class WalReader:
    """Incremental parser: feed logical bytes in order, collect committed batches."""

    def __init__(self, where: str):
        self.where = where
        self._buf = bytearray()
        self._base = 0  # file offset of _buf[0]
        self._open: tuple[int, int, int, bytes, int] | None = None  # txn, ts, n, rows, offset
        self.state = WalState()

    def feed(self, data: bytes) -> list[CommittedBatch]:
        self._buf += data
        out, pos = [], 0
        with memoryview(self._buf) as mv:  # released before the buffer is resized
            while len(mv) - pos >= REC.size:
                kind, _a, _b, blen = REC.unpack_from(mv, pos)
                if len(mv) - pos - REC.size < blen:
                    break
                got = self._record(kind, mv[pos + REC.size : pos + REC.size + blen], self._base + pos)
                if got is not None:
                    out.append(got)
                pos += REC.size + blen
        del self._buf[:pos]
        self._base += pos
        return out

    def _record(self, kind: int, body: memoryview, at: int) -> CommittedBatch | None:
        if kind == RecordKind.BATCH:
            if self._open is not None:
                self.state.dropped += 1  # the previous batch never committed
            txn, ts, n = BATCH_HEAD.unpack_from(body, 0)
            self._open = (txn, ts, n, bytes(body[BATCH_HEAD.size :]), at + REC.size + BATCH_HEAD.size)
        elif kind == RecordKind.COMMIT:
            (txn,) = U64.unpack_from(body, 0)
            if self._open is None or self._open[0] != txn:
                raise RowCorruptionError(self.where, at, f"COMMIT of txn {txn} without its BATCH")
            return self._commit(at)
        elif kind == RecordKind.PROGRESS:
            self.state.closed_ts = max(self.state.closed_ts, U64.unpack_from(body, 0)[0])
        elif kind == RecordKind.CHECKPOINT:
            self.state.checkpoints.append((U64.unpack_from(body, 0)[0], at))
        elif kind != RecordKind.OPAQUE:
            raise RowCorruptionError(self.where, at, f"unknown write-ahead record kind {kind}")
        return None

    def _commit(self, at: int | None) -> CommittedBatch:
        assert self._open is not None  # callers have a BATCH open
        txn, ts, n, rows, off = self._open
        self._open = None
        arr = np.frombuffer(rows, np.uint8)
        starts = row_offsets(arr, 0, n, arr.shape[0]) if n else np.zeros(0, np.int64)
        if n and starts[0] < 0:
            raise RowCorruptionError(self.where, off, f"rows of txn {txn} do not add up to the batch")
        return CommittedBatch(txn, ts, arr, starts, off)

    def finish(self) -> None:
        """End of file: an open batch never committed (kept in ``state.trailing`` so recovery can
        ask the catalog about a decided txn); a partial record is corruption."""
        if self._open is not None:
            self.state.dropped += 1
            self.state.trailing = self._commit(None)
        if self._buf:
            raise RowCorruptionError(self.where, self._base, "partial write-ahead record at the end")
