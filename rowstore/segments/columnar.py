"""Reading a columnar sealed segment (version 2; format: docs/format/segment.md §7, why this
layout: docs/rfcs/0014-columnar-segments.md; its layout in ``columnar_layout``, its writer in
``columnar_write``).

:class:`ColumnarSegment` reads whole groups of some columns (scans), pages holding some rows
(reads by rowid), and rows re-encoded in their own schema version's row bytes
(``docs/format/segment.md`` §1) for the point-read decoders and the garbage collector;
:func:`open_segment` opens a sealed segment of either format."""
from __future__ import annotations

import asyncio
import itertools
from bisect import bisect_right
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from catalog.checksum import crc32c
from rowstore.codec.columns import decode_page, decode_page_rows
from rowstore.codec.rows import Decoded
from rowstore.errors import ColumnCorruptionError, RowCorruptionError
from rowstore.schema import Column, SchemaVersion
from rowstore.segments.columnar_layout import (
    ColumnarFooter,
    COL_VERSION,
    TRAILER_LEN,
    Meta,
    column_name,
    is_columnar,
    parse_meta,
    union_schema,
    unpack_trailer,
)
from rowstore.segments.columnar_rows import version_rows
from rowstore.segments.columnar_stats import check_stats
from rowstore.segments.decoded_pages import DECODED as DECODED, DecodedPages as DecodedPages  # re-exported
from rowstore.segments.sealed import (
    SealedSegment,
    key_bytes,
)
from rowstore.tables.keys import encode_columns, key_arrays
from terrafs.errors import FileCorruptionError
from terrafs.sealed import SealedFile

# -- reading ------------------------------------------------------------------------------------



_WHOLE_PAGE = 8  # a page read for at most 1/8 of its rows decodes those rows alone
_TAKE_BYTES = 8 << 20  # a take's pages read at once, at most (about): rows of more groups go in batches


@dataclass(frozen=True)
class _Rows:
    """Some rows of a page, decoded without the others (``ColumnarSegment._pages``)."""

    values: pa.Array


