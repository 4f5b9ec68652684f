"""Paged column-index runs (docs/format/column-run.md, version 2; RFC 0014, "Step (2)"): a run
whose reads take the pages they need instead of a structure built from every entry.

A run is by-key pages (every entry once, sorted by its kind's key), by-rowid pages (every
entry again, sorted by rowid: values of given rowids), a fence (one row per page: where it is,
its rowids and a summary of its keys) and a fixed trailer. A predicate selects pages by a
vectorized comparison against the fence and is refined exactly on the entries of those pages,
so its answer equals version 1's (``ColumnRun.candidates``). Pages are read through an async
``read(offset, length)`` (a sealed file's, through the block cache) and decoded off the loop
when there are many."""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import RowCorruptionError
from rowstore.index.column_kinds import FORMAT, Pred, _f, _range_bounds, _value_key, _value_keys, index_kind
from rowstore.index.rowid_kernels import match_sorted
from rowstore.reads.predicates import BBox, numeric_values
from rowstore.schema import Column
from rowstore.types import ColumnType

VERSION = 2
MAGIC = b"TSCRUN"
TRAILER = struct.Struct("<QIIH6s")  # fence offset, fence length, crc32c(fence), version, magic: 24 bytes
PAGE_ENTRIES = 4096
BY_KEY, BY_ROWID = 0, 1  # the fence's ``section``
MORTON_BITS = 16  # per axis: a point's cell on a 65,536 x 65,536 grid over the run's extent


def is_paged(tail: bytes) -> bool:
    """Whether a run whose last bytes are ``tail`` is version 2 (version 1 ends in ``ARROW1``)."""
    return tail.endswith(MAGIC)


# -- keys -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Keys:
    """Each entry's key domain: ``lo``/``hi`` (1-D kinds: value, axis, range) or the box
    ``lo, hi, ylo, yhi`` (x then y: grid, box) — what pages are summarized and refined by."""
    lo: np.ndarray | pa.Array
    hi: np.ndarray | pa.Array
    ylo: np.ndarray | None = None
    yhi: np.ndarray | None = None


def keys_of(col: Column, values: pa.Array) -> Keys:
    kind, k = index_kind(col), col.type.kind
    if kind == "value":
        v = _value_keys(values, k)
        return Keys(v, v)
    if kind == "axis":
        n = numeric_values(values, k)
        return Keys(n, n)
    if kind == "range":
        assert col.type.elem is not None  # a range column's type has its element kind
        lo, hi = _range_bounds(values, col.type.elem)
        return Keys(np.minimum(lo, hi), np.maximum(lo, hi))
    if kind == "grid":
        x, y = _f(values, "x"), _f(values, "y")
        return Keys(x, x, y, y)
    return Keys(_f(values, "xmin"), _f(values, "xmax"), _f(values, "ymin"), _f(values, "ymax"))


def morton(x: np.ndarray, y: np.ndarray, extent: tuple[float, float, float, float]) -> np.ndarray:
    """Z-order codes (uint64; x's bits at even positions) of points quantized to
    ``MORTON_BITS`` bits an axis over ``extent`` (x0, x1, y0, y1); a NaN point gets 2**32,
    after every other."""
    def q(v: np.ndarray, a: float, b: float) -> np.ndarray:
        scale = ((1 << MORTON_BITS) - 1) / (b - a) if b > a else 0.0
        with np.errstate(invalid="ignore"):
            return np.clip(np.nan_to_num((v - a) * scale, nan=0.0), 0, (1 << MORTON_BITS) - 1).astype(np.uint64)
    out: np.ndarray = _spread(q(x, extent[0], extent[1])) | (_spread(q(y, extent[2], extent[3])) << np.uint64(1))
    out[np.isnan(x) | np.isnan(y)] = np.uint64(1 << 32)
    return out


def _spread(v: np.ndarray) -> np.ndarray:
    """16-bit values with a zero bit inserted above each bit (the Morton interleave)."""
    v = v & np.uint64(0xFFFF)
    for shift, mask in ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)):
        v = (v | (v << np.uint64(shift))) & np.uint64(mask)
    return v


