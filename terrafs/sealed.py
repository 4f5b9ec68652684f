"""Sealed files: immutable objects with a block map and a fixed-size footer.

Format: docs/format/terrafs.md §3. :class:`SealedWriter` builds one from a
stream of logical bytes on a staging device file; :class:`SealedFile` pages
blocks in through ranged reads and the :class:`~terrafs.cache.BlockCache`.
"""
from __future__ import annotations

import asyncio
import struct
from bisect import bisect_right
from typing import AsyncIterator, Callable, Iterator, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

from catalog.checksum import crc32c
from terrafs.abc import Buffer, DeviceFile, ObjectStore
from terrafs.blocks import Codec, decode_block, encode_block
from terrafs.cache import BlockCache
from terrafs.crypto import KeyEncryptionKey
from terrafs.gather import read_ranges
from terrafs.errors import FileCorruptionError, TerrafsError
from terrafs.params import FileParams

SEAL_MAGIC = b"TRFSSEAL"  # part of the format
SEAL_VERSION = 1
FOOTER = struct.Struct("<8sHHIQQQIIQIBBHI24sI")
FOOTER_LEN = FOOTER.size  # 96
MAP_ENTRY = struct.Struct("<QQII")  # logical_off, physical_off, record_len, raw_len
_MAP_DTYPE = np.dtype([("logical", "<u8"), ("physical", "<u8"), ("rec", "<u4"), ("raw", "<u4")])
_ENCODE_BATCH = 1 << 20  # logical bytes encoded per worker-thread hop
_SCAN_RANGE = 8 << 20  # bytes per ranged read of a sequential scan
R = TypeVar("R")
_JOIN_OFF_LOOP = 4 << 20  # a read at least this long is joined off the event loop

assert FOOTER_LEN == 96 and _MAP_DTYPE.itemsize == MAP_ENTRY.size == 24


class Aligned(bytes):
    """Logical bytes a sealed file gives blocks of their own: the first starts a block and
    the last ends one (a columnar segment's page), so a read of them touches no other
    bytes' blocks. The format is unchanged: blocks may hold fewer than ``block_size``
    bytes (docs/format/terrafs.md §1)."""


class SealedWriter:
    """Builds a sealed file's bytes on a staging device file from a stream."""

    def __init__(self, out: DeviceFile, params: FileParams, kek: KeyEncryptionKey | None):
        self._out = out
        self.params = params
        self._cipher = params.cipher(kek, f"sealed inode {params.inode}")
        self._buf = bytearray()
        self._logical = 0
        self._map = bytearray()
        self._count = 0

    async def write(self, data: Buffer) -> None:
        if isinstance(data, Aligned):
            await self._encode(final=True)  # the bytes before end their block here
            self._buf += data
            await self._encode(final=True)
            return
        self._buf += data
        if len(self._buf) >= _ENCODE_BATCH:
            await self._encode(final=False)

    async def _encode(self, final: bool) -> None:
        bs = self.params.block_size
        n = len(self._buf) if final else len(self._buf) // bs * bs
        if n == 0:
            return
        chunk = bytes(self._buf[:n])
        del self._buf[:n]
        base = self._out.size()
        out, entries = await asyncio.to_thread(self._encode_blocks, chunk, base)
        await self._out.append(out)
        self._map += entries

    def _encode_blocks(self, chunk: bytes, base: int) -> tuple[bytearray, bytearray]:
        p, out, entries = self.params, bytearray(), bytearray()
        view = memoryview(chunk)
        for start in range(0, len(chunk), p.block_size):
            piece = view[start : start + p.block_size]
            mark = len(out)
            encode_block(out, piece, logical_off=self._logical, group=0, end=True,
                         codec=p.codec, cipher=self._cipher, inode=p.inode)
            entries += MAP_ENTRY.pack(self._logical, base + mark, len(out) - mark, len(piece))
            self._logical += len(piece)
            self._count += 1
        return out, entries

    async def finish(self) -> int:
        """Write the remaining blocks, key section, map and footer; return the object size."""
        await self._encode(final=True)
        p = self.params
        key_off = key_len = 0
        if p.encrypted:
            kid = p.key_id.encode("ascii")
            sec = struct.pack("<H", len(kid)) + kid + struct.pack("<H", len(p.wrapped_key)) + p.wrapped_key
            sec += struct.pack("<I", crc32c(sec))
            key_off, key_len = self._out.size(), len(sec)
            await self._out.append(sec)
        map_off = self._out.size()
        await self._out.append(bytes(self._map))
        footer = FOOTER.pack(SEAL_MAGIC, SEAL_VERSION, FOOTER_LEN, p.inode, p.gen, self._logical,
                             map_off, self._count, crc32c(bytes(self._map)), key_off, key_len,
                             int(p.codec), 1 if p.encrypted else 0, 0, p.block_size, bytes(24), 0)
        footer = footer[:-4] + struct.pack("<I", crc32c(footer[:-4]))
        await self._out.append(footer)
        return self._out.size()

    @property
    def logical_size(self) -> int:
        return self._logical + len(self._buf)


