"""The log device: a node's active files as extent chains of one preallocated file, so that one
``fdatasync`` makes every group written before it durable, whatever its file (RFC 0011).

This module is its ``BlockDevice`` interface: names to files, each operation opening the device
first and handing its blocking work to the I/O threads (``terrafs.iopool``). The work itself:
:mod:`terrafs.backends.logdev_core`; an open file: :mod:`terrafs.backends.logdev_file`; the
format: docs/format/logdev.md and :mod:`terrafs.backends.logdev_format`.
"""
from __future__ import annotations

import asyncio
import os

from terrafs.abc import BlockDevice, DeviceFile, check_name
from terrafs.backends.logdev_core import LogDeviceCore
from terrafs.backends.logdev_file import LogFile
from terrafs.backends.logdev_format import MAX_NAME, Chain
from terrafs.errors import AlreadyExistsError, FileNotFoundInDeviceError, StorageIOError, no_space
from terrafs.iopool import run_io


class LogDevice(LogDeviceCore, BlockDevice):
    """A durable ``BlockDevice`` whose files live in ``path`` (one preallocated file)."""

    durable = True
    _opening: asyncio.Future[None] | None = None  # the first operation's open, shared by those meanwhile

    async def _ready(self) -> None:
        if self._fd >= 0:
            return
        if self._opening is None:
            self._opening = asyncio.ensure_future(run_io(self._open_sync))
        await asyncio.shield(self._opening)

    async def create(self, name: str) -> DeviceFile:
        check_name(name)
        if len(name) > MAX_NAME:
            raise StorageIOError(f"name {name!r} is longer than {MAX_NAME} bytes")
        await self._ready()
        self._writable()
        with self._lock:
            if name in self._chains:
                raise AlreadyExistsError(f"{self.uri}/{name} exists")
            chain = self._chains[name] = Chain(name, int.from_bytes(os.urandom(8), "little"))

        def run() -> None:
            self.write_sync(chain, [], 0)
            self.flush_sync(chain.last_write)

        try:
            await run_io(run)
        except BaseException as e:
            with self._lock:
                self._chains.pop(name, None)
            if chain.extents:
                await run_io(self._release, list(chain.extents))
            full = no_space(e)
            if full is not None:
                raise full from e
            raise
        return LogFile(self, name, chain)

    async def open(self, name: str) -> DeviceFile:
        await self._ready()
        chain = self._chains.get(check_name(name))
        if chain is None:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")
        return LogFile(self, name, chain)

    async def delete(self, name: str) -> None:
        await self._ready()
        self._writable()
        with self._lock:
            chain = self._chains.pop(check_name(name), None)
        if chain is None:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")
        await run_io(self._release, list(chain.extents))  # index 0 first: the name goes first

    async def rename(self, src: str, dst: str) -> None:
        await self._ready()
        self._writable()
        check_name(dst)
        with self._lock:
            chain = self._chains.get(check_name(src))
            if chain is None:
                raise FileNotFoundInDeviceError(f"{self.uri}/{src} not found")
            old = self._chains.get(dst)

        def run() -> None:
            with chain.lock:
                chain.name = dst
                self._write_header(chain, 0)  # the greater seq names dst after a crash
            self.flush_sync(self._note_written(chain))
            with self._lock:
                self._chains.pop(src, None)
                self._chains[dst] = chain
            if old is not None and old is not chain:
                self._release(list(old.extents))

        await run_io(run)

    async def list(self, prefix: str = "") -> list[str]:
        await self._ready()
        with self._lock:
            return sorted(n for n in self._chains if n.startswith(prefix))

    async def exists(self, name: str) -> bool:
        await self._ready()
        return check_name(name) in self._chains

    def free_bytes(self) -> int | None:
        st = os.statvfs(os.path.dirname(self.path))
        return st.f_bavail * st.f_frsize + (len(self._free) - len(self._holes)) * self.payload

    def rounds(self) -> tuple[int, int] | None:
        return self.device_rounds.hops, self.device_rounds.works

    def space(self) -> tuple[int, int]:
        """(bytes the device's file holds on the host file system, bytes of extents files use)."""
        st = os.fstat(self._fd) if self._fd >= 0 else None
        allocated = st.st_blocks * 512 if st is not None else 0
        with self._lock:
            used = sum(len(c.extents) for c in self._chains.values()) * self.extent_size
        return allocated, used

    async def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
