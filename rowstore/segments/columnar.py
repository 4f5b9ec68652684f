"""Columnar sealed segments (version 2): rows stored column by column in groups of rows.

Format: docs/format/segment.md §7; why this layout: docs/rfcs/0014-columnar-segments.md.
:func:`columnar_bytes` streams the object's logical bytes from committed row batches (an
active segment's write-ahead, or a garbage collector's copy): rows are cut into groups of
``GROUP_ROWS``; each group's column chunks are pages (``rowstore.codec.columns``), each page
its own TerrascaleFS block (``Aligned``), so a read of some columns fetches, verifies,
decrypts and decompresses only their blocks. The metadata (column table, schema versions,
chunks with per-column statistics, page directory, key range) and a fixed trailer follow.

:class:`ColumnarSegment` reads it: whole groups of some columns (scans), pages holding some
rows (reads by rowid), and rows re-encoded in their own schema version's row bytes
(``docs/format/segment.md`` §1) for the point-read decoders and the garbage collector.
"""
from __future__ import annotations

import asyncio
import itertools
import struct
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.checksum import crc32c
from rowstore.codec.columns import decode_page, encode_page
from rowstore.codec.rows import Decoded, decode_rows, encode_rows, row_versions
from rowstore.errors import ColumnCorruptionError, RowCorruptionError
from rowstore.schema import Column, SchemaVersion
from rowstore.segments.sealed import ClusterRange, RowBatch, SealedSegment, key_bytes, key_columns_schema, \
    pack_cluster, unpack_cluster
from rowstore.tables.keys import encode_columns, key_arrays
from rowstore.types import ColumnType, Kind
from terrafs.errors import FileCorruptionError
from terrafs.sealed import Aligned, SealedFile

COL_MAGIC = b"TRSEGCL2"  # part of the format: the last 8 bytes of a version-2 segment
COL_VERSION = 2
GROUP_ROWS = 1 << 16  # rows per group (the last group may hold fewer); part of the format
PAGE_BYTES = 64 << 10  # target plain bytes of a page (the writer's choice, not the format's)
BLOCK_SIZE = 1 << 20  # TerrascaleFS block size of a columnar object: a page is one block
TRAILER = struct.Struct("<IIQQIIQQIIII48sHHI8s")
TRAILER_LEN = TRAILER.size  # 128
META_HEAD = struct.Struct("<IIIIIIII")  # columns, groups, pages, versions, group rows, min key, max key, 0
COLUMN = np.dtype([("id", "<u4"), ("type", "u1"), ("elem", "u1"), ("zero", "<u2")])
CHUNK = np.dtype([("first", "<u4"), ("pages", "<u4"), ("nulls", "<u4"), ("distinct", "<u4"),
                  ("flags", "u1"), ("min_len", "u1"), ("max_len", "u1"), ("zero", "u1"),
                  ("min", "u1", (32,)), ("max", "u1", (32,))])
PAGE = np.dtype([("off", "<u8"), ("len", "<u4"), ("first", "<u4"), ("rows", "<u4"), ("zero", "<u4")])
VERSION_HEAD = struct.Struct("<IHHHH")  # version, columns, key columns, partition key, 0
HAS_MINMAX = 0x01  # chunk flag: min and max hold bounds of its non-null values
STAT_BYTES = 32
NO_DISTINCT = 0xFFFFFFFF
assert TRAILER_LEN == 128 and COLUMN.itemsize == 8 and CHUNK.itemsize == 84 and PAGE.itemsize == 24

# the system columns, first in every column table (ids above any a schema gives)
TS_ID, FLAGS_ID, VERSION_ID = 0xFFFFFFF0, 0xFFFFFFF1, 0xFFFFFFF2
SYSTEM = ((TS_ID, ColumnType(Kind.UINT64)), (FLAGS_ID, ColumnType(Kind.UINT8)), (VERSION_ID, ColumnType(Kind.UINT32)))
# column type codes (part of the format)
KIND_CODES = {k: i + 1 for i, k in enumerate(Kind)}
KINDS = {v: k for k, v in KIND_CODES.items()}
assert KIND_CODES[Kind.INT8] == 1 and KIND_CODES[Kind.RANGE] == 20 and KIND_CODES[Kind.JSON] == 17


def type_code(t: ColumnType) -> tuple[int, int]:
    return KIND_CODES[t.kind], KIND_CODES[t.elem] if t.elem is not None else 0


# -- writing ----------------------------------------------------------------------------------


@dataclass
class _Piece:
    buf: np.ndarray  # uint8: rows back to back from starts[0]
    starts: np.ndarray  # int64