def parse_footer(buf: bytes, where: str, object_size: int) -> dict[str, int]:
    at = object_size - FOOTER_LEN
    if len(buf) != FOOTER_LEN:
        raise FileCorruptionError(where, at, "object too short for a sealed-file footer")
    (magic, ver, flen, inode, gen, lsize, map_off, count, map_crc, key_off, key_len, codec, enc,
     _r, bsize, _res, crc) = FOOTER.unpack(buf)
    if magic != SEAL_MAGIC:
        raise FileCorruptionError(where, at, f"bad sealed-file magic {magic!r}")
    if crc32c(buf[:-4]) != crc:
        raise FileCorruptionError(where, at, "footer checksum mismatch")
    if ver != SEAL_VERSION or flen != FOOTER_LEN:
        raise FileCorruptionError(where, at, f"unsupported sealed-file version {ver}")
    if map_off + count * MAP_ENTRY.size != at or (key_len and key_off + key_len != map_off):
        raise FileCorruptionError(where, at, "footer section offsets are inconsistent")
    return dict(inode=inode, gen=gen, logical_size=lsize, map_off=map_off, count=count,
                map_crc=map_crc, key_off=key_off, key_len=key_len, codec=codec, enc=enc,
                block_size=bsize)


def parse_key_section(sec: bytes, where: str, at: int) -> tuple[str, bytes]:
    if len(sec) < 8 or crc32c(sec[:-4]) != struct.unpack_from("<I", sec, len(sec) - 4)[0]:
        raise FileCorruptionError(where, at, "key section checksum mismatch")
    (klen,) = struct.unpack_from("<H", sec, 0)
    kid = sec[2 : 2 + klen].decode("ascii")
    (wlen,) = struct.unpack_from("<H", sec, 2 + klen)
    return kid, sec[4 + klen : 4 + klen + wlen]


