"""TerrascaleFS benchmarks, peers in the same run.

* active-file appends with group commit (64 concurrent appenders, 4 KiB and
  64 KiB appends, crc32c, no compression/encryption) vs raw write+fdatasync
  of the same bytes in the same group sizes;
* sealed-file random 4 KiB reads, cold and cached, vs raw ``os.pread``.
"""
from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile

from bench.common import Result, Timer, print_table, write_json
from terrafs.active import ActiveConfig, ActiveFile
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.blocks import Codec
from terrafs.cache import BlockCache
from terrafs.params import new_params
from terrafs.sealed import SealedFile, SealedWriter

APPENDERS = 64
TOTAL_BYTES = 128 << 20
ROUNDS = 5
READS = 20_000


async def bench_appends(root: str, size: int) -> Result:
    """Alternate ours and the peer over several rounds (this VM's disk is noisy,
    and the first writes after a large delete are slow): report medians."""
    ours, peer, stats = [], [], {}
    for rnd in range(ROUNDS + 1):
        o, stats = await _run_active(root, size)
        p = await _run_raw(root, size)
        if rnd:  # round 0 warms the device up
            ours.append(o)
            peer.append(p)
    ceiling = await asyncio.to_thread(device_ceiling, root, stats["flushes"], stats["flushed_bytes"])
    return Result(f"append {size // 1024} KiB x{APPENDERS} (group commit, crc32c)",
                  statistics.median(ours), "raw group commit: write+fdatasync, no format",
                  statistics.median(peer), "MB/s", ">= 0.70x",
                  {"rounds_ours": [round(x) for x in ours], "rounds_peer": [round(x) for x in peer],
                   "flushes": stats["flushes"],
                   "avg_group_bytes": stats["flushed_bytes"] // max(stats["flushes"], 1),
                   "device_ceiling_same_groups_MBps": round(ceiling)})


async def _appenders(append, size: int) -> float:
    per = TOTAL_BYTES // size // APPENDERS
    payload = os.urandom(size)

    async def one():
        for _ in range(per):
            await append(payload)

    with Timer() as t:
        await asyncio.gather(*(one() for _ in range(APPENDERS)))
    return per * APPENDERS * size / t.seconds / 1e6


async def _run_active(root: str, size: int):
    dev = LocalBlockDevice(root)
    name = f"append-{size}.act"
    p = new_params(1, 1, codec=Codec.NONE, block_size=64 * 1024, page_size=4096)
    af = await ActiveFile.create(dev, name, p, None, ActiveConfig(flush_bytes=64 * 1024, flush_ms=2))
    rate = await _appenders(af.append, size)
    stats = dict(af.stats)
    await af.close()
    await dev.delete(name)
    return rate, stats


async def _run_raw(root: str, size: int) -> float:
    raw = RawGroupCommit(os.path.join(root, "raw.dat"))
    try:
        return await _appenders(raw.append, size)
    finally:
        raw.close()


class RawGroupCommit:
    """The peer: the same group commit with nothing but os.write + fdatasync."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        self.path = path
        self.pending: list[bytes] = []
        self.futs: list[asyncio.Future] = []
        self.task: asyncio.Task | None = None
        self.timer = None
        self.size = 0

    async def append(self, data: bytes) -> int:
        off = self.size
        self.size += len(data)
        self.pending.append(data)
        fut = asyncio.get_running_loop().create_future()
        self.futs.append(fut)
        if sum(map(len, self.pending)) >= 64 * 1024:
            self.kick()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(0.002, self.kick)
        await fut
        return off

    def kick(self) -> None:
        if self.timer:
            self.timer.cancel()
            self.timer = None
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.flush())

    async def flush(self) -> None:
        while self.pending:
            batch, futs, self.pending, self.futs = self.pending, self.futs, [], []
            await asyncio.to_thread(self._write, batch)
            for f in futs:
                f.set_result(None)

    def _write(self, batch) -> None:
        os.writev(self.fd, batch)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


def device_ceiling(root: str, groups: int, total: int) -> float:
    """Write ``total`` bytes as ``groups`` write+fdatasync calls in a tight loop."""
    path = os.path.join(root, "ceiling.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    buf = os.urandom(total // groups)
    try:
        with Timer() as t:
            for _ in range(groups):
                os.write(fd, buf)
                os.fdatasync(fd)
    finally:
        os.close(fd)
        os.unlink(path)
    return len(buf) * groups / t.seconds / 1e6


def row_like(n: int) -> bytes:
    rng = random.Random(1)
    parts = []
    size = 0
    while size < n:
        row = b"%d,%.6f,%.6f,%d,sensor-%03d;" % (rng.randrange(1 << 40), rng.random() * 180,
                                                  rng.random() * 90, rng.randrange(1 << 50), rng.randrange(999))
        parts.append(row)
        size += len(row)
    return b"".join(parts)[:n]


async def bench_sealed_reads(root: str, block_size: int) -> list[Result]:
    data = row_like(64 << 20)
    store = LocalObjectStore(os.path.join(root, "objects"))
    dev = LocalBlockDevice(os.path.join(root, "staging"), durable=False)
    out = await dev.create(f"s{block_size}")
    w = SealedWriter(out, new_params(2, 1, codec=Codec.ZSTD, block_size=block_size), None)
    for i in range(0, len(data), 1 << 20):
        await w.write(data[i : i + (1 << 20)])
    size = await w.finish()
    await store.put("sealed", await out.pread(0, size))
    await out.close()
    rng = random.Random(7)
    offsets = [rng.randrange(len(data) - 4096) for _ in range(READS)]

    cold = await SealedFile.open(store, "sealed", object_size=size, cache=BlockCache(0))
    with Timer() as t:
        for off in offsets[:3000]:
            await cold.read(off, 4096)
    cold_rate = 3000 / t.seconds

    warm = await SealedFile.open(store, "sealed", object_size=size, cache=BlockCache(256 << 20))
    for off in range(0, len(data), block_size):
        await warm.read(off, 1)
    with Timer() as t:
        for off in offsets:
            assert len(await warm.read(off, 4096)) == 4096
    warm_rate = READS / t.seconds
    raw_rate = await asyncio.to_thread(raw_pread, os.path.join(root, "objects", "sealed"), size, offsets)
    await store.delete("sealed")
    kib = block_size // 1024
    return [
        Result(f"sealed 4 KiB random read, cold ({kib} KiB blocks)", cold_rate, "raw os.pread (page cache)",
               raw_rate, "reads/s", "report"),
        Result(f"sealed 4 KiB random read, cached ({kib} KiB blocks)", warm_rate, "raw os.pread (page cache)",
               raw_rate, "reads/s", ">= 100k/s"),
    ]


def raw_pread(path: str, size: int, offsets: list[int]) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        with Timer() as t:
            for off in offsets:
                os.pread(fd, 4096, off % (size - 4096))
    finally:
        os.close(fd)
    return len(offsets) / t.seconds


async def main() -> list[Result]:
    results: list[Result] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", ".")) as root:
        for size in (4096, 65536):
            results.append(await bench_appends(root, size))
        if os.environ.get("BENCH_ONLY") != "append":
            for bs in (4096, 32768):
                results += await bench_sealed_reads(root, bs)
    print_table("TerrascaleFS", results)
    print(f"\nJSON: {write_json('terrafs', results)}")
    return results


if __name__ == "__main__":
    asyncio.run(main())
