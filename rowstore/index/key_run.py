"""Immutable sorted runs of the primary-key index on TerrascaleFS (docs/format/index-run.md)."""
from __future__ import annotations

import asyncio
import struct
from collections import OrderedDict
from itertools import accumulate
from bisect import bisect_right
from typing import Any, AsyncIterator, cast

import numpy as np

from catalog.checksum import crc32c
from rowstore.errors import RowCorruptionError
from rowstore.index.key_memtable import Run, find_one, merge_runs
from rowstore.index.key_pages import _fixed_width as _fixed_width, _parse_page, parse_pages  # _fixed_width: tests
from rowstore.tables.keys import KeyRange, key_scalar
from terrafs.sealed import SealedFile

RUN_MAGIC = b"TRIDXRN1"  # part of the format
RUN_VERSION = 1
PAGE_ENTRIES = 170
PARSED_PAGES = 512  # per open run: memory is bounded by configuration, not by the run's size
_WHOLE_SHARE = 8  # a lookup needing over 1/8 of a run's pages parses the whole run (when it fits)
FOOTER = struct.Struct("<8sHBBQQIQQI8sI")
FOOTER_LEN = FOOTER.size  # 64
KINDS = {"int64": 1, "string": 2, "uuid": 3, "tuple": 4}  # tuple keys are laid out as string keys (docs/format/keys.md)
# A fence: each page's offset, its entry count and its first key. The first keys are all ints (int64
# keys) or all bytes, by the run's kind; Any: mypy cannot tie the kind to them, and they are compared.
_Fence = tuple[list[int], list[int], list[Any]]
assert FOOTER_LEN == 64


def _page(run: Run, a: int, b: int, kind: str) -> bytes:
    keys = run.keys[a:b]
    if kind == "int64":
        kb = keys.astype("<u8").tobytes()
    elif kind == "uuid":
        kb = keys.astype("S16").tobytes()
    else:
        parts = [bytes(k) for k in keys]
        ends = np.cumsum([len(p) for p in parts], dtype=np.uint32)
        kb = ends.astype("<u4").tobytes() + b"".join(parts)
    return (struct.pack("<I", b - a) + kb + run.ts[a:b].astype("<u8").tobytes()
            + run.rowids[a:b].astype("<u8").tobytes())


def _fence_key(key: np.uint64 | np.bytes_, kind: str) -> bytes:
    if kind == "int64":
        return struct.pack("<Q", int(key))
    if kind == "uuid":
        return bytes(key).ljust(16, b"\0")
    k = bytes(key)
    return struct.pack("<H", len(k)) + k


_CHUNK_PAGES = 512  # pages built per worker-thread hop


def _pages(run: Run, first: int, last: int, kind: str, pos: int) -> tuple[bytes, list[bytes], int]:
    """Pages ``first..last-1`` back to back, their fence entries, and the position after them."""
    out, fence = [], []
    for i in range(first, last):
        a, b = i * PAGE_ENTRIES, min((i + 1) * PAGE_ENTRIES, len(run))
        page = _page(run, a, b, kind)
        fence.append(struct.pack("<QI", pos, b - a) + _fence_key(run.keys[a], kind))
        pos += len(page)
        out.append(page)
    return b"".join(out), fence, pos


async def run_bytes(run: Run, kind: str, level: int) -> AsyncIterator[bytes]:
    """Stream a run's file: pages, fence, footer (pages are built in a worker thread, a chunk
    at a time: a checkpoint of a large memtable must not stall the event loop)."""
    n = (len(run) + PAGE_ENTRIES - 1) // PAGE_ENTRIES
    pos, fence = 0, [struct.pack("<I", n)]
    for first in range(0, n, _CHUNK_PAGES):
        data, entries, pos = await asyncio.to_thread(_pages, run, first, min(first + _CHUNK_PAGES, n), kind, pos)
        fence += entries
        yield data
    fence_b = b"".join(fence)
    yield fence_b
    min_ts = int(run.ts.min()) if len(run) else 0
    max_ts = int(run.ts.max()) if len(run) else 0
    body = FOOTER.pack(RUN_MAGIC, RUN_VERSION, KINDS[kind], level, len(run), pos, len(fence_b),
                       min_ts, max_ts, crc32c(fence_b), bytes(8), 0)
    yield body[:-4] + struct.pack("<I", crc32c(body[:-4]))


