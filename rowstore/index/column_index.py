"""The column index of one table partition: value -> rowids for each indexed column
(docs/rfcs/0002-column-index.md; run format: docs/format/column-run.md).

Like the primary-key index it is a memtable plus runs, and it moves in lock step with
it: a checkpoint freezes both memtables at the same instant and publishes the runs in
the same manifest (``rowstore/index/key_index.py``), so a column run always covers exactly the
rows of the primary-key run it is named with. The memtable answers by an exact
vectorized scan (it is small); runs answer through the structures of
``rowstore/index/column_structures.py``. Answers are candidates: the query re-checks them exactly
and decides visibility with the primary-key index.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Iterable, Sequence, cast

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from catalog.abc import Put
from rowstore.index.column_cache import RunCache, nbytes
from rowstore.index.column_pages import MAGIC, TRAILER, PagedRun, decode_whole, encode_run, is_paged
from rowstore.index.column_kinds import FORMAT, Pred, _f, _range_bounds, _value_key, _value_keys, index_kind
from rowstore.index.column_structures import AxisIndex, GridIndex, ValueIndex, bitmap, ids_of
from rowstore.reads.predicates import Interval, BBox, bbox_mask, numeric_values, term_mask
from rowstore.errors import RowCorruptionError
from rowstore.schema import Column, SchemaVersion
from terrafs.fs import TerrascaleFS

log = logging.getLogger("rowstore.index.column_index")
VERSION = b"1"  # of the version-1 layout (part of the format; version 2: column_pages)
# A run written with at most this many entries is built for aggregates at once; a larger one
# (a bulk load's checkpoint) when an aggregate first needs it: building took a third of a big
# checkpoint's time, and an ingest waits for checkpoints once memtables pass the write stall.
EAGER_BUILD = 1 << 16


def exact(col: Column, values: pa.Array, pred: Pred) -> np.ndarray:
    return bbox_mask(values, pred) if isinstance(pred, BBox) else term_mask(values, pred)


class ColumnRun:
    """One run of one column, with its structure built in memory."""

    def __init__(self, col: Column, rowids: np.ndarray, values: pa.Array, inode: int = 0):
        self.col, self.kind, self.inode, self.rows = col, index_kind(col), inode, len(rowids)
        rowids = np.asarray(rowids, np.uint64)
        k = col.type.kind
        if self.kind == "grid":
            self.grid = GridIndex(_f(values, "x"), _f(values, "y"), rowids)
        elif self.kind == "box":
            self.ax = AxisIndex(_f(values, "xmin"), _f(values, "xmax"), rowids)
            self.ay = AxisIndex(_f(values, "ymin"), _f(values, "ymax"), rowids)
        elif self.kind == "range":
            assert col.type.elem is not None  # a range column's type has its element kind
            lo, hi = _range_bounds(values, col.type.elem)
            self.axis = AxisIndex(np.minimum(lo, hi), np.maximum(lo, hi), rowids)
        elif self.kind == "axis":
            v = numeric_values(values, k)
            self.axis = AxisIndex(v, v, rowids)
        else:
            self.values = ValueIndex(_value_keys(values, k), rowids)

    def candidates(self, pred: Pred) -> np.ndarray | None:
        """Sorted rowids whose value may satisfy ``pred``; None if this index cannot answer."""
        got = self._answer(pred)
        return got if got is None or isinstance(got, np.ndarray) else ids_of(got)

    def bitmap_of(self, pred: Pred) -> BitMap64 | None:
        """The same rowids as a roaring bitmap (aggregates intersect them without sorting)."""
        got = self._answer(pred)
        return bitmap(got) if isinstance(got, np.ndarray) else got

    def share(self, pred: Pred) -> float:
        """About which share of this run's rows ``pred`` selects (1.0 when unknown): what an
        aggregate weighs to pick the predicates worth a bitmap (the rest it checks by value)."""
        if not self.rows:
            return 0.0
        if self.kind == "value" and not isinstance(pred, BBox) and pred.op in ("=", "!="):
            n = len(self.values.eq(_value_key(pred.value, self.col.type.kind)))
            return (n if pred.op == "=" else self.rows - n) / self.rows
        if self.kind == "axis" and not isinstance(pred, BBox) and pred.op != "!=":
            return self.axis.share(pred.interval())
        return 1.0

    def _answer(self, pred: Pred) -> BitMap64 | np.ndarray | None:
        if isinstance(pred, BBox):
            if self.kind == "grid":
                return self.grid.query(pred.xmin, pred.ymin, pred.xmax, pred.ymax)
            if self.kind == "box":
                return self.ax.query(Interval(pred.xmin, pred.xmax)) & self.ay.query(Interval(pred.ymin, pred.ymax))
            return None
        if self.kind == "value":
            key = _value_key(pred.value, self.col.type.kind)
            if pred.op == "=":
                return self.values.eq(key)
            return self.values.ne(key) if pred.op == "!=" else None
        if self.kind in ("axis", "range") and pred.op != "!=":
            return self.axis.query(pred.interval())
        return None


class PartitionColumns:
    """Memtable and runs of every indexed column of one partition."""

    def __init__(self, fs: TerrascaleFS, manifest_key: str, columns: list[Column],
                 cache: RunCache | None = None) -> None:
        """``cache``: where built runs are kept (the node's, shared by its partitions; by
        default one of this partition's own)."""
        self.fs, self.key = fs, manifest_key
        self.columns = {c.id: c for c in columns}
        for c in columns:
            index_kind(c)  # refuse unindexable columns up front
        self.mem: list[MemPiece] = []
        self.frozen: list[list[MemPiece]] = []
        self._mem_bytes = 0
        self.cache = cache if cache is not None else RunCache()
        # primary-key run inode -> column id -> its run, named only: built when a read needs it
        self.runs: dict[int, dict[int, _Ref]] = {}
        self._written: dict[int, str] = {}  # inode -> object key of runs this node just wrote
        self.version = 0  # moves whenever the runs named change (a checkpoint, a merge, a GC pass)

    # -- writes -----------------------------------------------------------------------------

    def insert(self, rowids: np.ndarray, batch: pa.RecordBatch, schema: SchemaVersion,
               pos: np.ndarray | None = None) -> None:
        """Index the values of each indexed column of ``batch`` (whose columns are named as in
        ``schema``: columns are matched by id, so renames do not matter) — with ``pos``, of
        its rows ``pos``, taken only when a query or a checkpoint needs them; tombstones are
        excluded by the caller."""
        if not self.columns or len(rowids) == 0:
            return
        vals: dict[int, pa.Array | _Taken] = {}
        for cid in self.columns:
            col = schema.by_id(cid)
            i = batch.schema.get_field_index(col.name) if col is not None else -1
            if i >= 0:
                vals[cid] = batch.column(i) if pos is None else _Taken(batch.column(i), pos)
        self.mem.append((np.asarray(rowids, np.uint64), vals))
        self._mem_bytes += _piece_bytes(self.mem[-1])

    def freeze(self) -> list[MemPiece]:
        token, self.mem, self._mem_bytes = self.mem, [], 0
        self.frozen.append(token)
        return token

    def thaw(self, token: list[MemPiece]) -> None:
        """A checkpoint failed: its frozen entries go back to the memtable."""
        self.frozen.remove(token)
        self.mem = token + self.mem
        self._mem_bytes += sum(_piece_bytes(p) for p in token)

    def release(self, token: list[MemPiece]) -> None:
        self.frozen.remove(token)

    async def write_runs(self, pieces: Sequence[MemPiece], keep: np.ndarray | None = None) -> dict[str, int]:
        """Write one run file per indexed column from memtable ``pieces`` (or merged data);
        ``keep``: the rowids to keep (a merge drops what the key index purged). A column's
        entries are gathered, kept, sorted and encoded in one worker-thread hop: a merge of
        millions of entries held the event loop for seconds in ``np.isin`` alone."""
        out = {}
        for cid, col in self.columns.items():
            rowids, values, body = await asyncio.to_thread(_run_of, pieces, cid, col, keep)
            rec = await self.fs.create_sealed(_one(body), extra=lambda r: ([], [Put(self.pending_key(r.inode), b"")]))
            out[str(cid)] = rec.inode
            if len(rowids) <= EAGER_BUILD:  # built now, while its entries are at hand: the next aggregate finds it
                self.cache.put(_entries_key(rec.location),
                               *await asyncio.to_thread(_build, col, rowids, values, rec.inode))
            self._written[rec.inode] = rec.location
        return out

    def pending_key(self, inode: int) -> str:
        return f"{self.key}/pending/{inode:08x}"

    async def run_data(self, inode: int) -> tuple[np.ndarray, pa.Array]:
        """A run's whole (rowids, values), either version (merges and GC rewrite runs whole)."""
        sf = await self.fs.open_sealed(inode)
        raw = await sf.read(0, sf.size)
        return await asyncio.to_thread(parse_column_run, raw, sf.where)

    async def attach(self, pk_inode: int, cols: dict[str, int]) -> None:
        """Name the column runs of a primary-key run: nothing is read until a read needs one."""
        self.runs[pk_inode] = {int(c): _Ref(inode, self._written.pop(inode, None)) for c, inode in cols.items()
                               if int(c) in self.columns}  # a column dropped since: its index with it
        self.version += 1

    def detach(self, pk_inode: int) -> None:
        for ref in self.runs.pop(pk_inode, {}).values():
            if ref.key is not None:
                self.cache.drop(ref.key)
                self.cache.drop(_entries_key(ref.key))
        self.version += 1

    async def build(self, cids: Iterable[int]) -> None:
        """Every run of columns ``cids`` built (in the cache), so that what a read then takes
        of them is taken without waiting (at one instant, with the visible rows)."""
        for cid in cids:
            if cid in self.columns:
                await self._runs_of(cid)

    async def _run(self, pk_inode: int, cid: int) -> AnyRun:
        """Column ``cid``'s run of primary-key run ``pk_inode``: a version-2 run opened by its
        fence, a version-1 run built whole (or either found in the cache)."""
        ref, col = self.runs[pk_inode][cid], self.columns[cid]
        if ref.key is None:
            ref.key = (await self.fs.open_sealed(ref.inode)).key
        run = self.cache.peek(ref.key)
        if run is not None:
            self.cache.stats["hits"] += 1
            return cast(AnyRun, run)

        async def build() -> tuple[AnyRun, int]:
            sf = await self.fs.open_sealed(ref.inode)
            if sf.size >= TRAILER.size and is_paged(await sf.read(sf.size - TRAILER.size, TRAILER.size)):
                paged = await PagedRun.open(col, sf.read, sf.size, sf.where)
                return paged, paged.fence_bytes + 1024
            rowids, values = await self.run_data(ref.inode)
            return await asyncio.to_thread(_build, col, rowids, values, ref.inode)
        run = cast(AnyRun, await self.cache.get(ref.key, build))
        if isinstance(run, ColumnRun):
            built = [self.cache.peek(r.key) for c, r in self.runs.get(pk_inode, {}).items() if c != cid and r.key]
            await asyncio.to_thread(_share_rowids, [*(x for x in built if isinstance(x, ColumnRun)), run])
        return run

    async def _built(self, pk_inode: int, cid: int, run: PagedRun) -> ColumnRun:
        """A version-2 run's structure (what aggregates take bitmaps of, gather values from
        and count grid cells with), built from its entries and kept in the cache beside its
        fence, as a version-1 run's is."""
        ref = self.runs[pk_inode][cid]

        async def build() -> tuple[ColumnRun, int]:
            ids, vals = await run.whole()
            return await asyncio.to_thread(_build, self.columns[cid], ids, vals, ref.inode)
        built = cast(ColumnRun, await self.cache.get(_entries_key(cast(str, ref.key)), build))
        sibs = [self.cache.peek(_entries_key(r.key)) for c, r in self.runs.get(pk_inode, {}).items()
                if c != cid and r.key]
        await asyncio.to_thread(_share_rowids, [*(x for x in sibs if isinstance(x, ColumnRun)), built])  # one array
        return built

    async def _runs_of(self, cid: int) -> list[tuple[int, AnyRun]]:
        """(primary-key run inode, run) of every run holding column ``cid``, as named at one
        instant: the runs built meanwhile, a checkpoint or a merge may rename them (then they
        are taken again; when every one is built already nothing waits)."""
        while True:
            named = [pk for pk, refs in list(self.runs.items()) if cid in refs]
            try:
                out = [(pk, await self._run(pk, cid)) for pk in named]
            except KeyError:  # detached while another was built
                continue
            if named == [pk for pk, refs in self.runs.items() if cid in refs]:
                return out

    # -- reads ------------------------------------------------------------------------------

    def forget_missing(self, schema: SchemaVersion) -> None:
        """Stop indexing columns ``schema`` no longer has (a dropped column leaves its index)."""
        for cid in [c for c in self.columns if schema.by_id(c) is None]:
            del self.columns[cid]

    async def candidates(self, pred: Pred) -> tuple[np.ndarray, np.ndarray] | None:
        """Sorted rowids of row versions whose value may satisfy ``pred``, with the source
        of each (the inode of the key-index run holding its entry; 0: a memtable); None if
        the column is not indexed or its index cannot answer this predicate."""
        cid = pred.column.id
        if cid not in self.columns:
            return None
        parts, srcs = [], []
        for pk_inode, run in await self._runs_of(cid):
            got = await run.candidates(pred) if isinstance(run, PagedRun) else run.candidates(pred)
            if got is None:
                return None
            parts.append(got)
            srcs.append(np.full(len(got), pk_inode, np.int64))
        for piece in [*self.mem, *(p for tok in self.frozen for p in tok)]:
            rowids, vals = piece
            arr = _values(vals.get(cid))
            if arr is not None:
                parts.append(rowids[exact(self.columns[cid], arr, pred)])
                srcs.append(np.zeros(len(parts[-1]), np.int64))
        if not parts:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        ids, src = np.concatenate(parts), np.concatenate(srcs)
        order = np.argsort(ids, kind="stable")
        return ids[order], src[order]

    async def bitmap_of(self, pred: Pred) -> BitMap64 | None:
        """Like :meth:`candidates`, as one roaring bitmap without sources: for aggregates,
        which take visibility from the visible set instead of checking each source."""
        cid = pred.column.id
        return None if cid not in self.columns else bitmap_from(self.columns[cid], *await self.pieces_of(cid), pred)

    async def share(self, pred: Pred) -> float:
        """About which share of the runs' entries ``pred`` selects (1.0 when unknown), from
        what the runs keep (a version-1 structure's buckets, a version-2 fence): nothing read."""
        runs = [run for _, run in await self._runs_of(pred.column.id)] if pred.column.id in self.columns else []
        n = sum(r.rows for r in runs)
        return sum(r.share(pred) * r.rows for r in runs) / n if n else 1.0

    async def pieces_of(self, cid: int) -> tuple[list[ColumnRun], list[tuple[np.ndarray, pa.Array]]]:
        """The runs and memtable pieces (values taken) holding column ``cid``, as they are now:
        taken on the event loop, then read in a thread (runs are immutable once built, and a
        piece's arrays are not written after insert)."""
        named = await self._runs_of(cid)
        # a version-2 run's structure, built from its entries read whole (a histogram or a
        # gather of scattered rows touches every page anyway), kept within the cache's budget
        runs = [run if isinstance(run, ColumnRun) else await self._built(pk, cid, run) for pk, run in named]
        # then the memtables, at the instant they were named
        mem = [(ids, _values(v.get(cid))) for ids, v in [*self.mem, *(p for tok in self.frozen for p in tok)]]
        return runs, [(ids, v) for ids, v in mem if v is not None]

    @property
    def mem_bytes(self) -> int:
        return self._mem_bytes


# -- helpers ----------------------------------------------------------------------------------


class _Ref:
    """A column run named in the manifest: its inode, and its object key once known."""

    __slots__ = ("inode", "key")

    def __init__(self, inode: int, key: str | None = None) -> None:
        self.inode, self.key = inode, key


def _build(col: Column, rowids: np.ndarray, values: pa.Array, inode: int) -> tuple[ColumnRun, int]:
    """A run's structure and about the bytes it holds (worker thread)."""
    run = ColumnRun(col, rowids, values, inode)
    return run, nbytes(run)


def _share_rowids(runs: list[ColumnRun]) -> None:
    """Let the runs of one primary-key run whose side tables hold the same rowids (columns
    without nulls) hold one array: aggregates then find the wanted rows once for all of them
    (``column_values.gather``'s memo is keyed on the array)."""
    seen: list[np.ndarray] = []
    for run in runs:
        holder = run.values if run.kind == "value" else run.axis if run.kind == "axis" else None
        if holder is None:
            continue
        same = next((s for s in seen if s is holder.rowids or (len(s) == len(holder.rowids)
                                                               and np.array_equal(s, holder.rowids))), None)
        if same is None:
            seen.append(holder.rowids)
        else:
            holder.rowids = same


def bitmap_from(col: Column, runs: list[ColumnRun], pieces: list[tuple[np.ndarray, pa.Array]],
                pred: Pred) -> BitMap64 | None:
    """The rowids of ``runs`` and memtable ``pieces`` (:meth:`PartitionColumns.pieces_of`) that
    ``pred`` may select, as one bitmap; None when a run's structure cannot answer it."""
    parts = []
    for run in runs:
        got = run.bitmap_of(pred)
        if got is None:
            return None
        parts.append(got)
    for rowids, arr in pieces:
        parts.append(bitmap(rowids[exact(col, arr, pred)]))
    return BitMap64.union(*parts) if parts else BitMap64()


class _Taken:
    """Rows ``pos`` of ``arr``, taken on first use: ingest keeps the caller's array (one
    array serves every partition of a batch) instead of copying its values per partition."""

    __slots__ = ("state", "nbytes")

    def __init__(self, arr: pa.Array, pos: np.ndarray) -> None:
        # one attribute: a reader in another thread sees both or neither change
        self.state: tuple[pa.Array, np.ndarray | None] = (arr, pos)
        self.nbytes: int = pos.nbytes + arr.nbytes * len(pos) // max(len(arr), 1)  # this piece's share

    def values(self) -> pa.Array:
        arr, pos = self.state
        if pos is not None:  # taken once; the caller's array is let go
            arr = arr.take(pa.array(pos))
            self.state = (arr, None)
        return arr


# A memtable piece: rowids, and per indexed column id their values (taken on first use).
MemPiece = tuple[np.ndarray, dict[int, "pa.Array | _Taken"]]


def _values(v: pa.Array | _Taken | None) -> pa.Array | None:
    return v.values() if isinstance(v, _Taken) else v


def _piece_bytes(piece: MemPiece) -> int:
    rowids, vals = piece
    total: int = rowids.nbytes + sum(a.nbytes for a in vals.values())
    return total


def _run_of(pieces: Sequence[MemPiece], cid: int, col: Column,
            keep: np.ndarray | None) -> tuple[np.ndarray, pa.Array, bytes]:
    """Column ``cid``'s entries of ``pieces`` (those of ``keep`` when given), by rowid, and
    their version-2 run (worker thread)."""
    rowids, values = _gather(pieces, cid, col)
    if keep is not None and len(rowids):
        m = np.isin(rowids, keep)
        rowids, values = rowids[m], values.filter(pa.array(m))
    order = np.argsort(rowids, kind="stable")
    rowids, values = rowids[order], values.take(pa.array(order))
    return rowids, values, encode_run(col, rowids, values)


def _gather(pieces: Sequence[MemPiece], cid: int, col: Column) -> tuple[np.ndarray, pa.Array]:
    ids, vals = [], []
    for rowids, values in pieces:
        arr = _values(values.get(cid)) if isinstance(values, dict) else values
        if arr is None:
            continue
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        ok = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool) if arr.null_count else None
        if ok is not None:
            rowids, arr = rowids[ok], arr.filter(pa.array(ok))
        ids.append(np.asarray(rowids, np.uint64))
        vals.append(arr.cast(col.type.arrow()))
    if not ids:
        return np.zeros(0, np.uint64), pa.array([], col.type.arrow())
    return np.concatenate(ids), pa.concat_arrays(vals)