def _extent(keys: Keys) -> tuple[float, float, float, float]:
    cx, cy = _centres(keys)
    ok = ~(np.isnan(cx) | np.isnan(cy))
    if not ok.any():
        return (0.0, 0.0, 0.0, 0.0)
    return (float(cx[ok].min()), float(cx[ok].max()), float(cy[ok].min()), float(cy[ok].max()))


def _centres(keys: Keys) -> tuple[np.ndarray, np.ndarray]:
    assert keys.ylo is not None and keys.yhi is not None
    return (np.asarray(keys.lo) + np.asarray(keys.hi)) / 2, (keys.ylo + keys.yhi) / 2


def key_order(col: Column, rowids: np.ndarray, keys: Keys) -> np.ndarray:
    """The by-key order of the entries: by the kind's key, ties by rowid. Entries in rowid
    order (as runs are written) need only a stable sort by the key (about twice as fast as
    sorting by both)."""
    kind = index_kind(col)
    by_rowid = len(rowids) < 2 or bool((rowids[1:] > rowids[:-1]).all())
    if kind == "value":
        k = keys.lo if isinstance(keys.lo, (pa.Array, pa.ChunkedArray)) else pa.array(keys.lo)
        if by_rowid:  # Arrow's sort_indices is stable
            return _few_values_order(k) if _few_values(k) else np.asarray(pc.sort_indices(k).to_numpy())
        t = pa.table({"k": k, "r": pa.array(rowids, pa.uint64())})
        return np.asarray(pc.sort_indices(t, [("k", "ascending"), ("r", "ascending")]).to_numpy())
    if kind in ("grid", "box"):
        cx, cy = _centres(keys)
        key = morton(cx, cy, _extent(keys))
    else:
        key = np.asarray(keys.lo)  # numpy puts NaN last
    return np.argsort(key, kind="stable") if by_rowid else np.lexsort((rowids, key))


def _few_values(k: pa.Array | pa.ChunkedArray) -> bool:
    """Whether ``k`` (strings or binaries, no nulls) repeats few values, judged on a sample:
    sorting its dictionary's ranks is then ~3x faster than sorting it (and ~2x slower when
    most values are distinct)."""
    if len(k) < 65536 or k.null_count or not (pa.types.is_string(k.type) or pa.types.is_binary(k.type)
                                              or pa.types.is_fixed_size_binary(k.type)):
        return False
    sample = k.take(pa.array(np.linspace(0, len(k) - 1, 8192).astype(np.int64)))
    return len(pc.unique(sample)) * 8 <= len(sample)