class _Writer:
    """The state of one object being written: columns seen, chunks, pages, statistics."""

    def __init__(self, segid: int, schemas: Callable[[int], SchemaVersion], key_schema: SchemaVersion):
        self.segid, self.schemas = segid, schemas
        self.keys = key_columns_schema(key_schema)
        self.columns: dict[tuple[int, str], int] = {(cid, str(t)): i for i, (cid, t) in enumerate(SYSTEM)}
        self.types: list[ColumnType] = [t for _, t in SYSTEM]
        self.ids: list[int] = [cid for cid, _ in SYSTEM]
        self.versions: dict[int, SchemaVersion] = {}
        self.chunks: list[dict[int, np.ndarray]] = []  # per group: column index -> chunk entry
        self.group_rows: list[int] = []
        self.pages: list[tuple[int, int, int, int]] = []  # off, len, first row, rows
        self.pos = self.rows = 0
        self.min_ts: int | None = None
        self.max_ts = self.deletions = self.deletions_max_ts = 0
        self.kmin: bytes | None = None
        self.kmax: bytes | None = None

    def union(self, vers: list[int]) -> SchemaVersion:
        """Every column of these versions (and of the key), named ``c<id>``, key columns first."""
        cols: dict[int, Column] = {}
        pk = self.keys.primary_key
        for v in vers:
            s = self.versions.setdefault(v, self.schemas(v))
            for c in s.columns:
                key = (c.id, str(c.type))
                if key not in self.columns:
                    self.columns[key] = len(self.types)
                    self.types.append(c.type)
                    self.ids.append(c.id)
                if c.id not in cols:
                    cols[c.id] = Column(c.id, f"c{c.id}", c.type, c.id not in pk)
        for c in self.keys.columns:
            cols.setdefault(c.id, Column(c.id, f"c{c.id}", c.type, False))
        return SchemaVersion(0, tuple(cols.values()), pk, max(cols) + 1, self.keys.partition_key)

    def group(self, piece: _Piece) -> list[bytes]:
        """One group's pages (in a worker thread): rows decoded once, each column paged."""
        vers = np.unique(row_versions(piece.buf, piece.starts)).tolist()
        union = self.union(vers)
        dec = decode_rows(piece.buf, piece.starts, self.schemas, union, f"segment {self.segid}")
        n = dec.batch.num_rows
        arrays: list[tuple[int, pa.Array, ColumnType]] = [
            (0, pa.array(dec.commit_ts, pa.uint64()), SYSTEM[0][1]),
            (1, pa.array(dec.deleted.astype(np.uint8), pa.uint8()), SYSTEM[1][1]),
            (2, pa.array(dec.schema_ver, pa.uint32()), SYSTEM[2][1])]
        for c in union.columns:
            arrays.append((self.columns[(c.id, str(c.type))], dec.batch.column(c.name), c.type))
        chunks: dict[int, np.ndarray] = {}
        out: list[bytes] = []
        for ci, arr, t in arrays:
            entry = np.zeros((), CHUNK)
            entry["first"] = len(self.pages)
            step = _page_rows(arr, t)
            for a in range(0, n, step):
                page = encode_page(arr.slice(a, min(step, n - a)), t)
                self.pages.append((self.pos, len(page), self.rows + a, min(step, n - a)))
                self.pos += len(page)
                out.append(page)
            entry["pages"] = len(self.pages) - int(entry["first"])
            _stats(entry, arr, t)
            chunks[ci] = entry
        self.chunks.append(chunks)
        self.group_rows.append(n)
        self._facts(dec, union)
        self.rows += n
        return out

    def _facts(self, dec: Decoded, union: SchemaVersion) -> None:
        """Commit timestamps, deletions and the key range of a group's rows."""
        ts = dec.commit_ts
        self.min_ts = int(ts.min()) if self.min_ts is None else min(self.min_ts, int(ts.min()))
        self.max_ts = max(self.max_ts, int(ts.max()))
        if dec.deleted.any():
            self.deletions += int(dec.deleted.sum())
            self.deletions_max_ts = max(self.deletions_max_ts, int(ts[dec.deleted].max()))
        enc = np.sort(encode_columns(union.pk, key_arrays(union.pk, dec.batch)))
        lo, hi = key_bytes(enc[0]), key_bytes(enc[-1])
        self.kmin = lo if self.kmin is None else min(self.kmin, lo)
        self.kmax = hi if self.kmax is None else max(self.kmax, hi)

    def meta(self, cluster: ClusterRange | None) -> bytes:
        cols = np.zeros(len(self.types), COLUMN)
        cols["id"] = self.ids
        codes = [type_code(t) for t in self.types]
        cols["type"] = [c[0] for c in codes]
        cols["elem"] = [c[1] for c in codes]
        chunks = np.zeros((len(self.chunks), len(self.types)), CHUNK)
        for g, got in enumerate(self.chunks):
            chunks[g]["first"] = len(self.pages)  # a column the group lacks: no pages, every row null
            chunks[g]["nulls"] = self.group_rows[g]
            chunks[g]["distinct"] = 0
            for ci, entry in got.items():
                chunks[g, ci] = entry
        pages = np.zeros(len(self.pages), PAGE)
        if self.pages:
            pages["off"], pages["len"], pages["first"], pages["rows"] = np.array(self.pages, np.int64).T
        vers = b"".join(self._version(s) for _, s in sorted(self.versions.items()))
        kmin, kmax = self.kmin or b"", self.kmax or b""
        head = META_HEAD.pack(len(self.types), len(self.chunks), len(self.pages), len(self.versions), GROUP_ROWS,
                              len(kmin), len(kmax), 0)
        return b"".join([head, cols.tobytes(), vers, chunks.tobytes(), pages.tobytes(), kmin, kmax,
                         pack_cluster(cluster)])

    def _version(self, s: SchemaVersion) -> bytes:
        idx = [self.columns[(c.id, str(c.type))] for c in s.columns]
        body = VERSION_HEAD.pack(s.version, len(s.columns), len(s.primary_key), s.partition_key, 0)
        body += np.array([(i, int(c.nullable)) for i, c in zip(idx, s.columns)], "<u2").tobytes()
        body += np.array([self.columns[(cid, str(s.by_id(cid).type))] for cid in s.primary_key],  # type: ignore[union-attr]
                         "<u2").tobytes()
        return body