def _ipc_bytes(col: Column, kind: str, rowids: np.ndarray, values: pa.Array) -> bytes:
    meta = {b"terrascale.format": FORMAT, b"terrascale.version": VERSION,
            b"terrascale.column_id": str(col.id).encode(), b"terrascale.column_type": str(col.type).encode(),
            b"terrascale.kind": kind.encode()}
    schema = pa.schema([("rowid", pa.uint64()), ("value", col.type.arrow())], metadata=meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as w:
        w.write_table(pa.table([pa.array(rowids, pa.uint64()), values], schema=schema))
    body: bytes = sink.getvalue().to_pybytes()
    return body


def parse_column_run(raw: bytes, where: str) -> tuple[np.ndarray, pa.Array]:
    """A column-index run's bytes, either version -> (rowids, values), checked (also used by fsck)."""
    if is_paged(raw[-len(MAGIC):]):
        return decode_whole(raw, where)
    try:
        t = pa.ipc.open_file(pa.py_buffer(raw)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise RowCorruptionError(where, 0, f"not a column-index run: {e}") from e
    meta = t.schema.metadata or {}
    if meta.get(b"terrascale.format") != FORMAT:
        raise RowCorruptionError(where, 0, "not a column-index run (format metadata)")
    if meta.get(b"terrascale.version") != VERSION:
        raise RowCorruptionError(where, 0, f"unsupported column-run version {meta.get(b'terrascale.version')!r}")
    rowids = t.column("rowid").combine_chunks().to_numpy(zero_copy_only=False).astype(np.uint64)
    return rowids, t.column("value").combine_chunks()


async def _one(body: bytes) -> AsyncIterator[bytes]:
    yield body


AnyRun = ColumnRun | PagedRun  # a run of either version, as the cache holds it


def _entries_key(key: str) -> str:
    """The cache key of a version-2 run's structure built from its entries (beside its
    fence's, ``key``)."""
    return key + "#entries"