def _few_values_order(k: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A stable sort of ``k`` through its dictionary: each entry's rank among the distinct
    values, sorted stably as integers (ties keep their order, as ``sort_indices`` does)."""
    d = pc.dictionary_encode(k.combine_chunks() if isinstance(k, pa.ChunkedArray) else k)
    rank = np.empty(len(d.dictionary), np.int64)
    rank[pc.sort_indices(d.dictionary).to_numpy()] = np.arange(len(d.dictionary))
    return np.argsort(rank[d.indices.to_numpy()], kind="stable")


# -- writing ----------------------------------------------------------------------------------

def encode_run(col: Column, rowids: np.ndarray, values: pa.Array, page_entries: int = PAGE_ENTRIES) -> bytes:
    """A version-2 run's logical bytes from ``rowids`` (sorted, unique) and their ``values``."""
    rowids = np.asarray(rowids, np.uint64)
    kind = index_kind(col)
    keys = keys_of(col, values)
    schema = _page_schema(col, kind)
    body, rows = bytearray(), list[FenceRow]()
    for section, order in ((BY_KEY, key_order(col, rowids, keys)), (BY_ROWID, np.arange(len(rowids)))):
        for a in range(0, len(order), page_entries):
            take = order[a : a + page_entries]
            page = pa.record_batch([pa.array(rowids[take], pa.uint64()), values.take(pa.array(take))], schema=schema)
            raw = _ipc(page)
            summary = _summary(keys, take) if section == BY_KEY else None
            rid = rowids[take]
            rows.append((section, len(body), len(raw), len(take), int(rid.min()), int(rid.max()), summary))
            body += raw
    fence = _ipc(_fence_batch(col, kind, keys, rows))
    off = len(body)
    return bytes(body) + fence + TRAILER.pack(off, len(fence), crc32c.crc32c(fence), VERSION, MAGIC)


def _page_schema(col: Column, kind: str) -> pa.Schema:
    meta = {b"terrascale.format": FORMAT, b"terrascale.version": str(VERSION).encode(),
            b"terrascale.column_id": str(col.id).encode(), b"terrascale.column_type": str(col.type).encode(),
            b"terrascale.kind": kind.encode()}
    return pa.schema([("rowid", pa.uint64()), ("value", col.type.arrow())], metadata=meta)


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    out: bytes = sink.getvalue().to_pybytes()
    return out


Summary = tuple[object, object, object, object]


def _summary(keys: Keys, take: np.ndarray) -> Summary:
    """A by-key page's summary: min lo, max hi (and min ylo, max yhi); NaN ignored."""
    if isinstance(keys.lo, (pa.Array, pa.ChunkedArray)):  # value kinds: strings, binary
        got = keys.lo.take(pa.array(take))
        mm = pc.min_max(got)
        return (mm["min"].as_py(), mm["max"].as_py(), None, None)
    lo, hi = np.asarray(keys.lo)[take], np.asarray(keys.hi)[take]
    if keys.ylo is not None and keys.yhi is not None:
        return (_fmin(lo), _fmax(hi), _fmin(keys.ylo[take]), _fmax(keys.yhi[take]))
    return (_fmin(lo), _fmax(hi), None, None)


def _fmin(v: np.ndarray) -> object:
    if v.dtype.kind == "f":
        return float(np.nan) if np.isnan(v).all() else float(np.nanmin(v))
    return v.min().item()


def _fmax(v: np.ndarray) -> object:
    if v.dtype.kind == "f":
        return float(np.nan) if np.isnan(v).all() else float(np.nanmax(v))
    return v.max().item()


def _key_type(keys: Keys) -> pa.DataType:
    if isinstance(keys.lo, (pa.Array, pa.ChunkedArray)):
        return keys.lo.type
    return pa.from_numpy_dtype(np.asarray(keys.lo).dtype)


FenceRow = tuple[int, int, int, int, int, int, "Summary | None"]


def _fence_batch(col: Column, kind: str, keys: Keys, rows: list[FenceRow]) -> pa.RecordBatch:
    kt = _key_type(keys)
    cols: list[tuple[object, ...]] = list(zip(*rows)) if rows else [() for _ in range(7)]
    summ: list[Summary] = [r[6] if r[6] is not None else (None, None, None, None) for r in rows]
    meta = dict(_page_schema(col, kind).metadata or {})
    meta[b"terrascale.entries"] = str(sum(r[3] for r in rows if r[0] == BY_KEY)).encode()
    schema = pa.schema([("section", pa.uint8()), ("offset", pa.uint64()), ("length", pa.uint32()),
                        ("count", pa.uint32()), ("first_rowid", pa.uint64()), ("last_rowid", pa.uint64()),
                        ("lo", kt), ("hi", kt), ("ylo", pa.float64()), ("yhi", pa.float64())], metadata=meta)
    return pa.record_batch([pa.array(cols[0], pa.uint8()), pa.array(cols[1], pa.uint64()),
                            pa.array(cols[2], pa.uint32()), pa.array(cols[3], pa.uint32()),
                            pa.array(cols[4], pa.uint64()), pa.array(cols[5], pa.uint64()),
                            pa.array([s[0] for s in summ], kt), pa.array([s[1] for s in summ], kt),
                            pa.array([s[2] for s in summ], pa.float64()),
                            pa.array([s[3] for s in summ], pa.float64())], schema=schema)


# -- reading ----------------------------------------------------------------------------------

Read = Callable[[int, int], Awaitable[bytes]]
_THREAD_PAGES = 8  # more pages than this are decoded in a worker thread


class Fence:
    """A run's trailer and fence, parsed and checked: where each page is and what it holds."""

    def __init__(self, batch: pa.RecordBatch, where: str, fence_off: int):
        self.batch, self.where, self.fence_off = batch, where, fence_off
        sec = batch.column("section").to_numpy()
        self.key_pages, self.rowid_pages = np.flatnonzero(sec == BY_KEY), np.flatnonzero(sec == BY_ROWID)
        self.offset = batch.column("offset").to_numpy().astype(np.int64)
        self.length = batch.column("length").to_numpy().astype(np.int64)
        self.count = batch.column("count").to_numpy().astype(np.int64)
        self.first = batch.column("first_rowid").to_numpy()
        self.last = batch.column("last_rowid").to_numpy()
        self.rows = int(self.count[self.key_pages].sum())
        ends = self.offset + self.length
        if len(ends) and (self.offset[0] != 0 or (ends[:-1] != self.offset[1:]).any() or ends[-1] != fence_off):
            raise RowCorruptionError(where, fence_off, "the fence's pages do not tile the run")
        if self.rows != int(self.count[self.rowid_pages].sum()):
            raise RowCorruptionError(where, fence_off, "the two sections hold different entries")

    @staticmethod
    def where_in(tail: bytes, size: int, where: str) -> tuple[int, int, int]:
        """(fence offset, length, crc32c) from a run's last ``TRAILER.size`` bytes, checked."""
        if size < TRAILER.size or len(tail) != TRAILER.size:
            raise RowCorruptionError(where, 0, f"a column run of {size} bytes: shorter than its trailer")
        off, n, crc, version, magic = TRAILER.unpack(tail)
        if magic != MAGIC:
            raise RowCorruptionError(where, size - TRAILER.size, "not a version-2 column run (trailer magic)")
        if version != VERSION:
            raise RowCorruptionError(where, size - TRAILER.size, f"unsupported column-run version {version}")
        if off + n != size - TRAILER.size:
            raise RowCorruptionError(where, size - TRAILER.size, f"fence at {off}+{n} does not end at the trailer")
        return off, n, crc

    @classmethod
    def parse(cls, raw: bytes, off: int, crc: int, where: str, column_id: int | None) -> Fence:
        if crc32c.crc32c(raw) != crc:
            raise RowCorruptionError(where, off, "column run fence checksum mismatch")
        batch = _one_batch(raw, where, off, "fence")
        meta = batch.schema.metadata or {}
        if meta.get(b"terrascale.format") != FORMAT or (
                column_id is not None and meta.get(b"terrascale.column_id") != str(column_id).encode()):
            raise RowCorruptionError(where, off, "the fence names another format or column")
        return cls(batch, where, off)

    def decode(self, raw: bytes | memoryview, i: int, value_type: pa.DataType | None) -> pa.RecordBatch:
        """Fence row ``i``'s page from its bytes, checked against the fence (and its values'
        type, when known)."""
        off = int(self.offset[i])
        b = _one_batch(raw, self.where, off, f"page {i}")
        if b.num_rows != self.count[i] or b.schema.names != ["rowid", "value"] or (
                value_type is not None and b.schema.field(1).type != value_type):
            raise RowCorruptionError(self.where, off, f"page {i} does not match the fence")
        r = b.column(0).to_numpy(zero_copy_only=False)
        if len(r) and (r.min() != self.first[i] or r.max() != self.last[i]):
            raise RowCorruptionError(self.where, off, f"page {i}'s rowids are not the fence's")
        return b


def decode_whole(raw: bytes, where: str) -> tuple[np.ndarray, pa.Array]:
    """A whole version-2 run's (rowids, values) in rowid order, checked — every page of both
    sections decoded, and both holding the same rowids (merges, GC, fsck)."""
    off, n, crc = Fence.where_in(raw[-TRAILER.size:], len(raw), where)
    f = Fence.parse(raw[off:off + n], off, crc, where, None)
    pages = [f.decode(memoryview(raw)[f.offset[i]:f.offset[i] + f.length[i]], int(i), None) for i in f.rowid_pages]
    if not pages:
        return np.zeros(0, np.uint64), pa.array([], _key_value_type(f))
    t = pa.Table.from_batches(pages)
    rowids = t.column(0).combine_chunks().to_numpy(zero_copy_only=False).astype(np.uint64)
    if len(rowids) > 1 and not (rowids[1:] > rowids[:-1]).all():
        raise RowCorruptionError(where, 0, "the by-rowid pages are not in rowid order")
    typ = t.schema.field(1).type
    keyed = [f.decode(memoryview(raw)[f.offset[i]:f.offset[i] + f.length[i]], int(i), typ) for i in f.key_pages]
    by_key = np.sort(np.concatenate([b.column(0).to_numpy(zero_copy_only=False) for b in keyed]))
    if not np.array_equal(by_key, rowids):
        raise RowCorruptionError(where, 0, "the by-key pages hold other rowids than the by-rowid pages")
    return rowids, t.column(1).combine_chunks()


def _key_value_type(f: Fence) -> pa.DataType:
    meta = f.batch.schema.metadata or {}  # the pages' value type, from the metadata every page carries
    return ColumnType.parse(meta[b"terrascale.column_type"].decode()).arrow()


class PagedRun:
    """A version-2 run opened by its fence; pages are read through ``read(offset, length)``
    (a sealed file's ranged read, through the block cache) when a predicate needs them."""

    def __init__(self, col: Column, fence: Fence, read: Read):
        self.col, self.kind, self.read, self.f = col, index_kind(col), read, fence
        self.where, self.rows = fence.where, fence.rows
        self.key_pages, self.rowid_pages = fence.key_pages, fence.rowid_pages
        self.pages_read = 0  # pages decoded since opened (what a bench or a test counts)

    @classmethod
    async def open(cls, col: Column, read: Read, size: int, where: str) -> PagedRun:
        off, n, crc = Fence.where_in(await read(size - TRAILER.size, TRAILER.size) if size >= TRAILER.size
                                     else b"", size, where)
        return cls(col, Fence.parse(await read(off, n), off, crc, where, col.id), read)

    @property
    def fence_bytes(self) -> int:
        return int(self.f.batch.nbytes)

    def pages_for(self, pred: Pred) -> np.ndarray | None:
        """The by-key pages whose summary may hold an entry satisfying ``pred`` (fence rows);
        None if this kind cannot answer it (as version 1)."""
        f, pages = self.f.batch, self.key_pages
        if isinstance(pred, BBox):
            if self.kind not in ("grid", "box"):
                return None
            x0, x1, y0, y1 = (_np(f.column(c), pages) for c in ("lo", "hi", "ylo", "yhi"))
            return pages[(x0 <= pred.xmax) & (x1 >= pred.xmin) & (y0 <= pred.ymax) & (y1 >= pred.ymin)]
        if self.kind == "value":
            if pred.op == "!=":
                return pages
            if pred.op != "=":
                return None
            v = pa.scalar(_value_key(pred.value, self.col.type.kind), f.column("lo").type)
            lo, hi = f.column("lo").take(pa.array(pages)), f.column("hi").take(pa.array(pages))
            m = pc.and_(pc.less_equal(lo, v), pc.greater_equal(hi, v)).to_numpy(zero_copy_only=False)
            out: np.ndarray = pages[m]
            return out
        if self.kind in ("axis", "range") and pred.op != "!=":
            return pages[pred.interval().overlaps(_np(f.column("lo"), pages), _np(f.column("hi"), pages))]
        return None

    def share(self, pred: Pred) -> float:
        """About which share of the entries ``pred`` selects, from the pages it selects (1.0
        when this kind cannot answer it): nothing is read."""
        pages = self.pages_for(pred)
        return 1.0 if pages is None or not self.rows else float(self.f.count[pages].sum()) / self.rows

    async def candidates(self, pred: Pred) -> np.ndarray | None:
        """Sorted rowids whose value satisfies ``pred`` (equal to version 1's answer); None if
        this kind cannot answer it."""
        pages = self.pages_for(pred)
        if pages is None:
            return None
        got = await self.pages(pages)

        def match() -> np.ndarray:
            parts = [self._match(b, pred) for b in got]
            return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)
        return await asyncio.to_thread(match) if len(got) > _THREAD_PAGES else match()

    def _match(self, page: pa.RecordBatch, pred: Pred) -> np.ndarray:
        rowids = page.column(0).to_numpy(zero_copy_only=False)
        keys = keys_of(self.col, page.column(1))
        if isinstance(pred, BBox):
            assert keys.ylo is not None and keys.yhi is not None
            lo, hi = np.asarray(keys.lo), np.asarray(keys.hi)
            m = (lo <= pred.xmax) & (hi >= pred.xmin) & (keys.ylo <= pred.ymax) & (keys.yhi >= pred.ymin)
        elif self.kind == "value":
            v = _value_key(pred.value, self.col.type.kind)
            k = keys.lo if isinstance(keys.lo, (pa.Array, pa.ChunkedArray)) else pa.array(keys.lo)
            eq = pc.equal(k, pa.scalar(v, k.type)).to_numpy(zero_copy_only=False)
            m = eq if pred.op == "=" else ~eq
        else:
            m = pred.interval().overlaps(np.asarray(keys.lo), np.asarray(keys.hi))
        out: np.ndarray = rowids[m]
        return out

    async def values_of(self, rowids: np.ndarray) -> tuple[np.ndarray, pa.Array]:
        """(positions in the sorted ``rowids`` found in this run, their values), from the
        by-rowid pages that hold any of them."""
        rowids = np.asarray(rowids, np.uint64)
        pages = self.rowid_pages
        a = np.searchsorted(rowids, self.f.first[pages], "left")
        b = np.searchsorted(rowids, self.f.last[pages], "right")
        use = a < b
        got = await self.pages(pages[use])
        at, vals = [], []
        for page, lo, hi in zip(got, a[use], b[use]):
            pos = match_sorted(page.column(0).to_numpy(zero_copy_only=False), rowids[lo:hi])
            hit = pos >= 0
            at.append(np.flatnonzero(hit) + lo)
            vals.append(page.column(1).take(pa.array(pos[hit])))
        if not at:
            return np.zeros(0, np.int64), pa.array([], self.col.type.arrow())
        return np.concatenate(at), pa.concat_arrays(vals)

    async def whole(self) -> tuple[np.ndarray, pa.Array]:
        """Every entry, (rowids, values) in rowid order: the by-rowid pages, concatenated."""
        got = await self.pages(self.rowid_pages)
        if not got:
            return np.zeros(0, np.uint64), pa.array([], self.col.type.arrow())
        t = pa.Table.from_batches(got)
        return t.column(0).combine_chunks().to_numpy(zero_copy_only=False), t.column(1).combine_chunks()

    async def pages(self, idx: np.ndarray) -> list[pa.RecordBatch]:
        """Fence rows ``idx`` (ascending)'s pages, decoded and checked: each stretch of
        neighbouring pages by one read; decoded in a worker thread when there are many."""
        f, spans = self.f, list[list[int]]()
        for i in (int(x) for x in idx):
            if spans and spans[-1][1] == i:
                spans[-1][1] = i + 1
            else:
                spans.append([i, i + 1])
        raws: list[tuple[int, memoryview]] = []
        for lo, hi in spans:
            start = int(f.offset[lo])
            raw = await self.read(start, int(f.offset[hi - 1] + f.length[hi - 1]) - start)
            raws.extend((i, memoryview(raw)[f.offset[i] - start:f.offset[i] - start + f.length[i]])
                        for i in range(lo, hi))
        typ = self.col.type.arrow()

        def decode() -> list[pa.RecordBatch]:
            return [f.decode(r, i, typ) for i, r in raws]
        out = await asyncio.to_thread(decode) if len(raws) > _THREAD_PAGES else decode()
        self.pages_read += len(out)
        return out


def _one_batch(raw: bytes | memoryview, where: str, off: int, what: str) -> pa.RecordBatch:
    try:
        batches = list(pa.ipc.open_stream(pa.py_buffer(raw)))
    except (pa.ArrowInvalid, OSError) as e:
        raise RowCorruptionError(where, off, f"column run {what}: {e}") from e
    if len(batches) != 1:
        raise RowCorruptionError(where, off, f"column run {what}: {len(batches)} record batches, not one")
    return batches[0]


def _np(a: pa.Array, rows: np.ndarray) -> np.ndarray:
    """Fence column ``a`` at ``rows`` (by-key pages: no nulls, so integers stay integers)."""
    out: np.ndarray = a.take(pa.array(rows, pa.int64())).to_numpy(zero_copy_only=False)
    return out