class SealedFile:
    """A sealed file opened for paged reads."""

    def __init__(self, store: ObjectStore, key: str, object_size: int, meta: dict[str, int],
                 blocks: npt.NDArray[np.void], params: FileParams, kek: KeyEncryptionKey | None,
                 cache: BlockCache):
        self._store, self.key, self.object_size = store, key, object_size
        self.where = f"{store.uri}/{key}"
        self.meta, self.params = meta, params
        self.size = meta["logical_size"]
        self._blocks = blocks
        self._logical = blocks["logical"].astype(np.int64)
        self._starts = self._logical.tolist()  # bisect on a list beats numpy for one lookup
        self._cipher = params.cipher(kek, self.where)
        self._cache = cache
        self._inflight: dict[int, asyncio.Future[bytes]] = {}

    @classmethod
    async def open(cls, store: ObjectStore, key: str, *, object_size: int | None = None,
                   kek: KeyEncryptionKey | None = None, cache: BlockCache | None = None) -> "SealedFile":
        """Read the footer, key section and block map (two ranged reads)."""
        if object_size is None:
            object_size = (await store.head(key)).size
        where = f"{store.uri}/{key}"
        if object_size < FOOTER_LEN:
            raise FileCorruptionError(where, 0, "object too short for a sealed-file footer")
        meta = parse_footer(await store.get_range(key, object_size - FOOTER_LEN, FOOTER_LEN),
                            where, object_size)
        lo = meta["key_off"] if meta["key_len"] else meta["map_off"]
        tail = await store.get_range(key, lo, object_size - FOOTER_LEN - lo)
        raw_map = tail[meta["key_len"] :]
        if crc32c(raw_map) != meta["map_crc"]:
            raise FileCorruptionError(where, meta["map_off"], "block map checksum mismatch")
        kid, wrapped = ("", b"")
        if meta["key_len"]:
            kid, wrapped = parse_key_section(tail[: meta["key_len"]], where, meta["key_off"])
        blocks = np.frombuffer(raw_map, _MAP_DTYPE)
        _check_map(blocks, meta, where)
        try:
            params = FileParams(meta["inode"], meta["gen"], Codec(meta["codec"]), meta["block_size"],
                                0, kid, wrapped)
        except (ValueError, TerrafsError) as e:
            raise FileCorruptionError(where, object_size - FOOTER_LEN, f"bad footer field: {e}") from e
        return cls(store, key, object_size, meta, blocks, params, kek, cache or BlockCache(4 << 20))

    async def read(self, offset: int, length: int) -> bytes:
        """Logical bytes ``[offset, offset + length)``, short at the end of the file."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        first = bisect_right(self._starts, offset) - 1
        last = bisect_right(self._starts, end - 1) - 1
        lo = offset - self._starts[first]
        if first == last:  # the common point read: one block
            block = self._cache.get_mem((self.key, first)) or (await self._fetch(first, first))[0]
            return block[lo : lo + (end - offset)]
        blocks = await self._fetch(first, last)
        if end - offset >= _JOIN_OFF_LOOP:  # a whole run's bytes: copied in a worker thread
            return await asyncio.to_thread(_joined, blocks, lo, end - offset)
        return _joined(blocks, lo, end - offset)

    def read_cached(self, offset: int, length: int) -> bytes | None:
        """``read`` without I/O: the bytes if they lie in one block the memory cache holds,
        else None (a point read's fast path: no coroutine)."""
        if offset < 0 or offset + length > self.size:
            return None
        i = bisect_right(self._starts, offset) - 1
        lo = offset - self._starts[i]
        block = self._cache.get_mem((self.key, i))
        if block is None or lo + length > len(block):
            return None
        return block[lo : lo + length]

    async def read_ranges(self, offsets: np.ndarray,
                          lengths: np.ndarray) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """Many ranges at once: each block touched is fetched once (adjacent misses in one
        ranged read), only the ranges' bytes are copied; see ``terrafs.gather``."""

        async def fetch(blocks: list[int]) -> dict[int, bytes]:
            out = {i: b for (_, i), b in self._cache.get_mem_many([(self.key, i) for i in blocks]).items()}
            for lo, hi in _runs(sorted(set(blocks).difference(out))):
                for i, b in zip(range(lo, hi + 1), await self._fetch(lo, hi)):
                    out[i] = b
            return out

        return await read_ranges(self._logical, self.size, offsets, lengths, fetch)

    async def _fetch(self, first: int, last: int) -> list[bytes]:
        """Decoded blocks ``first..last``: memory, then volatile cache, then ranged reads."""
        out: list[bytes | None] = []
        missing = []
        for i in range(first, last + 1):
            b = self._cache.get_mem((self.key, i))
            if b is None:
                rec = await self._cache.get_disk((self.key, i))
                if rec is not None:
                    try:
                        b = self._decode(rec, i)
                    except FileCorruptionError:
                        self._cache.drop((self.key, i))  # bad cache copy: refetch below
                        b = None
                    if b is not None:
                        self._cache.put_mem((self.key, i), b)
            if b is None:
                missing.append(i)
            out.append(b)
        for lo, hi in _runs(missing):
            got = await self._get_run(lo, hi)
            for i, b in zip(range(lo, hi + 1), got):
                out[i - first] = b
        return out  # type: ignore[return-value]

    async def read_spans(self, spans: list[tuple[int, int]]) -> list[bytes]:
        """Several ``(offset, length)`` ranges at once (a row's pages in a columnar segment):
        blocks from the caches, the others with one request per run of adjacent blocks, all
        in one ``get_ranges`` (one thread hop on a local store, concurrent requests on S3);
        fetched blocks are verified, decoded and cached as ``read`` does."""
        need: set[int] = set()
        for off, ln in spans:
            end = min(off + ln, self.size)
            if off < end:
                need.update(range(bisect_right(self._starts, off) - 1, bisect_right(self._starts, end - 1)))
        have: dict[int, bytes] = {}
        for i in need:
            b = self._cache.get_mem((self.key, i))
            if b is not None:
                have[i] = b
        on_disk = await self._cache.get_disk_many([(self.key, i) for i in sorted(need) if i not in have])
        for (_, i), rec in on_disk.items():
            try:
                have[i] = self._decode(rec, i)
                self._cache.put_mem((self.key, i), have[i])
            except FileCorruptionError:
                self._cache.drop((self.key, i))
        missing = [i for i in sorted(need) if i not in have]
        runs = list(_runs(missing))
        ranges = [(int(self._blocks["physical"][lo]), int(self._blocks["physical"][hi]) + int(self._blocks["rec"][hi])
                   - int(self._blocks["physical"][lo])) for lo, hi in runs]
        if runs:  # every run verified and decoded in one thread hop (a row's pages: one run per column)
            for (lo, hi), blocks in zip(runs, await self._take_runs(runs, await self._store.get_ranges(self.key,
                                                                                                   ranges))):
                for i, b in zip(range(lo, hi + 1), blocks):
                    have[i] = b
        out = []
        for off, ln in spans:
            end = min(off + ln, self.size)
            if off >= end:
                out.append(b"")
                continue
            first, last = bisect_right(self._starts, off) - 1, bisect_right(self._starts, end - 1) - 1
            data = have[first] if first == last else b"".join(have[i] for i in range(first, last + 1))
            lo = off - self._starts[first]
            out.append(data[lo : lo + (end - off)])
        return out

    async def _get_run(self, lo: int, hi: int) -> list[bytes]:
        """Fetch blocks ``lo..hi`` with one ranged read, verify, decode and cache them."""
        start = int(self._blocks["physical"][lo])
        stop = int(self._blocks["physical"][hi]) + int(self._blocks["rec"][hi])
        return await self._take_run(lo, hi, await self._store.get_range(self.key, start, stop - start))

    async def _take_run(self, lo: int, hi: int, raw: bytes) -> list[bytes]:
        """Blocks ``lo..hi`` from the bytes of one ranged read: verified, decoded, cached."""
        return (await self._take_runs([(lo, hi)], [raw]))[0]

    async def _take_runs(self, runs: list[tuple[int, int]], raws: list[bytes]) -> list[list[bytes]]:
        """Each run's blocks from the bytes of its ranged read: verified, decoded (in one thread
        hop: zstd and AES-GCM free the GIL) and cached."""
        starts = []
        for (lo, hi), raw in zip(runs, raws):
            self._cache.stats["misses"] += hi - lo + 1
            start = int(self._blocks["physical"][lo])
            stop = int(self._blocks["physical"][hi]) + int(self._blocks["rec"][hi])
            if len(raw) != stop - start:
                raise FileCorruptionError(self.where, start, "object shorter than its block map says")
            starts.append(start)
        outs = await asyncio.to_thread(lambda: [self._decode_many(raw, start, lo, hi)
                                                for (lo, hi), raw, start in zip(runs, raws, starts)])
        for (lo, hi), raw, start, out in zip(runs, raws, starts, outs):
            for i, b in zip(range(lo, hi + 1), out):
                a = int(self._blocks["physical"][i]) - start
                self._cache.put_mem((self.key, i), b)
                self._cache.put_disk((self.key, i), raw[a : a + int(self._blocks["rec"][i])])
        return outs

    def _decode(self, rec: Buffer, i: int) -> bytes:
        phys = int(self._blocks["physical"][i])
        h, data = decode_block(rec, 0, cipher=self._cipher, inode=self.params.inode,
                               where=self.where)
        if h.logical_off != int(self._logical[i]) or h.raw_len != int(self._blocks["raw"][i]):
            raise FileCorruptionError(self.where, phys, "block does not match the block map")
        return data

    async def scan(self, start: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """Yield ``(logical_offset, bytes)`` in order, reading large ranges, bypassing the cache."""
        n = len(self._blocks)
        i = max(int(np.searchsorted(self._logical, start, side="right")) - 1, 0)
        while i < n:
            j = i
            limit = int(self._blocks["physical"][i]) + _SCAN_RANGE
            while j + 1 < n and int(self._blocks["physical"][j + 1]) + int(self._blocks["rec"][j + 1]) <= limit:
                j += 1
            start_p = int(self._blocks["physical"][i])
            raw = await self._store.get_range(
                self.key, start_p, int(self._blocks["physical"][j]) + int(self._blocks["rec"][j]) - start_p)
            decoded = await asyncio.to_thread(self._decode_many, raw, start_p, i, j)
            for k, data in zip(range(i, j + 1), decoded):
                lo = int(self._logical[k])
                if lo + len(data) > start:
                    cut = max(start - lo, 0)
                    yield lo + cut, data[cut:]
            i = j + 1

    async def read_sequential(self, offset: int, length: int) -> memoryview:
        """Logical bytes ``[offset, offset + length)`` (short at the end) for sequential scans,
        as one writable buffer. Blocks the memory cache holds are taken from it; the others
        are fetched with one ranged read per run of them, verified and decoded in a worker
        thread. The cache is never filled (a scan would evict what point reads need)."""
        end = min(offset + length, self.size)
        if offset >= end:
            return memoryview(bytearray())
        first = bisect_right(self._starts, offset) - 1
        last = bisect_right(self._starts, end - 1) - 1
        cached = {k: b for k in range(first, last + 1) if (b := self._cache.get_mem((self.key, k))) is not None}
        fetched: list[tuple[int, int, int, bytes]] = []  # (first block, last block, their offset, their bytes)
        for lo, hi in _runs([k for k in range(first, last + 1) if k not in cached]):
            start = int(self._blocks["physical"][lo])
            stop = int(self._blocks["physical"][hi]) + int(self._blocks["rec"][hi])
            raw = await self._store.get_range(self.key, start, stop - start)
            if len(raw) != stop - start:
                raise FileCorruptionError(self.where, start, "object shorter than its block map says")
            fetched.append((lo, hi, start, raw))
        return await asyncio.to_thread(self._assemble, cached, fetched, offset, end)

    async def read_sequential_spans(self, spans: Sequence[tuple[int, int]], then: Callable[[list[memoryview]], R]) -> R:
        """``read_sequential`` of several stretches at once (a group's column chunks): the
        blocks not in the memory cache fetched in one request of ranged reads, then verified,
        decoded, assembled and handed to ``then`` in one worker-thread hop."""
        cuts = [(off, max(off, min(off + n, self.size))) for off, n in spans]
        want = sorted({k for a, b in cuts if a < b
                       for k in range(bisect_right(self._starts, a) - 1, bisect_right(self._starts, b - 1))})
        blocks = {k: b for k in want if (b := self._cache.get_mem((self.key, k))) is not None}
        runs = list(_runs([k for k in want if k not in blocks]))
        phys, rec = self._blocks["physical"], self._blocks["rec"]
        ranges = [(int(phys[lo]), int(phys[hi]) + int(rec[hi]) - int(phys[lo])) for lo, hi in runs]
        raws = await self._store.get_ranges(self.key, ranges) if ranges else []
        for (start, n), raw in zip(ranges, raws):
            if len(raw) != n:
                raise FileCorruptionError(self.where, start, "object shorter than its block map says")

        def work() -> R:
            fetched = [(lo, hi, start, raw) for (lo, hi), (start, _), raw in zip(runs, ranges, raws)]
            blocks.update(self._decoded_runs(fetched))
            return then([self._stretch(blocks, a, b) for a, b in cuts])
        return await asyncio.to_thread(work)

    def _stretch(self, blocks: dict[int, bytes], offset: int, end: int) -> memoryview:
        """Logical bytes ``[offset, end)`` copied out of decoded ``blocks`` (which hold them)."""
        out = np.empty(end - offset, np.uint8).data.cast("B")
        if end > offset:
            for k in range(bisect_right(self._starts, offset) - 1, bisect_right(self._starts, end - 1)):
                lo, data = int(self._logical[k]), blocks[k]
                take_lo, take_hi = max(offset - lo, 0), min(end - lo, len(data))
                out[lo + take_lo - offset : lo + take_hi - offset] = memoryview(data)[take_lo:take_hi]
        return out

    def _assemble(self, cached: dict[int, bytes], fetched: list[tuple[int, int, int, bytes]], offset: int,
                  end: int) -> memoryview:
        """Logical bytes ``[offset, end)`` from cached blocks and fetched runs (verified, decoded)."""
        return self._stretch({**cached, **self._decoded_runs(fetched)}, offset, end)

    def _decoded_runs(self, fetched: list[tuple[int, int, int, bytes]]) -> dict[int, bytes]:
        """Each fetched run's blocks (first, last, their offset, their bytes) verified and decoded."""
        return {k: b for lo, hi, base, raw in fetched
                for k, b in zip(range(lo, hi + 1), self._decode_many(raw, base, lo, hi))}

    def _decode_many(self, raw: bytes, base: int, i: int, j: int) -> list[bytes]:
        out: list[bytes] = []
        for k in range(i, j + 1):
            a = int(self._blocks["physical"][k]) - base
            out.append(self._decode(raw[a : a + int(self._blocks["rec"][k])], k))
        return out

    async def verify(self) -> None:
        """Decode every block (fsck); raises FileCorruptionError at the first bad one."""
        async for _ in self.scan():
            pass


def _check_map(blocks: npt.NDArray[np.void], meta: dict[str, int], where: str) -> None:
    """Invariants of the block map (docs/format/terrafs.md §3)."""
    if len(blocks) == 0:
        if meta["logical_size"] != 0:
            raise FileCorruptionError(where, meta["map_off"], "empty block map for a non-empty file")
        return
    logical = blocks["logical"].astype(np.int64)
    raw = blocks["raw"].astype(np.int64)
    ok = logical[0] == 0 and np.array_equal(logical[1:], (logical + raw)[:-1])
    ok = ok and int(logical[-1] + raw[-1]) == meta["logical_size"]
    phys_end = blocks["physical"].astype(np.int64) + blocks["rec"].astype(np.int64)
    ok = ok and int(phys_end.max()) <= (meta["key_off"] or meta["map_off"])
    if not ok:
        raise FileCorruptionError(where, meta["map_off"], "block map is not contiguous")


def _runs(idx: list[int]) -> Iterator[tuple[int, int]]:
    """Group sorted indexes into contiguous (lo, hi) runs."""
    if not idx:
        return
    lo = prev = idx[0]
    for i in idx[1:]:
        if i != prev + 1:
            yield lo, prev
            lo = i
        prev = i
    yield lo, prev


def _joined(blocks: list[bytes], lo: int, n: int) -> bytes:
    """``n`` bytes from ``lo`` in the first of consecutive ``blocks``, copied once."""
    last = lo + n - sum(len(b) for b in blocks[:-1])  # how much of the last block
    return b"".join([blocks[0][lo:], *blocks[1:-1], blocks[-1][:last]])
