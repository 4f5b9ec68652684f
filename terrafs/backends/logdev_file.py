"""An open file of the log device: the ``DeviceFile`` over one chain, its appends, reads,
truncation and flushes handed to the device's I/O threads. A module of its own so that the
device (:mod:`terrafs.backends.logdev`) holds only its names-to-files interface; the file works
on what that device is built on (:mod:`terrafs.backends.logdev_core`)."""
from __future__ import annotations

import asyncio
import os
from typing import Callable, Sequence, TypeVar

from terrafs.abc import Buffer, DeviceFile
from terrafs.backends.logdev_core import LogDeviceCore, write_zeros
from terrafs.backends.logdev_format import PAGE, Chain
from terrafs.errors import ClosedError
from terrafs.iopool import run_io

T = TypeVar("T")


class LogFile(DeviceFile):
    """An open file of a log device (one writer; reads may be concurrent)."""

    preallocated = True  # bytes past the end read as zero already: no zeros written ahead

    def __init__(self, dev: LogDeviceCore, name: str, chain: Chain):
        self.dev, self.name, self._chain = dev, name, chain
        self._closed = False

    def _check(self) -> None:
        if self._closed or self.dev._fd < 0:
            raise ClosedError(f"{self.dev.uri}/{self.name} is closed")

    async def append(self, data: Buffer) -> int:
        self._check()
        chain = self._chain
        off = max(chain.reserved, self.size())
        chain.reserved = off + len(data)  # before the thread runs: appends never overlap
        await run_io(self.dev.write_sync, chain, [data], off)
        return off

    async def pread(self, offset: int, length: int) -> bytes:
        self._check()
        dev, chain = self.dev, self._chain
        end = min(offset + length, chain.size(dev.payload))
        out: list[bytes] = []
        pos = offset

        def run() -> bytes:
            nonlocal pos
            while pos < end:
                k, within = divmod(pos, dev.payload)
                n = min(end - pos, dev.payload - within)
                out.append(os.pread(dev._fd, n, dev._offset(chain.extents[k]) + PAGE + within))
                pos += n
            return b"".join(out)

        return await asyncio.to_thread(run) if end > offset else b""

    async def truncate(self, size: int) -> None:
        self._check()
        await run_io(self._truncate_sync, size)

    def _truncate_sync(self, size: int) -> None:
        dev, chain = self.dev, self._chain
        dev._writable()
        with chain.lock:
            if size >= chain.size(dev.payload):
                return
            keep = max(-(-size // dev.payload), 1)
            cut, chain.extents = chain.extents[keep:], chain.extents[:keep]
            chain.used = size - (keep - 1) * dev.payload
            chain.reserved = size
            last = chain.extents[-1]
            write_zeros(dev._fd, dev._offset(last) + PAGE + chain.used, dev.payload - chain.used)  # L2
            if not dev.zero_ended:
                dev._write_header(chain, keep - 1)
        dev._note_written(chain)
        dev._release(cut)

    async def sync(self) -> None:
        self._check()
        await run_io(self.dev.flush_sync, self._chain.last_write)

    def writev_sync(self, parts: Sequence[Buffer], offset: int) -> int:
        self._check()
        return self.dev.write_sync(self._chain, parts, offset)

    def fdatasync_sync(self) -> None:
        self._check()
        self.dev.flush_sync(self._chain.last_write)

    async def in_round(self, work: Callable[[], T]) -> T:
        """``work()`` (which writes through ``writev_sync``) in the device's next round; its
        result once the round's one flush covered the write (``terrafs/rounds.py``)."""
        self._check()
        return await self.dev.device_rounds.run(work)

    async def append_durable(self, build: Callable[[int], Sequence[Buffer]]) -> tuple[int, int]:
        self._check()

        def run() -> tuple[int, int]:
            off = self.size()
            n = self.dev.write_sync(self._chain, build(off), off)
            self.dev.flush_sync(self._chain.last_write)
            return off, n

        return await run_io(run)

    def size(self) -> int:
        return self._chain.size(self.dev.payload)

    async def close(self) -> None:
        self._closed = True
