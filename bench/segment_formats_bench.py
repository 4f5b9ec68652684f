"""RFC 0014's measurements: sealed-segment layouts on the same rows, in the same run.

Ten columns of measurement-like rows (a key, a sensor name of 1,000 values, a timestamp
rising with jitter, coordinates, speed, altitude, a status code, a free-text note, a flag),
written as sealed objects through TerrascaleFS (zstd, checksummed, AES-GCM under a data key)
to a local object store, four ways:

* ``rows``: today's row-wise segment (docs/format/segment.md §3);
* ``pax``: the columnar pages of a group of rows packed into one TerrascaleFS block each
  (PAX: columns grouped inside a block) — a prototype here, to measure;
* ``columnar``: one TerrascaleFS block per page of a column chunk (the format chosen,
  ``rowstore.segments.columnar``);
* ``parquet``: a pyarrow Parquet file (zstd, page index, 64k-row groups) as the sealed
  object's logical bytes, TerrascaleFS's per-block checksums and encryption around it.

Measured: bytes at rest; a scan of 3 of the 10 columns into Arrow (time and bytes fetched
from the store); point reads of random rowids to a row (a dict: the row-wise bytes through the
node's generated decoder) with a cold block cache (p50, p99, bytes);
the time to write each object. ``python -m bench.segment_formats_bench [ROWS]``.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any, AsyncIterator, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Result, print_table, write_json
from catalog.memory import MemoryCatalog
from rowstore.codec.columns import decode_page, encode_page
from rowstore.codec.point_decoder import PointDecoder
from rowstore.codec.rows import encode_rows
from rowstore.schema import parse_schema
from rowstore.segments.columnar import ColumnarSegment
from rowstore.segments.columnar_layout import BLOCK_SIZE
from rowstore.segments.columnar_write import columnar_bytes
from rowstore.segments.sealed import SealedSegment, key_columns_schema, sealed_bytes
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.cache import BlockCache
from terrafs.crypto import KeyEncryptionKey
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.sealed import Aligned, SealedFile

SAMPLE_SCHEMA_TEXT = ("id int64 primary key, sensor string, ts timestamp, lat float64, lon float64, "
                      "speed float32, alt float64, status int32, note string, ok bool")
SCHEMA = parse_schema(SAMPLE_SCHEMA_TEXT)
KEYS = key_columns_schema(SCHEMA)
SCAN = ["ts", "lat", "speed"]
POINT = PointDecoder(lambda v: SCHEMA, SCHEMA)
PAX_ROWS = 8192
POINTS = 300


def sample(n: int, seed: int = 7) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    sensors = np.array([f"sensor-{i:04d}" for i in range(1000)])
    words = np.array(["ok", "late", "gps", "drift", "battery", "low", "signal", "lost", "reset", "calibrated"])
    notes = [" ".join(words[rng.integers(0, 10, 5)]) + f" #{i}" for i in range(n)]
    ts = 1_767_225_600_000_000 + np.cumsum(rng.integers(0, 20_000, n))
    cols = {
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "sensor": pa.array(sensors[rng.integers(0, 1000, n)]),
        "ts": pa.array(ts, pa.timestamp("us", "UTC")),
        "lat": pa.array(52.0 + rng.normal(0, 0.5, n)),
        "lon": pa.array(13.0 + rng.normal(0, 0.5, n)),
        "speed": pa.array(np.round(rng.gamma(2, 10, n), 1).astype(np.float32)),
        "alt": pa.array(rng.normal(100, 30, n)),
        "status": pa.array(rng.choice([200, 200, 200, 201, 404, 500], n).astype(np.int32)),
        "note": pa.array(notes),
        "ok": pa.array(rng.random(n) < 0.9),
    }
    return pa.Table.from_pydict(cols, schema=SCHEMA.arrow()).combine_chunks().to_batches(max_chunksize=n or None)[0]


class _Rows:
    """One committed batch as ``sealed_bytes`` and ``columnar_bytes`` read it."""

    def __init__(self, rows: np.ndarray, starts: np.ndarray):
        self.rows, self.starts, self.commit_ts = rows, starts, 1000


class CountingStore(LocalObjectStore):
    """The local object store, counting the bytes ranged reads fetch."""

    fetched = 0

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        CountingStore.fetched += length
        return await super().get_range(key, start, length)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        CountingStore.fetched += sum(n for _, n in ranges)
        return await super().get_ranges(key, ranges)


async def _stream(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def _one(b: Any) -> AsyncIterator[Any]:
    yield b


def pax_chunks(src: pa.RecordBatch) -> tuple[list[bytes], list[list[tuple[int, int]]]]:
    """PAX: per group of ``PAX_ROWS`` rows, every column's page back to back in one block;
    returns the blocks and, per block, each column's (offset, length) inside it."""
    blocks, where = [], []
    for a in range(0, src.num_rows, PAX_ROWS):
        parts, spans, at = [], [], 0
        for c in SCHEMA.columns:
            page = encode_page(src.column(c.name).slice(a, PAX_ROWS), c.type)
            parts.append(page)
            spans.append((at, len(page)))
            at += len(page)
        blocks.append(Aligned(b"".join(parts)))
        where.append(spans)
    return blocks, where