class IndexRun:
    """A run opened for point lookups and scans through the block cache."""

    def __init__(self, sf: SealedFile, kind: str, meta: tuple[int, int, int, int, int], fence: _Fence) -> None:
        self.sf, self.kind, self.where = sf, kind, sf.where
        (self.level, self.entries, self.min_ts, self.max_ts, self._fence_off) = meta
        self._offs, self._counts, self._firsts = fence
        self._pages: OrderedDict[int, Run] = OrderedDict()  # parsed pages, LRU (blocks stay in the block cache)
        self._whole: Run | None = None  # every page parsed, as one run (then ``_pages`` stays empty)
        self._page_at = [0, *accumulate(self._counts)]  # first entry of each page

    @classmethod
    async def open(cls, sf: SealedFile) -> "IndexRun":
        at = sf.size - FOOTER_LEN
        raw = await sf.read(at, FOOTER_LEN) if at >= 0 else b""
        if len(raw) != FOOTER_LEN:
            raise RowCorruptionError(sf.where, 0, "file too short for an index-run footer")
        f = FOOTER.unpack(raw)
        if f[0] != RUN_MAGIC or crc32c(raw[:-4]) != f[-1]:
            raise RowCorruptionError(sf.where, at, "bad index-run footer")
        if f[1] != RUN_VERSION:
            raise RowCorruptionError(sf.where, at, f"unsupported index-run version {f[1]}")
        kind = {v: k for k, v in KINDS.items()}.get(f[2])
        if kind is None:
            raise RowCorruptionError(sf.where, at, f"unknown key kind {f[2]}")
        fence = await sf.read(f[5], f[6])
        if crc32c(fence) != f[9]:
            raise RowCorruptionError(sf.where, f[5], "index-run fence checksum mismatch")
        parsed = _parse_fence(fence, kind, sf.where, f[5])
        if sum(parsed[1]) != f[4]:
            raise RowCorruptionError(sf.where, f[5], "fence counts do not add up to the entry count")
        return cls(sf, kind, (f[3], f[4], f[7], f[8], f[5]), parsed)

    async def page(self, i: int) -> Run:
        if self._whole is not None:
            a, b = self._page_at[i], self._page_at[i + 1]
            return Run(self._whole.keys[a:b], self._whole.ts[a:b], self._whole.rowids[a:b])
        p = self._pages.get(i)
        if p is not None:
            self._pages.move_to_end(i)
        else:
            end = self._offs[i + 1] if i + 1 < len(self._offs) else self._fence_off
            raw = await self.sf.read(self._offs[i], end - self._offs[i])
            p = _parse_page(raw, self.kind, self._counts[i], self.where, self._offs[i])
            self._pages[i] = p
            if len(self._pages) > PARSED_PAGES:
                self._pages.popitem(last=False)
        return p

    async def pages(self, idx: list[int]) -> list[Run]:
        """Parsed pages ``idx``: those parsed already without a coroutine each; the rest read
        a stretch of neighbouring pages at a time (one read, parsed together)."""
        got = [self._pages.get(i) for i in idx]
        for j, p in enumerate(got):
            if p is not None and idx[j] in self._pages:
                self._pages.move_to_end(idx[j])
        j = 0
        while j < len(got):
            if got[j] is not None:
                j += 1
                continue
            k = j + 1  # a stretch of missing pages, consecutive in the run
            while k < len(got) and got[k] is None and idx[k] == idx[k - 1] + 1:
                k += 1
            got[j:k] = await self._read_pages(idx[j], idx[k - 1] + 1)
            j = k
        return cast(list[Run], got)  # every None was replaced by its page

    async def _read_pages(self, lo: int, hi: int) -> list[Run]:
        """Pages ``lo..hi-1`` by one read; parsed off the loop when there are many."""
        if hi - lo == 1:
            return [await self.page(lo)]
        start = self._offs[lo]
        ends = [*self._offs[lo + 1 : hi], self._offs[hi] if hi < len(self._offs) else self._fence_off]
        raw = await self.sf.read(start, ends[-1] - start)

        def parse() -> list[Run]:
            return [_parse_page(raw[a - start : b - start], self.kind, self._counts[i], self.where, a)
                    for i, a, b in zip(range(lo, hi), self._offs[lo:hi], ends)]
        runs = await asyncio.to_thread(parse) if hi - lo > 8 else parse()
        for i, r in zip(range(lo, hi), runs):
            self._pages[i] = r
        while len(self._pages) > PARSED_PAGES:
            self._pages.popitem(last=False)
        return runs

    def pages_for(self, key: int | bytes) -> range:
        """Pages that may hold versions of ``key`` (usually one)."""
        if not self._firsts:
            return range(0)
        k = _cmp_key(key, self.kind)
        lo = max(bisect_right(self._firsts, k) - 1, 0)
        hi = lo
        while hi + 1 < len(self._firsts) and self._firsts[hi + 1] <= k:
            hi += 1
        # versions of one key may start on the page before the first page whose first key is k
        while lo > 0 and self._firsts[lo] == k:
            lo -= 1
        return range(lo, hi + 1)

    async def get_one(self, key: int | bytes, as_of: int) -> int:
        """The newest rowid of ``key`` with ts <= as_of in this run (TOMBSTONE for a deletion),
        0 if none: the scalar path of a point get."""
        if self._whole is not None:
            return find_one(self._whole, key, as_of)[0]
        for i in self.pages_for(key):
            r, _ = find_one(await self.page(i), key, as_of)
            if r:
                return r
        return 0

    def get_cached(self, key: int | bytes, as_of: int) -> int | None:
        """``get_one`` when the pages it needs are parsed already; None when one must be read."""
        if self._whole is not None:
            return find_one(self._whole, key, as_of)[0]
        for i in self.pages_for(key):
            p = self._pages.get(i)
            if p is None:
                return None
            self._pages.move_to_end(i)
            r, _ = find_one(p, key, as_of)
            if r:
                return r
        return 0

    async def versions(self, key: int | bytes) -> Run:
        """All entries of ``key`` in this run (ts descending)."""
        runs = [await self.page(i) for i in self.pages_for(key)]
        run = merge_runs(runs) if len(runs) > 1 else (runs[0] if runs else None)
        if run is None:
            return Run(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        k = np.array([key], dtype=run.keys.dtype) if run.keys.dtype.kind == "S" else np.uint64(key)
        lo, hi = np.searchsorted(run.keys, k, "left"), np.searchsorted(run.keys, k, "right")
        a, b = int(np.atleast_1d(lo)[0]), int(np.atleast_1d(hi)[0])
        return Run(run.keys[a:b], run.ts[a:b], run.rowids[a:b])

    def _fence_array(self) -> np.ndarray:
        f = getattr(self, "_fence_np", None)
        if f is None:
            f = self._fence_np = (np.array(self._firsts, np.uint64) if self.kind == "int64"
                                  else np.array(self._firsts, dtype="S"))
        return f

    async def get_many(self, keys: np.ndarray, as_of: int) -> np.ndarray:
        """Per key (encoded): the newest rowid with ts <= as_of (TOMBSTONE for a deletion),
        0 if this run has no such version. Reads only the pages the keys need."""
        return (await self.lookup(keys, as_of))[0]

    async def lookup(self, keys: np.ndarray, as_of: int) -> tuple[np.ndarray, np.ndarray]:
        """Per key: (rowid, ts) of its newest entry with ts <= as_of here; (0, 0) if none."""
        from rowstore.index.key_memtable import _lookup

        if not self._offs or len(keys) == 0:
            return np.zeros(len(keys), np.uint64), np.zeros(len(keys), np.uint64)
        if self._whole is not None:
            return _lookup(self._whole, keys, as_of)
        firsts = self._fence_array()
        lo = np.maximum(np.searchsorted(firsts, keys, "left") - 1, 0)
        hi = np.maximum(np.searchsorted(firsts, keys, "right") - 1, 0)
        span = hi - lo + 1
        pages = np.unique(np.repeat(lo, span) + (np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)))
        n = len(self._offs)
        if n <= PARSED_PAGES and len(pages) * _WHOLE_SHARE > n:
            await self._parse_whole()
            assert self._whole is not None  # _parse_whole set it
            return _lookup(self._whole, keys, as_of)
        return _lookup(_concat(await self.pages(pages.tolist())), keys, as_of)  # pages in order: sorted

    async def _parse_whole(self) -> None:
        """Parse every page into one run: lookups of many keys then search it directly instead
        of concatenating the pages they need each time (only for runs within the parsed-page
        budget, so memory stays bounded by configuration)."""
        self._whole = await self._scan_all()
        self._pages.clear()

    async def range(self, lo: np.generic | None = None, hi: np.generic | None = None) -> Run:
        """The entries of the pages that may hold keys in ``[lo, hi)`` (None: unbounded); the
        caller cuts the exact range."""
        if not self._offs:
            return Run(np.zeros(0, np.uint64 if self.kind == "int64" else "S1"), np.zeros(0, np.uint64),
                       np.zeros(0, np.uint64))
        if self._whole is not None:
            return self._whole
        if lo is None and hi is None:
            return await self._scan_all()
        firsts = self._fence_array()
        a = 0 if lo is None else max(int(np.searchsorted(firsts, lo, "left")) - 1, 0)
        b = len(self._offs) if hi is None else max(int(np.searchsorted(firsts, hi, "left")), 1)
        return _concat(await self.pages(list(range(a, b))))

    async def chunk(self, rng: KeyRange[int] | KeyRange[bytes], entries: int) -> tuple[Run, bool]:
        """Whole pages from the start of ``rng``, holding at least ``entries`` entries where the
        run has them (a scan's round: bounded by ``entries``, not by the range), cut to ``rng``;
        and whether the run may hold more of ``rng`` after them."""
        if not self._offs:
            return _empty(self.kind), False
        if self._whole is not None:
            a, b = rng.slice_of(self._whole.keys)
            end = min(b, a + entries)
            return Run(self._whole.keys[a:end], self._whole.ts[a:end], self._whole.rowids[a:end]), end < b
        firsts = self._fence_array()
        first = 0 if rng.lo is None else max(int(np.searchsorted(firsts, key_scalar(firsts, rng.lo), "left")) - 1, 0)
        stop = len(self._offs) if rng.hi is None else max(int(np.searchsorted(
            firsts, key_scalar(firsts, rng.hi), "right" if rng.hi_inc else "left")), 1)
        got: list[Run] = []
        last, n = first, 0
        while last < stop and n < entries:  # n: entries in the range so far (the first page may start below it)
            upto, want = last, 0
            while upto < stop and (want < entries - n or upto == last):
                want += self._counts[upto]
                upto += 1
            run = _concat(await self.pages(list(range(last, upto))))  # pages in order: sorted
            last = upto
            a, b = rng.slice_of(run.keys)
            if b > a:
                got.append(Run(run.keys[a:b], run.ts[a:b], run.rowids[a:b]))
                n += b - a
        return (_concat(got) if got else _empty(self.kind)), last < stop

    async def _scan_all(self) -> Run:
        """Every entry: the pages' bytes in one read, parsed in a worker thread — a full scan
        (visible sets, merges, GC views) takes no loop hop per page, parses nothing on the
        loop and leaves nothing in the parsed-page LRU."""
        start = self._offs[0]
        raw = await self.sf.read(start, self._fence_off - start)
        ends = [*self._offs[1:], self._fence_off]

        offs = np.array(self._offs, np.int64) - start
        return await asyncio.to_thread(parse_pages, raw, offs, np.array(ends, np.int64) - start,
                                       np.array(self._counts, np.int64), self.kind, self.where, start)

    async def all(self) -> Run:
        """Every entry (merges, checks)."""
        return await self.range()