class ColumnarSegment:
    format = COL_VERSION

    def __init__(self, sf: SealedFile, footer: ColumnarFooter, meta: Meta):
        self.sf, self.footer, self.meta, self.where = sf, footer, meta, sf.where
        self._cols: dict[tuple[int, str], int] = {(int(i), str(t)): n for n, (i, t) in
                                                  enumerate(zip(meta.ids.tolist(), meta.types))}
        self.union = union_schema(meta)
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
        return f"{self.where} segment {self.segid} column {column_name(int(self.meta.ids[ci]))}"

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

    async def _pages(self, need: list[tuple[int, int]],
                     rows_of: dict[tuple[int, int], np.ndarray]) -> list[pa.Array | _Rows]:
        """Pages (index, column index): decoded ones from ``DECODED``, the others read at once
        (``SealedFile.read_spans``) — decoded whole and kept there, or, when few of their rows
        are wanted (``rows_of``: positions in the page), those rows alone (``_Rows``)."""
        got: dict[int, pa.Array | _Rows] = {}
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
            rows, n = rows_of[(p, ci)], int(self.meta.pages["rows"][p])
            if raws is not None and len(rows) * _WHOLE_PAGE <= n:
                if len(raws[i]) >= 4 and int.from_bytes(raws[i][:4], "little") != n:
                    raise ColumnCorruptionError(self.column_where(ci), spans[i][0], f"page does not hold {n} rows")
                got[p] = _Rows(decode_page_rows(raws[i], self.meta.types[ci], rows, self.column_where(ci),
                                                spans[i][0]))
                continue
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

    def _chunk_span(self, g: int, ci: int) -> tuple[int, int]:
        """(offset, length) of a chunk's pages; (0, 0) for a chunk without pages."""
        a, b = self._page_span(g, ci)
        if a == b:
            return 0, 0
        lo = int(self.meta.pages["off"][a])
        return lo, int(self.meta.pages["off"][b - 1]) + int(self.meta.pages["len"][b - 1]) - lo

    async def chunk_bytes(self, g: int, ci: int) -> tuple[memoryview, int]:
        """A chunk's pages with one sequential read (not cached): (bytes, their offset)."""
        lo, n = self._chunk_span(g, ci)
        if n == 0:
            return memoryview(b""), 0
        try:
            data = await self.sf.read_sequential(lo, n)
        except FileCorruptionError as e:
            raise ColumnCorruptionError(self.column_where(ci), e.offset, e.reason) from e
        if len(data) != n:
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
        """Every row of group ``g`` with ``target``'s columns (only those are read): their
        chunks in one request, decoded in one worker-thread hop."""
        want = self._wanted(target)
        spans = [self._chunk_span(g, ci) for ci in want]
        if all(lo + n <= self.sf.size for lo, n in spans):
            try:
                return await self.sf.read_sequential_spans(spans, lambda views: self._assemble(
                    g, target, want, [(v, lo) for v, (lo, _) in zip(views, spans)]))
            except FileCorruptionError:
                pass  # a damaged block: read chunk by chunk below, so that the error names its column
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
        holding wanted rows of the wanted columns, read through the block cache — at once, or
        for rows spread over many groups a batch of groups at a time, so what a read holds is
        bounded by ``_TAKE_BYTES`` and not by the segment (a sparse query touches every page)."""
        locs = np.asarray(localids, np.int64)
        if len(locs) and (locs[0] < 0 or locs[-1] >= self.footer.rows):
            raise RowCorruptionError(self.where, None, f"no row {int(locs[-1])} in segment {self.segid}")
        want = self._wanted(target)
        cuts = self._take_batches(locs, want)
        if len(cuts) <= 2:
            return await self._take(locs, target, want)
        parts = [await self._take(locs[a:b], target, want) for a, b in zip(cuts[:-1], cuts[1:])]
        t = pa.Table.from_batches([p.batch for p in parts]).combine_chunks()
        return Decoded(t.to_batches()[0], np.concatenate([p.commit_ts for p in parts]),
                       np.concatenate([p.deleted for p in parts]), np.concatenate([p.schema_ver for p in parts]))

    def _take_batches(self, locs: np.ndarray, want: list[int]) -> list[int]:
        """Cuts of ``locs`` (at group boundaries) into batches whose groups' chunks of the
        ``want`` columns hold about ``_TAKE_BYTES`` at most (a chunk's bytes bound its pages')."""
        gs = locs // self.meta.group_rows
        ids, starts = np.unique(gs, return_index=True)
        if len(ids) <= 1:
            return [0, len(locs)]
        ch = self.meta.chunks[ids][:, want]
        first = ch["first"].astype(np.int64)
        cum = np.r_[0, np.cumsum(self.meta.pages["len"].astype(np.int64))]
        size = (cum[first + ch["pages"].astype(np.int64)] - cum[first]).sum(axis=1)
        cuts, acc = [0], 0
        for i, n in enumerate(size.tolist()):
            if acc and acc + n > _TAKE_BYTES:
                cuts.append(int(starts[i]))
                acc = 0
            acc += n
        return cuts + [len(locs)]

    async def _take(self, locs: np.ndarray, target: SchemaVersion, want: list[int]) -> Decoded:
        plan = [(g, ci, *self._pages_for(g, ci, locs[(locs // self.meta.group_rows) == g]))
                for g in np.unique(locs // self.meta.group_rows).tolist() for ci in want]
        rows_of = {(p, ci): sel[which == p] - int(self.meta.pages["first"][p])
                   for _, ci, sel, which in plan for p in np.unique(which).tolist() if p >= 0}
        need = sorted(rows_of)
        got = dict(zip(need, await self._pages(need, rows_of)))
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

    def _pick(self, ci: int, locs: np.ndarray, which: np.ndarray,
              pages: dict[tuple[int, int], pa.Array | _Rows]) -> pa.Array:
        """The values of ``locs`` from their decoded pages (or the rows decoded of them)."""
        if len(which) and which[0] < 0:
            return pa.nulls(len(locs), self.meta.types[ci].arrow())
        out = []
        for p in np.unique(which).tolist():
            page, rows = pages[(p, ci)], int(self.meta.pages["rows"][p])
            if isinstance(page, _Rows):  # exactly the rows of locs in this page, in order
                out.append(page.values)
                continue
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
        return version_rows(dec, self.meta.versions, f"{self.where} segment {self.segid}")

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
        if got is None:  # its pages read at once, its values decoded (a page read again is decoded whole)
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
                check_stats(self.meta.chunks[g, ci], arr, self.meta.types[ci], self.column_where(ci), g)
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



SealedReader = SealedSegment | ColumnarSegment  # a sealed segment of either format


async def open_segment(sf: SealedFile) -> SealedReader:
    """A sealed segment of either format: version 2 ends in its trailer's magic."""
    if sf.size >= TRAILER_LEN and is_columnar(await sf.read(sf.size - 8, 8)):
        return await ColumnarSegment.open(sf)
    return await SealedSegment.open(sf)