def parquet_bytes(src: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_batches([src]), sink, compression="zstd", row_group_size=1 << 16,
                   write_page_index=True, write_statistics=True)
    return sink.getvalue().to_pybytes()


async def build(fs: TerrascaleFS, src: pa.RecordBatch) -> dict[str, tuple[int, float, Any]]:
    """Each layout's object: (inode, seconds to write, what its reader needs)."""
    enc = encode_rows(src, SCHEMA, 1000)
    rows = _Rows(enc.buf, enc.starts)
    out: dict[str, tuple[int, float, Any]] = {}

    async def put(name: str, content: Callable[[], AsyncIterator[bytes]], bs: int | None, extra: Any) -> None:
        t0 = time.perf_counter()
        rec = await fs.create_sealed(content(), block_size=bs)
        out[name] = (rec.inode, time.perf_counter() - t0, extra)

    await put("rows", lambda: sealed_bytes(1, _one(rows), lambda v: SCHEMA, KEYS), None, None)
    t0 = time.perf_counter()
    blocks, spans = pax_chunks(src)
    enc_s = time.perf_counter() - t0
    await put("pax", lambda: _stream(blocks), BLOCK_SIZE, spans)
    out["pax"] = (out["pax"][0], out["pax"][1] + enc_s, spans)
    await put("columnar", lambda: columnar_bytes(1, _one(rows), lambda v: SCHEMA, KEYS), BLOCK_SIZE, None)
    t0 = time.perf_counter()
    pbytes = parquet_bytes(src)
    enc_s = time.perf_counter() - t0
    await put("parquet", lambda: _stream([pbytes]), None, None)
    out["parquet"] = (out["parquet"][0], out["parquet"][1] + enc_s, None)
    return out


async def _open(fs: TerrascaleFS, inode: int) -> SealedFile:
    sf = await fs.open_sealed(inode)
    sf._cache = BlockCache(64 << 20)  # cold: a fresh memory cache, no volatile tier
    return sf


async def scan(name: str, sf: SealedFile, extra: Any) -> pa.Table:
    target = parse_schema("id int64 primary key, ts timestamp, lat float64, speed float32")
    cols = {c.name: c for c in SCHEMA.columns}
    if name == "rows":
        seg = await SealedSegment.open(sf)
        return pa.Table.from_batches([d.batch.select(SCAN) async for d in seg.scan(lambda v: SCHEMA, SCHEMA)])
    if name == "columnar":
        seg = await ColumnarSegment.open(sf)
        sub = _subset(SCAN)
        return pa.Table.from_batches([d.batch.select(SCAN) async for d in seg.scan(None, sub)])
    if name == "pax":
        data = np.frombuffer(await sf.read_sequential(0, sf.size), np.uint8)
        at, batches = 0, []
        for spans in extra:
            end = at + sum(ln for _, ln in spans)
            arrays = []
            for c in SCAN:
                i = [x.name for x in SCHEMA.columns].index(c)
                off, ln = spans[i]
                arrays.append(decode_page(data[at + off : at + off + ln], cols[c].type))
            batches.append(pa.record_batch(arrays, names=SCAN))
            at = end
        return pa.Table.from_batches(batches)
    del target
    return await _parquet_read(sf, SCAN, None)


def _subset(names: list[str]) -> Any:
    from rowstore.schema import SchemaVersion
    keep = tuple(c for c in SCHEMA.columns if c.name in names or c.id in SCHEMA.primary_key)
    return SchemaVersion(SCHEMA.version, keep, SCHEMA.primary_key, SCHEMA.next_column_id)


async def _parquet_read(sf: SealedFile, columns: list[str] | None, row: int | None) -> pa.Table:
    """The byte ranges pyarrow needs (the last 64 KiB with the footer, then the chunks of the
    columns and row groups wanted), fetched through the sealed file into a buffer of the
    object's size that is zeros elsewhere (calloc'd: pages never written cost nothing), read
    by pyarrow from there."""
    buf = np.zeros(sf.size, np.uint8)
    at = max(0, sf.size - 65536)  # pyarrow reads the last 64 KiB first
    buf[at:] = np.frombuffer(await sf.read(at, sf.size - at), np.uint8)
    flen = int.from_bytes(buf[-8:-4].tobytes(), "little")
    if sf.size - 8 - flen < at:
        buf[sf.size - 8 - flen : at] = np.frombuffer(await sf.read(sf.size - 8 - flen, at - (sf.size - 8 - flen)),
                                                     np.uint8)
    meta = pq.read_metadata(pa.BufferReader(pa.py_buffer(buf)))
    rows = meta.row_group(0).num_rows
    groups = range(meta.num_row_groups) if row is None else [row // rows]
    for g in groups:
        rg = meta.row_group(g)
        for i in range(rg.num_columns):
            cc = rg.column(i)
            if columns is not None and cc.path_in_schema not in columns:
                continue
            lo = cc.dictionary_page_offset or cc.data_page_offset
            ln = cc.total_compressed_size
            data = await sf.read_sequential(lo, ln) if row is None else await sf.read(lo, ln)
            buf[lo : lo + ln] = np.frombuffer(data, np.uint8)
    pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(buf)), metadata=meta)
    if row is None:
        return pf.read(columns=columns)
    return pf.read_row_group(groups[0], columns=columns).slice(row - groups[0] * rows, 1)