def _page_rows(arr: pa.Array, t: ColumnType) -> int:
    """Rows per page of a chunk: about ``PAGE_BYTES`` of plain values, a multiple of 8."""
    if t.variable:
        width = 4 + max(1, arr.nbytes // max(len(arr), 1))
    else:
        width = int(np.dtype(t.storage()).itemsize)
    return int(max(8, PAGE_BYTES // width // 8 * 8))


async def columnar_bytes(segid: int, batches: AsyncIterable[RowBatch], schemas: Callable[[int], SchemaVersion],
                         key_schema: SchemaVersion, stats: dict[str, Any] | None = None,
                         cluster: ClusterRange | None = None) -> AsyncIterator[bytes]:
    """Stream a columnar sealed segment from committed row batches, in localid order: groups
    of ``GROUP_ROWS`` rows, each page one block; then the metadata and the trailer."""
    w = _Writer(segid, schemas, key_schema)
    pending: list[_Piece] = []
    have = 0
    async for b in batches:
        starts = np.asarray(b.starts, np.int64)
        if len(starts) == 0:
            continue
        piece = _Piece(np.asarray(b.rows, np.uint8), starts)
        while have + len(piece.starts) >= GROUP_ROWS:
            cut = GROUP_ROWS - have
            head, piece = _split(piece, cut)
            for page in await asyncio.to_thread(w.group, _join([*pending, head])):
                yield Aligned(page)
            pending, have = [], 0
        if len(piece.starts):
            pending.append(piece)
            have += len(piece.starts)
    if pending:
        for page in await asyncio.to_thread(w.group, _join(pending)):
            yield Aligned(page)
    if len(w.versions) > 0xFFFF or len(w.types) > 0xFFFF:
        raise RowCorruptionError(f"segment {segid}", None, "too many schema versions or columns in one segment")
    meta = w.meta(cluster)
    yield meta
    yield pack_trailer(segid, w, len(meta), crc32c(meta))
    if stats is not None:
        stats.update(rows=w.rows, rows_len=w.pos, min_ts=w.min_ts, max_ts=w.max_ts, deletions=w.deletions,
                     deletions_max_ts=w.deletions_max_ts, format=COL_VERSION)


def pack_trailer(segid: int, w: _Writer, meta_len: int, meta_crc: int) -> bytes:
    body = TRAILER.pack(segid, len(w.chunks), w.rows, w.pos, meta_len, meta_crc, w.min_ts or 0, w.max_ts,
                        len(w.types), len(w.pages), len(w.versions), GROUP_ROWS, bytes(48), COL_VERSION,
                        TRAILER_LEN, 0, COL_MAGIC)
    return body[:116] + struct.pack("<I", crc32c(body[:116])) + COL_MAGIC


def _split(p: _Piece, k: int) -> tuple[_Piece, _Piece]:
    if k >= len(p.starts):
        return p, _Piece(p.buf[:0], p.starts[:0])
    cut = int(p.starts[k])
    return _Piece(p.buf[:cut], p.starts[:k]), _Piece(p.buf[cut:], p.starts[k:] - cut)


def _join(pieces: list[_Piece]) -> _Piece:
    if len(pieces) == 1:
        return pieces[0]
    base = np.cumsum([0] + [len(p.buf) for p in pieces[:-1]])
    return _Piece(np.concatenate([p.buf for p in pieces]), np.concatenate([p.starts + b for p, b in zip(pieces, base)]))


# -- statistics ---------------------------------------------------------------------------------

_SIGNED = {Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.TIMESTAMP, Kind.DATE, Kind.BOOL}
_UNSIGNED = {Kind.UINT8, Kind.UINT16, Kind.UINT32, Kind.UINT64}
_BYTES = {Kind.STRING, Kind.JSON, Kind.BINARY, Kind.UUID}


def _stats(entry: np.ndarray, arr: pa.Array, t: ColumnType) -> None:
    """Null count, distinct count (where a hash of the values is enough) and bounds."""
    k = t.kind
    entry["nulls"] = arr.null_count
    entry["distinct"] = NO_DISTINCT
    if k in (Kind.POINT, Kind.BOX, Kind.RANGE):
        if k != Kind.RANGE:
            _box_stats(entry, arr, k)
        return
    valid = arr.drop_null() if arr.null_count else arr
    # cheap only where values repeat: a hash of a high-cardinality chunk costs more than its encoding
    if pc.count_distinct(valid.slice(0, 1024)).as_py() * 4 <= min(len(valid), 1024):
        entry["distinct"] = pc.count_distinct(valid).as_py()
    if len(valid) == 0:
        return
    if k in _BYTES:
        vals = valid.cast(pa.binary()) if k != Kind.BINARY else valid
        mm = pc.min_max(vals)
        lo, hi = mm["min"].as_py(), _upper(mm["max"].as_py())
        if hi is None:
            return
        _put(entry, lo[:STAT_BYTES], hi)
    elif k in (Kind.FLOAT32, Kind.FLOAT64):
        v = valid.to_numpy(zero_copy_only=False).astype(np.float64)
        v = v[~np.isnan(v)]
        if len(v) == 0:
            return
        _put(entry, struct.pack("<d", v.min()), struct.pack("<d", v.max()))
    else:
        if k == Kind.TIMESTAMP:
            valid = valid.cast(pa.int64())
        elif k == Kind.DATE:
            valid = valid.cast(pa.int32())
        v = valid.to_numpy(zero_copy_only=False)
        fmt = "<Q" if k in _UNSIGNED else "<q"
        _put(entry, struct.pack(fmt, int(v.min())), struct.pack(fmt, int(v.max())))


def _put(entry: np.ndarray, lo: bytes, hi: bytes) -> None:
    entry["min"][: len(lo)] = np.frombuffer(lo, np.uint8)
    entry["max"][: len(hi)] = np.frombuffer(hi, np.uint8)
    entry["min_len"], entry["max_len"] = len(lo), len(hi)
    entry["flags"] = HAS_MINMAX


def _upper(v: bytes) -> bytes | None:
    """An upper bound of ``v`` in at most ``STAT_BYTES`` bytes (None: none that short)."""
    if len(v) <= STAT_BYTES:
        return v
    p = bytearray(v[:STAT_BYTES])
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def _box_stats(entry: np.ndarray, arr: pa.Array, k: Kind) -> None:
    """The extent of the points (or boxes): (xmin, ymin) and (xmax, ymax) as float64."""
    valid = arr.drop_null() if arr.null_count else arr
    if len(valid) == 0:
        return
    names = ("x", "y", "x", "y") if k == Kind.POINT else ("xmin", "ymin", "xmax", "ymax")
    vals = [valid.field(n).to_numpy(zero_copy_only=False) for n in names]
    ext = [np.nanmin(vals[0]), np.nanmin(vals[1]), np.nanmax(vals[2]), np.nanmax(vals[3])]
    if any(np.isnan(ext)):
        return
    _put(entry, struct.pack("<2d", ext[0], ext[1]), struct.pack("<2d", ext[2], ext[3]))


def _check_stats(entry: np.ndarray, arr: pa.Array, t: ColumnType, where: str, g: int) -> None:
    """A chunk's statistics hold for its decoded values (fsck)."""
    fresh = np.zeros((), CHUNK)
    _stats(fresh, arr, t)
    if int(entry["nulls"]) != int(fresh["nulls"]):
        raise ColumnCorruptionError(where, None, f"group {g}: null count {int(entry['nulls'])}, the pages hold "
                                                 f"{int(fresh['nulls'])}")
    if int(entry["distinct"]) != NO_DISTINCT and int(entry["pages"]) and int(entry["distinct"]) != int(
            pc.count_distinct(arr.drop_null() if arr.null_count else arr).as_py()):
        raise ColumnCorruptionError(where, None, f"group {g}: distinct count {int(entry['distinct'])}, the pages "
                                                 f"hold {int(fresh['distinct'])}")
    if not int(entry["flags"]) & HAS_MINMAX:
        return
    if not int(fresh["flags"]) & HAS_MINMAX:
        raise ColumnCorruptionError(where, None, f"group {g}: bounds kept for values that have none")
    lo, hi = bounds(entry, t)
    flo, fhi = bounds(fresh, t)
    if _below(flo, lo) or _below(hi, fhi):
        raise ColumnCorruptionError(where, None, f"group {g}: the values lie outside the chunk's bounds")


def _below(a: Any, b: Any) -> bool:
    """a < b; for (x, y) pairs: either coordinate."""
    if isinstance(a, tuple):
        return bool(a[0] < b[0] or a[1] < b[1])
    return bool(a < b)


def bounds(entry: np.ndarray, t: ColumnType) -> tuple[Any, Any]:
    """A chunk entry's (min, max) as values (``stat_value``)."""
    return (stat_value(t, entry["min"].tobytes(), int(entry["min_len"])),
            stat_value(t, entry["max"].tobytes(), int(entry["max_len"])))


def stat_value(t: ColumnType, raw: bytes, n: int) -> int | float | bytes | tuple[float, float]:
    """A chunk's min or max as a value: ints, floats, bytes (strings as UTF-8), (x, y)."""
    k = t.kind
    if k in _BYTES:
        return raw[:n]
    if k in (Kind.POINT, Kind.BOX):
        x, y = struct.unpack("<2d", raw[:16])
        return (x, y)
    if k in (Kind.FLOAT32, Kind.FLOAT64):
        return float(struct.unpack("<d", raw[:8])[0])
    return int(struct.unpack("<Q" if k in _UNSIGNED else "<q", raw[:8])[0])


# -- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnarFooter:
    """What a version-2 segment's trailer and metadata say of it as a whole (the names are
    those of the row-wise ``Footer`` where they mean the same)."""

    segid: int
    rows: int
    rows_len: int  # bytes of the page section
    min_ts: int
    max_ts: int
    versions: tuple[int, ...]
    min_key: bytes
    max_key: bytes
    cluster: ClusterRange | None

    @property
    def min_key_len(self) -> int:
        return len(self.min_key)

    @property
    def max_key_len(self) -> int:
        return len(self.max_key)


@dataclass(frozen=True)
class Meta:
    ids: np.ndarray  # column id per column index
    types: tuple[ColumnType, ...]
    versions: dict[int, SchemaVersion]  # the rows' schema versions, columns named c<id>
    chunks: np.ndarray  # (groups, columns) of CHUNK
    pages: np.ndarray  # PAGE
    group_rows: int


def is_columnar(tail: bytes) -> bool:
    """Whether an object's last bytes are a version-2 trailer's."""
    return tail[-8:] == COL_MAGIC


class DecodedPages:
    """Decoded pages of point reads, least recently used first out, bounded in bytes: a hot
    row's pages are decoded once, not at every read (scans never enter it)."""

    def __init__(self, capacity: int):
        self.capacity, self.used = capacity, 0
        self._d: OrderedDict[tuple[str, int], pa.Array] = OrderedDict()

    def get(self, key: tuple[str, int]) -> pa.Array | None:
        arr = self._d.get(key)
        if arr is not None:
            self._d.move_to_end(key)
        return arr

    def put(self, key: tuple[str, int], arr: pa.Array) -> None:
        if key in self._d:
            return
        self._d[key] = arr
        self.used += arr.nbytes
        while self.used > self.capacity and self._d:
            _, old = self._d.popitem(last=False)
            self.used -= old.nbytes


DECODED = DecodedPages(32 << 20)  # a node's decoded pages of columnar segments (object key, page)


class ColumnarSegment:
    format = COL_VERSION

    def __init__(self, sf: SealedFile, footer: ColumnarFooter, meta: Meta):
        self.sf, self.footer, self.meta, self.where = sf, footer, meta, sf.where
        self._cols: dict[tuple[int, str], int] = {(int(i), str(t)): n for n, (i, t) in
                                                  enumerate(zip(meta.ids.tolist(), meta.types))}
        self.union = _union(meta)
        # (group, column index) -> (its first page, its pages' first rows): a point read's lookups
        self._firsts: dict[tuple[int, int], tuple[int, list[int]]] = {}
        self._plans: dict[int, tuple[SchemaVersion, list[tuple[str, int]]]] = {}  # id(target) -> its columns here

    @property
    def segid(self) -> int:
        return self.footer.segid

    @property
    def groups(self) -> int:
        return int(self.meta.chunks.shape[0])

    @classmethod
    async def open(cls, sf: SealedFile) -> "ColumnarSegment":
        at = sf.size - TRAILER_LEN
        if at < 0:
            raise RowCorruptionError(sf.where, 0, "file too short for a segment trailer")
        raw = await sf.read(at, TRAILER_LEN)
        t = unpack_trailer(raw, sf.where, at)
        where = f"{sf.where} segment {t['segid']}"
        if t["meta_off"] + t["meta_len"] != at:
            raise ColumnCorruptionError(where, at, "metadata does not end at the trailer")
        meta_raw = await sf.read(t["meta_off"], t["meta_len"])
        if len(meta_raw) != t["meta_len"] or crc32c(meta_raw) != t["meta_crc"]:
            raise ColumnCorruptionError(f"{where} metadata", t["meta_off"], "metadata checksum mismatch")
        meta, kmin, kmax, cluster = parse_meta(meta_raw, t, f"{where} metadata")
        footer = ColumnarFooter(t["segid"], t["rows"], t["meta_off"], t["min_ts"], t["max_ts"],
                                tuple(sorted(meta.versions)), kmin, kmax, cluster)
        return cls(sf, footer, meta)

    def column_where(self, ci: int) -> str:
        return f"{self.where} segment {self.segid} column {_name(int(self.meta.ids[ci]))}"

    def index_of(self, col: Column) -> int:
        """The column index holding ``col`` (matched by id and type), or -1."""
        return self._cols.get((col.id, str(col.type)), -1)

    # -- pages --

    def _page_span(self, g: int, ci: int) -> tuple[int, int]:
        c = self.meta.chunks[g, ci]
        return int(c["first"]), int(c["first"]) + int(c["pages"])

    async def _page(self, p: int, ci: int) -> pa.Array:
        off, ln = int(self.meta.pages["off"][p]), int(self.meta.pages["len"][p])
        try:
            raw = await self.sf.read(off, ln)
        except FileCorruptionError as e:
            raise ColumnCorruptionError(self.column_where(ci), e.offset, e.reason) from e
        return decode_page(raw, self.meta.types[ci], self.column_where(ci), off)

    async def _pages(self, need: list[tuple[int, int]]) -> list[pa.Array]:
        """Pages (index, column index): decoded ones from ``DECODED``, the others read at once
        (``SealedFile.read_spans``), decoded and kept there."""
        got: dict[int, pa.Array] = {}
        for p, _ in need:
            hit = DECODED.get((self.where, p))
            if hit is not None:
                got[p] = hit
        todo = [(p, ci) for p, ci in need if p not in got]
        spans = [(int(self.meta.pages["off"][p]), int(self.meta.pages["len"][p])) for p, _ in todo]
        try:
            raws = await self.sf.read_spans(spans) if todo else []
        except FileCorruptionError:  # a damaged block: read page by page, so the error names its column
            raws = None
        for i, (p, ci) in enumerate(todo):
            arr = await self._page(p, ci) if raws is None else \
                decode_page(raws[i], self.meta.types[ci], self.column_where(ci), spans[i][0])
            DECODED.put((self.where, p), arr)
            got[p] = arr
        return [got[p] for p, _ in need]

    def _page_cached(self, p: int, ci: int) -> pa.Array | None:
        hit = DECODED.get((self.where, p))
        if hit is not None:
            return hit
        off, ln = int(self.meta.pages["off"][p]), int(self.meta.pages["len"][p])
        raw = self.sf.read_cached(off, ln)
        if raw is None:
            return None
        arr = decode_page(raw, self.meta.types[ci], self.column_where(ci), off)
        DECODED.put((self.where, p), arr)
        return arr

    async def chunk_bytes(self, g: int, ci: int) -> tuple[memoryview, int]:
        """A chunk's pages with one sequential read (not cached): (bytes, their offset)."""
        a, b = self._page_span(g, ci)
        if a == b:
            return memoryview(b""), 0
        lo = int(self.meta.pages["off"][a])
        hi = int(self.meta.pages["off"][b - 1]) + int(self.meta.pages["len"][b - 1])
        try:
            data = await self.sf.read_sequential(lo, hi - lo)
        except FileCorruptionError as e:
            raise ColumnCorruptionError(self.column_where(ci), e.offset, e.reason) from e
        if len(data) != hi - lo:
            raise ColumnCorruptionError(self.column_where(ci), lo, "pages past the end of the segment")
        return data, lo

    def decode_chunk(self, g: int, ci: int, data: memoryview, lo: int) -> pa.Array:
        """A chunk's values from its pages' bytes (a chunk without pages: every row null)."""
        a, b = self._page_span(g, ci)
        n = self.group_len(g)
        t = self.meta.types[ci]
        if a == b:
            return pa.nulls(n, t.arrow())
        parts = []
        for p in range(a, b):
            off, ln = int(self.meta.pages["off"][p]), int(self.meta.pages["len"][p])
            parts.append(decode_page(data[off - lo : off - lo + ln], t, self.column_where(ci), off))
        got = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        if len(got) != n:
            raise ColumnCorruptionError(self.column_where(ci), lo, f"chunk of group {g} holds {len(got)} rows, not {n}")
        return got

    def group_len(self, g: int) -> int:
        return min(self.meta.group_rows, self.footer.rows - g * self.meta.group_rows)

    # -- whole groups (scans) --

    def _wanted(self, target: SchemaVersion) -> list[int]:
        return [0, 1, 2] + sorted({ci for c in target.columns if (ci := self.index_of(c)) >= 0})

    async def read_group(self, g: int, target: SchemaVersion) -> Decoded:
        """Every row of group ``g`` with ``target``'s columns (only those are read)."""
        want = self._wanted(target)
        got = [await self.chunk_bytes(g, ci) for ci in want]
        return await asyncio.to_thread(self._assemble, g, target, want, got)

    def _assemble(self, g: int, target: SchemaVersion, want: list[int], got: list[tuple[memoryview, int]]) -> Decoded:
        arrays = {ci: self.decode_chunk(g, ci, data, lo) for ci, (data, lo) in zip(want, got)}
        return self._decoded(target, arrays, self.group_len(g))

    def _decoded(self, target: SchemaVersion, arrays: dict[int, pa.Array], n: int) -> Decoded:
        cols = []
        for c in target.columns:
            ci = self.index_of(c)
            cols.append(arrays[ci] if ci >= 0 else pa.nulls(n, c.type.arrow()))
        batch = pa.RecordBatch.from_arrays(cols, schema=target.arrow())
        ts = np.asarray(arrays[0].to_numpy(zero_copy_only=False), np.uint64)
        flags = np.asarray(arrays[1].to_numpy(zero_copy_only=False), np.uint8)
        vers = np.asarray(arrays[2].to_numpy(zero_copy_only=False), np.uint32)
        return Decoded(batch, ts, (flags & 1) != 0, vers)

    async def scan(self, schemas: Callable[[int], SchemaVersion] | None, target: SchemaVersion,
                   groups: np.ndarray | None = None) -> AsyncIterator[Decoded]:
        """The groups' rows in localid order (``groups``: a mask of those to read; the rest are
        skipped without a read). ``schemas`` is not needed: a columnar segment names its
        columns by id and type."""
        async for _, d in self.scan_groups(target, groups):
            yield d

    async def scan_groups(self, target: SchemaVersion,
                          groups: np.ndarray | None = None) -> AsyncIterator[tuple[int, Decoded]]:
        """(group, its rows) for the groups in ``groups`` (all by default), two in flight."""
        todo = iter([g for g in range(self.groups) if groups is None or groups[g]])
        ahead: deque[tuple[int, asyncio.Future[Decoded]]] = deque()
        try:
            for g in itertools.islice(todo, 2):
                ahead.append((g, asyncio.ensure_future(self.read_group(g, target))))
            while ahead:
                g, fut = ahead.popleft()
                done = await fut
                nxt = next(todo, None)
                if nxt is not None:
                    ahead.append((nxt, asyncio.ensure_future(self.read_group(nxt, target))))
                yield g, done
        finally:
            for _, fut in ahead:
                fut.cancel()
                fut.add_done_callback(_consume)

    # -- rows by localid --

    async def take(self, localids: np.ndarray, target: SchemaVersion) -> Decoded:
        """Rows by localid (sorted, no duplicates) with ``target``'s columns: only the pages
        holding wanted rows of the wanted columns, read at once through the block cache."""
        locs = np.asarray(localids, np.int64)
        if len(locs) and (locs[0] < 0 or locs[-1] >= self.footer.rows):
            raise RowCorruptionError(self.where, None, f"no row {int(locs[-1])} in segment {self.segid}")
        want = self._wanted(target)
        plan = [(g, ci, *self._pages_for(g, ci, locs[(locs // self.meta.group_rows) == g]))
                for g in np.unique(locs // self.meta.group_rows).tolist() for ci in want]
        need = sorted({(p, ci) for _, ci, _, which in plan for p in np.unique(which).tolist() if p >= 0})
        got = dict(zip(need, await self._pages(need)))
        parts: list[Decoded] = []
        for i in range(0, len(plan), len(want)):
            arrays = {ci: self._pick(ci, sel, which, got) for _, ci, sel, which in plan[i : i + len(want)]}
            parts.append(self._decoded(target, arrays, len(plan[i][2])))
        if not parts:
            return self._decoded(target, {ci: pa.array([], self.meta.types[ci].arrow()) for ci in want}, 0)
        if len(parts) == 1:
            return parts[0]
        t = pa.Table.from_batches([p.batch for p in parts]).combine_chunks()
        return Decoded(t.to_batches()[0], np.concatenate([p.commit_ts for p in parts]),
                       np.concatenate([p.deleted for p in parts]), np.concatenate([p.schema_ver for p in parts]))

    def _pages_for(self, g: int, ci: int, locs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the localids, the page holding each; -1 each when the chunk has no pages)."""
        a, b = self._page_span(g, ci)
        if a == b:
            return locs, np.full(len(locs), -1, np.int64)
        firsts = self.meta.pages["first"][a:b].astype(np.int64)
        return locs, np.searchsorted(firsts, locs, "right") - 1 + a

    def _pick(self, ci: int, locs: np.ndarray, which: np.ndarray, pages: dict[tuple[int, int], pa.Array]) -> pa.Array:
        """The values of ``locs`` from their decoded pages."""
        if len(which) and which[0] < 0:
            return pa.nulls(len(locs), self.meta.types[ci].arrow())
        out = []
        for p in np.unique(which).tolist():
            page, rows = pages[(p, ci)], int(self.meta.pages["rows"][p])
            if len(page) != rows:
                raise ColumnCorruptionError(self.column_where(ci), int(self.meta.pages["off"][p]),
                                            f"page holds {len(page)} rows, not {rows}")
            out.append(page.take(pa.array(locs[which == p] - int(self.meta.pages["first"][p]))))
        return pa.concat_arrays(out) if len(out) > 1 else out[0]

    def _take_cached(self, localid: int) -> Decoded | None:
        """One row of the union schema from pages in the memory cache, or None."""
        g = localid // self.meta.group_rows
        locs = np.array([localid])
        arrays = {}
        for ci in self._wanted(self.union):
            _, which = self._pages_for(g, ci, locs)
            pages = {}
            if which[0] >= 0:
                page = self._page_cached(int(which[0]), ci)
                if page is None:
                    return None
                pages[(int(which[0]), ci)] = page
            arrays[ci] = self._pick(ci, locs, which, pages)
        return self._decoded(self.union, arrays, 1)

    # -- rows as row bytes (point reads, the garbage collector) --

    def _version_rows(self, dec: Decoded) -> tuple[np.ndarray, np.ndarray]:
        """Rows decoded into the union schema re-encoded as row bytes, each in its own schema
        version (docs/format/segment.md §1), with its commit_ts and flags: (bytes, starts)."""
        n = dec.batch.num_rows
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for v in np.unique(dec.schema_ver).tolist():
            s = self.meta.versions.get(int(v))
            if s is None:
                raise ColumnCorruptionError(f"{self.where} segment {self.segid}", None,
                                            f"a row names schema version {v}, which the metadata lacks")
            sel = np.flatnonzero(dec.schema_ver == v)
            enc = encode_rows(dec.batch.take(pa.array(sel)), s, 0, dec.deleted[sel])
            buf = enc.buf
            if len(sel):  # each row's own commit timestamp (encode_rows writes one for all)
                ts = dec.commit_ts[sel].astype("<u8").view(np.uint8).reshape(-1, 8)
                buf[enc.starts[:, None] + np.arange(8, 16)] = ts
            parts.append((buf, enc.starts, sel))
        if len(parts) == 1 and np.array_equal(parts[0][2], np.arange(n)):
            return parts[0][0], parts[0][1]
        lens = np.zeros(n, np.int64)
        for buf, starts, sel in parts:
            lens[sel] = np.diff(np.append(starts, len(buf)))
        out_starts = np.zeros(n, np.int64)
        np.cumsum(lens[:-1], out=out_starts[1:])
        out = np.empty(int(lens.sum()), np.uint8)
        for buf, starts, sel in parts:
            ln = np.diff(np.append(starts, len(buf)))
            idx = np.repeat(out_starts[sel] - starts, ln) + np.arange(len(buf))
            out[idx] = buf
        return out, out_starts

    async def row_bytes(self, localid: int) -> bytes:
        dec = await self.take(np.array([localid]), self.union)
        buf, _ = self._version_rows(dec)
        return buf.tobytes()

    def row_cached(self, localid: int, target: SchemaVersion) -> dict[str, Any] | None:
        """One row as a dict of ``target``'s columns, exactly as ``take(...).batch.to_pylist()[0]``
        gives it, from decoded pages (``DECODED``) or pages in the block cache; None when a
        page must be read. A point read's hot path: no Arrow batch, no row bytes, and the
        column and page lookups kept per segment (they were half of a hot read's time)."""
        g = localid // self.meta.group_rows
        out: dict[str, Any] = {}
        for name, ci in self._plan(target):
            if ci < 0:
                out[name] = None
                continue
            a, firsts = self._chunk_pages(g, ci)
            if not firsts:
                out[name] = None
                continue
            i = bisect_right(firsts, localid) - 1
            page = self._page_cached(a + i, ci)
            if page is None:
                return None
            out[name] = page[localid - firsts[i]].as_py()
        return out

    def _plan(self, target: SchemaVersion) -> list[tuple[str, int]]:
        """``target``'s columns as (name, column index here or -1), kept per target object."""
        got = self._plans.get(id(target))
        if got is None or got[0] is not target:
            if len(self._plans) >= 64:  # targets are a table's few schema versions; never grow
                self._plans.clear()
            got = self._plans[id(target)] = (target, [(c.name, self.index_of(c)) for c in target.columns])
        return got[1]

    def _chunk_pages(self, g: int, ci: int) -> tuple[int, list[int]]:
        """A column chunk's first page and its pages' first rows."""
        got = self._firsts.get((g, ci))
        if got is None:
            a, b = self._page_span(g, ci)
            got = self._firsts[(g, ci)] = (a, self.meta.pages["first"][a:b].tolist())
        return got

    async def row(self, localid: int, target: SchemaVersion) -> dict[str, Any]:
        """``row_cached``, reading what it needs."""
        got = self.row_cached(localid, target)
        if got is None:
            await self.take(np.array([localid]), target)  # its pages read and decoded at once
            got = self.row_cached(localid, target)
        if got is None:  # evicted in between by other reads: decode from the batch
            got = (await self.take(np.array([localid]), target)).batch.to_pylist()[0]
        return got

    def row_bytes_cached(self, localid: int) -> bytes | None:
        """``row_bytes`` without I/O: when every page it needs is in the memory cache."""
        if not 0 <= localid < self.footer.rows:
            return None
        dec = self._take_cached(localid)
        return None if dec is None else self._version_rows(dec)[0].tobytes()

    async def verify(self) -> None:
        """Every invariant of docs/format/segment.md §7.4 that reading checks nothing of: each
        page decoded, each chunk's null count, distinct count and bounds against its values,
        the rows' versions, commit timestamps and key range against the metadata."""
        kmin: bytes | None = None
        kmax: bytes | None = None
        for g in range(self.groups):
            for ci in range(len(self.meta.types)):
                data, lo = await self.chunk_bytes(g, ci)
                arr = await asyncio.to_thread(self.decode_chunk, g, ci, data, lo)
                _check_stats(self.meta.chunks[g, ci], arr, self.meta.types[ci], self.column_where(ci), g)
            dec = await self.read_group(g, self.union)
            if dec.batch.num_rows:
                self._check_rows(g, dec)
                keys = np.sort(encode_columns(self.union.pk, key_arrays(self.union.pk, dec.batch)))
                lo_k, hi_k = key_bytes(keys[0]), key_bytes(keys[-1])
                kmin = lo_k if kmin is None else min(kmin, lo_k)
                kmax = hi_k if kmax is None else max(kmax, hi_k)
        if (kmin or b"", kmax or b"") != (self.footer.min_key, self.footer.max_key):
            raise ColumnCorruptionError(f"{self.where} segment {self.segid} metadata", None,
                                        "the key range is not the rows' smallest and largest key")

    def _check_rows(self, g: int, dec: Decoded) -> None:
        f = self.footer
        if not np.isin(dec.schema_ver, np.array(sorted(self.meta.versions), np.uint32)).all():
            raise ColumnCorruptionError(self.column_where(2), None, f"group {g}: a row names a schema version "
                                                                   "the version table lacks")
        if int(dec.commit_ts.min()) < f.min_ts or int(dec.commit_ts.max()) > f.max_ts:
            raise ColumnCorruptionError(self.column_where(0), None, f"group {g}: a commit timestamp lies outside "
                                                                   "the trailer's range")

    async def as_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row as row bytes (the garbage collector's input): (bytes, starts)."""
        bufs, starts, base = [], [], 0
        async for dec in self.scan(None, self.union):
            buf, st = await asyncio.to_thread(self._version_rows, dec)
            bufs.append(buf)
            starts.append(st + base)
            base += len(buf)
        if not bufs:
            return np.zeros(0, np.uint8), np.zeros(0, np.int64)
        return np.concatenate(bufs), np.concatenate(starts)


def _consume(fut: asyncio.Future[Decoded]) -> None:
    if not fut.cancelled():
        fut.exception()


def _name(cid: int) -> str:
    return {TS_ID: "commit_ts", FLAGS_ID: "flags", VERSION_ID: "schema_version"}.get(cid, f"id {cid}")


def unpack_trailer(raw: bytes, where: str, at: int) -> dict[str, int]:
    if len(raw) != TRAILER_LEN or raw[-8:] != COL_MAGIC:
        raise RowCorruptionError(where, at, "no columnar segment trailer")
    f = TRAILER.unpack(raw)
    if crc32c(raw[:116]) != f[15]:
        raise RowCorruptionError(where, at, "segment trailer checksum mismatch")
    if f[13] != COL_VERSION or f[14] != TRAILER_LEN:
        raise RowCorruptionError(where, at, f"unsupported segment version {f[13]}")
    return dict(segid=f[0], groups=f[1], rows=f[2], meta_off=f[3], meta_len=f[4], meta_crc=f[5], min_ts=f[6],
                max_ts=f[7], columns=f[8], pages=f[9], versions=f[10], group_rows=f[11])


def parse_meta(raw: bytes, t: dict[str, int], where: str) -> tuple[Meta, bytes, bytes, ClusterRange | None]:
    """The metadata section, every count checked against the trailer and every page against
    the page section."""
    try:
        return _parse_meta(raw, t, where)
    except (ValueError, KeyError, struct.error, IndexError) as e:
        raise ColumnCorruptionError(where, t["meta_off"], f"metadata does not parse: {e}") from None


def _parse_meta(raw: bytes, t: dict[str, int], where: str) -> tuple[Meta, bytes, bytes, ClusterRange | None]:
    ncol, ngrp, npage, nver, group_rows, kmin_len, kmax_len, _ = META_HEAD.unpack_from(raw, 0)
    if (ncol, ngrp, npage, nver, group_rows) != (t["columns"], t["groups"], t["pages"], t["versions"],
                                                 t["group_rows"]) or group_rows == 0:
        raise ColumnCorruptionError(where, t["meta_off"], "metadata counts disagree with the trailer")
    if ngrp != -(-t["rows"] // group_rows):
        raise ColumnCorruptionError(where, t["meta_off"], f"{ngrp} groups for {t['rows']} rows")
    at = META_HEAD.size
    cols = np.frombuffer(raw, COLUMN, ncol, at)
    at += COLUMN.itemsize * ncol
    types = tuple(_type(int(c["type"]), int(c["elem"])) for c in cols)
    if [(int(i), str(ty)) for i, ty in zip(cols["id"][:3], types[:3])] != [(i, str(ty)) for i, ty in SYSTEM]:
        raise ColumnCorruptionError(where, t["meta_off"], "the column table does not start with the system columns")
    versions: dict[int, SchemaVersion] = {}
    for _ in range(nver):
        v, nc, nk, pkey, _z = VERSION_HEAD.unpack_from(raw, at)
        at += VERSION_HEAD.size
        body = np.frombuffer(raw, "<u2", 2 * nc, at).reshape(-1, 2)
        at += 4 * nc
        key = np.frombuffer(raw, "<u2", nk, at)
        at += 2 * nk
        columns = tuple(Column(int(cols["id"][i]), f"c{int(cols['id'][i])}", types[i], bool(nl)) for i, nl in body)
        versions[v] = SchemaVersion(v, columns, tuple(int(cols["id"][i]) for i in key),
                                    max([c.id for c in columns] + [0]) + 1, pkey)
    chunks = np.frombuffer(raw, CHUNK, ngrp * ncol, at).reshape(ngrp, ncol)
    at += CHUNK.itemsize * ngrp * ncol
    pages = np.frombuffer(raw, PAGE, npage, at)
    at += PAGE.itemsize * npage
    kmin, kmax = raw[at : at + kmin_len], raw[at + kmin_len : at + kmin_len + kmax_len]
    at += kmin_len + kmax_len
    cluster = unpack_cluster(raw[at : at + 24], where, at)
    if at + 24 != len(raw):
        raise ColumnCorruptionError(where, t["meta_off"], "metadata length disagrees with its contents")
    _check_pages(chunks, pages, t, where, group_rows)
    return Meta(cols["id"].copy(), types, versions, chunks, pages, group_rows), kmin, kmax, cluster


def _check_pages(chunks: np.ndarray, pages: np.ndarray, t: dict[str, int], where: str, group_rows: int) -> None:
    """Pages packed from 0 in directory order, ending at the metadata; each chunk's pages
    consecutive and covering its group's rows exactly."""
    off = pages["off"].astype(np.int64)
    ln = pages["len"].astype(np.int64)
    if len(pages) and (off[0] != 0 or np.any(off[1:] != (off + ln)[:-1]) or int(off[-1] + ln[-1]) != t["meta_off"]):
        raise ColumnCorruptionError(where, t["meta_off"], "pages are not packed back to back up to the metadata")
    if not len(pages) and t["meta_off"] != 0:
        raise ColumnCorruptionError(where, t["meta_off"], "page section without pages")
    first, count = chunks["first"].astype(np.int64), chunks["pages"].astype(np.int64)
    if np.any(first + count > len(pages)):
        raise ColumnCorruptionError(where, t["meta_off"], "a chunk names pages past the directory")
    rows = pages["rows"].astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(rows)])
    for g in range(chunks.shape[0]):
        n = min(group_rows, t["rows"] - g * group_rows)
        has = count[g] > 0
        got = cum[first[g] + count[g]] - cum[first[g]]
        if np.any(has & (got != n)):
            raise ColumnCorruptionError(where, t["meta_off"], f"group {g}'s pages do not hold its {n} rows")
        starts = pages["first"][first[g][has]].astype(np.int64)
        if np.any(starts != g * group_rows):
            raise ColumnCorruptionError(where, t["meta_off"], f"group {g}'s first page does not start at its row")
        if np.any(~has & (chunks["nulls"][g] != n)):
            raise ColumnCorruptionError(where, t["meta_off"], f"a chunk of group {g} without pages is not all null")


def _type(code: int, elem: int) -> ColumnType:
    if code not in KINDS or (elem and elem not in KINDS):
        raise ValueError(f"unknown type code {code}/{elem}")
    return ColumnType(KINDS[code], KINDS[elem] if elem else None)


def _union(meta: Meta) -> SchemaVersion:
    """Every column of the segment by id (``c<id>``), for decoding rows whatever their version."""
    cols: dict[int, Column] = {}
    pk: tuple[int, ...] = ()
    pkey = 1
    for v in sorted(meta.versions):
        s = meta.versions[v]
        pk, pkey = s.primary_key, s.partition_key
        for c in s.columns:
            cols.setdefault(c.id, Column(c.id, c.name, c.type, c.id not in s.primary_key))
    if not cols:  # no rows: a schema of the segment's columns alone
        return SchemaVersion(0, (Column(1, "c1", ColumnType(Kind.INT64), False),), (1,), 2)
    return SchemaVersion(0, tuple(cols.values()), pk, max(cols) + 1, pkey)


SealedReader = SealedSegment | ColumnarSegment  # a sealed segment of either format


async def open_segment(sf: SealedFile) -> SealedReader:
    """A sealed segment of either format: version 2 ends in its trailer's magic."""
    if sf.size >= TRAILER_LEN and is_columnar(await sf.read(sf.size - 8, 8)):
        return await ColumnarSegment.open(sf)
    return await SealedSegment.open(sf)
