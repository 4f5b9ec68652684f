"""Row-store reads, peers in the same run.

* point ``get(rowid)`` returning the row's bytes: active segment, sealed
  (cached), sealed (cold: no cache, local object store) — vs RocksDB ``get``
  of the same encoded row bytes under their keys;
* sealed scan decoding to Arrow — vs reading the same rows from an Arrow IPC file
  (plain and zstd), page cache warm. Ours twice: with the segment's blocks in
  TerrascaleFS's memory cache (the analogue of a page-cache-warm uncompressed
  file) and with a cold block cache (every block fetched from the local object
  store — page cache warm — checksummed and zstd-decompressed; the analogue of
  the zstd IPC file). Warm-up passes first, then alternating rounds; medians.
  The IPC peers reuse memory their allocator (mimalloc) kept from the previous
  pass; a first read in a fresh process runs far slower (page faults), which is
  where the earlier, lower peer figures came from.
"""
from __future__ import annotations

import asyncio
import os
import random
import tempfile

import numpy as np
import pyarrow as pa
from rocksdict import Options, Rdict

from bench.common import Result, Timer, print_table, write_json
from bench.rowcodec_bench import SCHEMA, sample
from catalog.memory import MemoryCatalog
from rowstore.codec.rows import encode_rows
from rowstore.segments.sealed import key_columns_schema, SealedSegment
from rowstore.segments.store import SegmentStore
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.cache import BlockCache
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.sealed import SealedFile

N = 300_000
GETS = 20_000
KEYS = key_columns_schema(SCHEMA)


async def main() -> list[Result]:
    src = sample(N)
    rng = random.Random(5)
    locs = [rng.randrange(N) for _ in range(GETS)]
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", ".")) as root:
        fs = TerrascaleFS(MemoryCatalog(), LocalBlockDevice(f"{root}/block"),
                          LocalBlockDevice(f"{root}/cache", durable=False), LocalObjectStore(f"{root}/objects"),
                          config=FsConfig(cache_memory_bytes=256 << 20))
        await fs.open()
        st = SegmentStore(fs, lambda v: SCHEMA)
        await st.open()
        seg = await st.create("bench", 0)
        for i in range(0, N, 10_000):
            await seg.append(src.slice(i, 10_000), SCHEMA, 1)
        active_rate = await _gets(seg.get_raw, locs)
        rocks_rate = await asyncio.to_thread(_rocks, root, seg, src, locs)
        await st.seal(seg.segid)
        rec = await st.offload(seg.segid, KEYS)
        sseg = await st.sealed(seg.segid)
        await _gets(sseg.get_raw, locs)  # warm the caches
        cached_rate = await _gets(sseg.get_raw, locs)
        frec = await fs.stat(rec.inode)
        cold_sf = await SealedFile.open(fs.objects, frec.location, object_size=frec.object_size,
                                        cache=BlockCache(0))
        cold = await SealedSegment.open(cold_sf)
        cold._pages = _NoCache()
        cold_rate = await _gets(cold.get_raw, locs[:2000], repeat=1)
        await sseg.sf.read(0, sseg.sf.size)  # every block of the segment in the memory cache
        cold_scan = await SealedSegment.open(await SealedFile.open(
            fs.objects, frec.location, object_size=frec.object_size, cache=BlockCache(0)))
        scan_warm, scan_cold, ipc_rate, zipc_rate = await _scan(sseg, cold_scan, src, root)
        await fs.close()
    g = "point get(rowid) -> row bytes"
    rocks = "RocksDB get, same encoded rows (warm: block and page cache)"
    results += [
        Result(f"{g}, active segment", active_rate, rocks, rocks_rate, "gets/s", "report"),
        Result(f"{g}, sealed cached", cached_rate, rocks, rocks_rate, "gets/s", ">= 1.0x"),
        Result(f"{g}, sealed cold (no cache, local objects)", cold_rate, rocks, rocks_rate, "gets/s",
               "report (unlike: ours cold, RocksDB warm)"),
        Result("sealed scan -> Arrow, blocks in memory cache", scan_warm, "Arrow IPC file read (page cache)",
               ipc_rate, "rows/s", ">= 0.5x"),
        Result("sealed scan -> Arrow, block cache cold", scan_cold, "Arrow IPC file read (page cache)", ipc_rate,
               "rows/s", ">= 0.5x"),
        Result("sealed scan -> Arrow, blocks in memory cache", scan_warm, "Arrow IPC file, zstd (page cache)",
               zipc_rate, "rows/s", ">= 0.5x"),
        Result("sealed scan -> Arrow, block cache cold", scan_cold, "Arrow IPC file, zstd (page cache)", zipc_rate,
               "rows/s", ">= 0.5x"),
    ]
    print_table("Row-store reads", results)
    print(f"\nJSON: {write_json('rowstore_read', results)}")
    return results


class _NoCache(dict):
    def __setitem__(self, k, v):  # cold reads: never keep an index page
        pass


async def _gets(get, locs, repeat: int = 3) -> float:
    """Median over ``repeat`` passes (the VM is noisy)."""
    rates = []
    for _ in range(repeat):
        with Timer() as t:
            for i in locs:
                await get(i)
        rates.append(len(locs) / t.seconds)
    return sorted(rates)[len(rates) // 2]


def _rocks(root: str, seg, src: pa.RecordBatch, locs) -> float:
    db = Rdict(os.path.join(root, "rocks"), Options())
    ids = src.column("id").to_numpy()
    keys = [int(k).to_bytes(8, "big") for k in ids]
    enc = encode_rows(src, SCHEMA, 1)  # the very row bytes the segment holds
    raw, ends = enc.buf.tobytes(), np.append(enc.starts[1:], enc.nbytes)
    try:
        for i, k in enumerate(keys):
            db[k] = raw[enc.starts[i] : ends[i]]
        db.flush()
        rates = []
        for _ in range(3):
            with Timer() as t:
                for i in locs:
                    db[keys[i]]
            rates.append(len(locs) / t.seconds)
        return sorted(rates)[1]
    finally:
        db.close()
        Rdict.destroy(os.path.join(root, "rocks"))


async def _scan(warm: SealedSegment, cold: SealedSegment, src: pa.RecordBatch, root: str,
                repeat: int = 7) -> tuple[float, float, float, float]:
    """Medians over ``repeat`` rounds after two warm-up rounds; each round runs the four
    readers, in an order that rotates from round to round."""
    path, zpath = os.path.join(root, "rows.arrow"), os.path.join(root, "rows.zstd.arrow")
    for p, opts in ((path, None), (zpath, pa.ipc.IpcWriteOptions(compression="zstd"))):
        with pa.OSFile(p, "wb") as f, pa.ipc.new_file(f, src.schema, options=opts) as w:
            for i in range(0, N, 65536):
                w.write_batch(src.slice(i, 65536))

    async def ours(seg):
        n = 0
        async for d in seg.scan(lambda v: SCHEMA, SCHEMA):
            n += d.batch.num_rows
        assert n == N

    async def ipc(p):
        with pa.OSFile(p, "rb") as f:
            assert pa.ipc.open_file(f).read_all().num_rows == N

    readers = [lambda: ours(warm), lambda: ours(cold), lambda: ipc(path), lambda: ipc(zpath)]
    rates: list[list[float]] = [[] for _ in readers]
    for r in range(repeat + 2):
        for k in [(r + j) % len(readers) for j in range(len(readers))]:
            with Timer() as t:
                await readers[k]()
            if r >= 2:
                rates[k].append(N / t.seconds)
    return tuple(sorted(x)[len(x) // 2] for x in rates)


if __name__ == "__main__":
    asyncio.run(main())
