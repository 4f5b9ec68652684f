"""Active segments: the write-ahead log of a table partition, on a TerrascaleFS active file.

Rows are appended in atomic batches; an append returns rowids only after the
group-commit flush made the batch durable. localids are implicit in row
order; the localid -> file offset index lives in memory in a growing numpy
array and is rebuilt by scanning the file at recovery (docs/format/segment.md §2).
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pyarrow as pa

from rowstore.errors import RowstoreError
from rowstore.codec.rows import Decoded, Encoded, EncodedParts, decode_row_list, encode_rows
from rowstore.schema import SchemaVersion
from rowstore.segments.wal import (DECIDED, CommittedBatch, RecordKind, WalReader, WalState, batch_parts, commit_bytes,
                                   frame, U64)
from rowstore.rowids import rowids, split_rowids
from terrafs.active import ActiveFile

_ROW_READ = 512  # bytes read for a point get before the row's length is known


class _Offsets:
    """localid -> logical file offset, in a numpy array that doubles as it grows."""

    def __init__(self) -> None:
        self.arr = np.zeros(1024, np.int64)
        self.lens = np.zeros(1024, np.int32)

    def put(self, base: int, offs: np.ndarray, lens: np.ndarray) -> None:
        need = base + len(offs)
        if need > len(self.arr):
            cap = max(need, 2 * len(self.arr))
            self.arr, self.lens = _grown(self.arr, cap), _grown(self.lens, cap)
        self.arr[base:need] = offs
        self.lens[base:need] = lens


def _grown(a: np.ndarray, cap: int) -> np.ndarray:
    """``a`` with room for ``cap`` entries (np.resize would also fill the new room)."""
    out = np.empty(cap, a.dtype)
    out[: len(a)] = a
    return out


class ActiveSegment:
    def __init__(self, segid: int, file: ActiveFile, where: str):
        self.segid, self.file, self.where = segid, file, where
        self.seq = 0  # its position among the partition's segments (set by the store)
        self._idx = _Offsets()
        self._next = 0  # next localid to hand out (call order = file order)
        self.durable_rows = 0
        self.min_ts: int | None = None
        self.max_ts: int | None = None
        self.wal = WalState()
        self._txns = itertools.count(1)

    @property
    def nbytes(self) -> int:
        return self.file.durable_size

    # -- writes ----------------------------------------------------------------------

    async def append(self, batch: pa.RecordBatch, schema: SchemaVersion, commit_ts: int,
                     deleted: np.ndarray | None = None) -> np.ndarray:
        """Append one atomic batch; return its rowids once durable."""
        enc = await asyncio.to_thread(encode_rows, batch, schema, commit_ts, deleted) \
            if batch.num_rows > 4096 else encode_rows(batch, schema, commit_ts, deleted)
        return await self.append_encoded(enc, commit_ts)

    async def append_encoded(self, enc: Encoded | EncodedParts, commit_ts: int, txn: int | None = None,
                             piece: bool = False) -> np.ndarray:
        """One ``BATCH … COMMIT``; with a decided ``txn`` (RFC 0003) only the ``BATCH`` — the
        caller then calls :meth:`commit_prepared` or :meth:`abort_prepared`, and appends nothing
        else to this segment in between; with ``piece`` too, a ``PIECE`` of it (log version 2:
        more pieces of the txn may follow before its ``COMMIT``)."""
        n = len(enc.starts)
        prepare = txn is not None
        assert prepare or not piece, "only a prepared batch comes in pieces"
        txn = next(self._txns) if txn is None else txn
        payload, first = batch_parts(txn, commit_ts, n, enc.bufs, commit=not prepare, piece=piece)
        base = self._next  # reserved before the await: localid order = file order
        self._next += n
        try:
            off = await self.file.append(payload)
        except BaseException:
            if prepare:
                self._next = base
            raise
        lens = np.diff(np.append(enc.starts, enc.nbytes))
        self._idx.put(base, off + first + enc.starts, lens)
        self.durable_rows = max(self.durable_rows, base + n)
        self.note_commit_ts(commit_ts)
        return rowids(self.segid, np.arange(base, base + n, dtype=np.uint32))

    async def commit_prepared(self, txn: int, lazy: bool = False) -> None:
        """``COMMIT`` a prepared batch (durable on return; callers need not wait for it, and
        with ``lazy`` it rides with the next flush instead of starting one)."""
        await self.file.append(commit_bytes(txn), lazy=lazy)

    def abort_prepared(self, ids: np.ndarray) -> None:
        """Forget a prepared batch (every piece: ``ids`` from the first): its localids go to the
        next batch, and a reader drops its ``BATCH`` or ``PIECE`` records (no ``COMMIT`` before
        the next batch or the end of the file)."""
        base = int(split_rowids(ids[:1])[1][0]) if len(ids) else self._next
        self._next = self.durable_rows = base

    async def append_record(self, kind: RecordKind, body: bytes, lazy: bool = False) -> None:
        """An opaque, progress or checkpoint record (durable on return)."""
        if kind == RecordKind.PROGRESS:
            self.wal.closed_ts = max(self.wal.closed_ts, U64.unpack(body)[0])
        await self.file.append(frame(kind, body), lazy=lazy)

    def note_commit_ts(self, ts: int) -> None:
        """Widen the segment's [min_ts, max_ts] (a group's record notes only its newest ts)."""
        self.min_ts = ts if self.min_ts is None else min(self.min_ts, ts)
        self.max_ts = ts if self.max_ts is None else max(self.max_ts, ts)

    # -- reads -----------------------------------------------------------------------

    def get_raw_cached(self, localid: int) -> bytes | None:
        """``get_raw`` without I/O when the memory cache holds the row's block, else None."""
        if not 0 <= localid < self.durable_rows:
            return None
        return self.file.read_cached(int(self._idx.arr[localid]), int(self._idx.lens[localid]))

    def locate(self, localids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File offsets and lengths of durable rows (vectorized: the fetch path reads them)."""
        return self._idx.arr[localids], self._idx.lens[localids]

    async def get_raw(self, localid: int) -> bytes:
        """The encoded row bytes of one durable row."""
        if not 0 <= localid < self.durable_rows:
            raise RowstoreError(f"segment {self.segid}: no row {localid} (rows: {self.durable_rows})")
        off, ln = int(self._idx.arr[localid]), int(self._idx.lens[localid])
        return await self.file.read(off, ln)

    async def get(self, localids: np.ndarray, schemas: Callable[[int], SchemaVersion],
                  target: SchemaVersion) -> Decoded:
        raws = [await self.get_raw(int(i)) for i in np.atleast_1d(localids)]
        return decode_row_list(raws, schemas, target, self.where)

    async def batches(self) -> AsyncIterator[CommittedBatch]:
        """Committed batches in file order (seal/offload, fsck, index rebuilds, change feeds).

        Flushes first: a ``COMMIT`` appended lazily (a commit group's) must be durable for
        the reader, which only sees durable bytes, to count its batch as committed. So a file
        whose group failed at the device with such a record unwritten raises (DeviceError: the
        feed answers 503 until the file is revived or another replica leads) rather than
        leave a committed batch out; with nothing unwritten it reads what it made durable."""
        if self.file.failure is None or self.file.unflushed:
            await self.file.flush()
        reader = WalReader(self.where)
        async for _, data in self.file.scan():
            for b in reader.feed(data):
                yield b
        reader.finish()

    # -- recovery --------------------------------------------------------------------

    @classmethod
    async def recover(cls, segid: int, file: ActiveFile,
                      decide: Callable[[int], Awaitable[bool]] | None = None) -> "ActiveSegment":
        """Rebuild the localid index from the file; batches without COMMIT are dropped — except
        a trailing prepared batch of a decided txn, for which ``await decide(txn)`` says whether
        it committed (then its ``COMMIT`` is appended now)."""
        seg = cls(segid, file, file.where)
        reader = WalReader(file.where)
        async for _, data in file.scan():
            for b in reader.feed(data):
                seg._replayed(b)
        reader.finish()
        tail = reader.state.trailing  # a BATCH, or every PIECE of one txn
        if tail and tail[0].txn & DECIDED and decide is not None and await decide(tail[0].txn):
            await seg.commit_prepared(tail[0].txn)
            for b in tail:
                seg._replayed(b)
            reader.state.dropped -= 1
            reader.state.trailing = []
        seg.durable_rows = seg._next
        seg.wal = reader.state
        return seg

    def _replayed(self, b: CommittedBatch) -> None:
        n = len(b.starts)
        lens = np.diff(np.append(b.starts, b.rows.shape[0]))
        self._idx.put(self._next, b.file_offset + b.starts, lens)
        self._next += n
        self.note_commit_ts(b.commit_ts)
        if not b.txn & DECIDED:
            self._txns = itertools.count(b.txn + 1)