def _empty(kind: str) -> Run:
    return Run(np.zeros(0, np.uint64 if kind == "int64" else "S1"), np.zeros(0, np.uint64), np.zeros(0, np.uint64))


def _concat(pages: list[Run]) -> Run:
    """Pages in page order are already sorted: concatenation is the merge."""
    if not pages:
        return Run(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64))
    if len(pages) == 1:
        return pages[0]
    return Run(np.concatenate([p.keys for p in pages]), np.concatenate([p.ts for p in pages]),
               np.concatenate([p.rowids for p in pages]))


def _cmp_key(key: int | bytes, kind: str) -> int | bytes:
    return int(key) if kind == "int64" else bytes(key)


def _parse_fence(fence: bytes, kind: str, where: str, at: int) -> _Fence:
    try:
        (n,) = struct.unpack_from("<I", fence, 0)
        pos = 4
        offs: list[int] = []
        counts: list[int] = []
        firsts: list[Any] = []  # see _Fence
        for _ in range(n):
            off, cnt = struct.unpack_from("<QI", fence, pos)
            pos += 12
            if kind == "int64":
                (k,) = struct.unpack_from("<Q", fence, pos)
                pos += 8
            elif kind == "uuid":
                k = fence[pos : pos + 16]
                pos += 16
            else:
                (ln,) = struct.unpack_from("<H", fence, pos)
                k = fence[pos + 2 : pos + 2 + ln]
                pos += 2 + ln
            offs.append(off)
            counts.append(cnt)
            firsts.append(k)
    except struct.error as e:
        raise RowCorruptionError(where, at, f"malformed fence: {e}") from e
    if any(b < a for a, b in zip(firsts, firsts[1:])) or any(b <= a for a, b in zip(offs, offs[1:])):
        raise RowCorruptionError(where, at, "fence is not sorted")
    return offs, counts, firsts