async def point(name: str, sf: SealedFile, extra: Any, loc: int) -> Any:
    if name == "rows":  # as a node's point read: the row's bytes, then the generated decoder
        seg = await SealedSegment.open(sf)
        return POINT(await seg.get_raw(loc), seg.where)
    if name == "columnar":  # the row from its pages, decoded
        seg = await ColumnarSegment.open(sf)
        return await seg.row(loc, SCHEMA)
    if name == "pax":
        b = loc // PAX_ROWS
        block = np.frombuffer(await sf.read(b * 0 + _pax_off(extra, b), sum(ln for _, ln in extra[b])), np.uint8)
        return [decode_page(block[o : o + ln], c.type)[loc % PAX_ROWS] for (o, ln), c in zip(extra[b], SCHEMA.columns)]
    return await _parquet_read(sf, None, loc)


def _pax_off(spans: list[list[tuple[int, int]]], b: int) -> int:
    return sum(sum(ln for _, ln in s) for s in spans[:b])


async def measure(n: int) -> dict[str, dict[str, float]]:
    src = sample(n)
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", ".")) as root:
        fs = TerrascaleFS(MemoryCatalog(), LocalBlockDevice(f"{root}/block"),
                          LocalBlockDevice(f"{root}/cache", durable=False), CountingStore(f"{root}/objects"),
                          config=FsConfig(), kek=KeyEncryptionKey(bytes(range(32))))
        await fs.open()
        built = await build(fs, src)
        rng = np.random.default_rng(3)
        locs = rng.integers(0, n, POINTS).tolist()
        for name, (inode, write_s, extra) in built.items():
            rec = await fs.stat(inode)
            scans, fetched = [], []
            for _ in range(3):
                sf = await _open(fs, inode)
                CountingStore.fetched = 0
                t0 = time.perf_counter()
                got = await scan(name, sf, extra)
                scans.append(time.perf_counter() - t0)
                fetched.append(CountingStore.fetched)
                assert got.num_rows == n and got.column("ts").combine_chunks().equals(src.column("ts")), name
            lat, pbytes = [], []
            for loc in locs:
                sf = await _open(fs, inode)
                CountingStore.fetched = 0
                t0 = time.perf_counter()
                await point(name, sf, extra, loc)
                lat.append(time.perf_counter() - t0)
                pbytes.append(CountingStore.fetched)
            out[name] = {"object_bytes": rec.object_size, "write_s": write_s, "scan_s": statistics.median(scans),
                         "scan_fetched": statistics.median(fetched),
                         "point_p50_us": 1e6 * float(np.percentile(lat, 50)),
                         "point_p99_us": 1e6 * float(np.percentile(lat, 99)),
                         "point_fetched": statistics.median(pbytes)}
        await fs.close()
    return out


async def main(n: int | None = None) -> list[Result]:
    n = n or int(os.environ.get("BENCH_FORMAT_ROWS", "1000000"))
    got = await measure(n)
    base = got["rows"]
    results = []
    for name, m in got.items():
        results.append(Result(f"{name}: bytes at rest", m["object_bytes"] / 1e6, "rows", base["object_bytes"] / 1e6,
                              "MB"))
        rate = {k: n / m[k] / 1e6 for k in ("scan_s", "write_s")}
        base_rate = {k: n / base[k] / 1e6 for k in ("scan_s", "write_s")}
        results += [
            Result(f"{name}: scan 3 of 10 columns", rate["scan_s"], "rows", base_rate["scan_s"], "M rows/s"),
            Result(f"{name}: bytes fetched by the scan", m["scan_fetched"] / 1e6, "rows", base["scan_fetched"] / 1e6,
                   "MB"),
            Result(f"{name}: cold point read p50", m["point_p50_us"], "rows", base["point_p50_us"], "us"),
            Result(f"{name}: cold point read p99", m["point_p99_us"], "rows", base["point_p99_us"], "us"),
            Result(f"{name}: write", rate["write_s"], "rows", base_rate["write_s"], "M rows/s")]
    print_table(f"sealed segment layouts, {n:,} rows x 10 columns", results)
    write_json("segment_formats", results)
    for name, m in got.items():
        print(name, {k: round(v, 3) for k, v in m.items()})
    return results


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
