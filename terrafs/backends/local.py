"""Local-directory block device and object store (URI scheme ``trfs``).

Blocking calls run in threads (``asyncio.to_thread``; writes and syncs in
``terrafs.iopool``). Durability: data is
made durable by ``DeviceFile.sync()`` (fdatasync); create/rename/delete on a
durable device fsync the directory before returning. Object puts write a
temp file, fsync it, rename it into place and fsync the directory, so a
reader never sees a partial object.
"""
from __future__ import annotations

import asyncio
import errno
import os
import uuid
from typing import AsyncIterable, Callable, Iterable, Sequence

from catalog.fsutil import fsync_dir
from terrafs.abc import BlockDevice, Buffer, DeviceFile, ObjectInfo, ObjectStore, check_name
from terrafs.errors import (
    AlreadyExistsError,
    ClosedError,
    FileNotFoundInDeviceError,
    ObjectNotFoundError,
    StorageIOError,
)
from terrafs.iopool import run_io

_TMP_DIR = ".tmp"  # object-store staging; never listed


def _fdatasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


class LocalDeviceFile(DeviceFile):
    def __init__(self, name: str, path: str, fd: int):
        self.name = name
        self.path = path
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def _fdc(self) -> int:
        if self._fd < 0:
            raise ClosedError(f"file {self.path} is closed")
        return self._fd

    async def append(self, data: Buffer) -> int:
        fd = self._fdc()
        off = self._size
        self._size += len(data)  # reserve before the thread runs: appends never overlap
        await run_io(_pwrite_all, fd, data, off)
        return off

    async def pread(self, offset: int, length: int) -> bytes:
        return await asyncio.to_thread(os.pread, self._fdc(), length, offset)

    async def truncate(self, size: int) -> None:
        await asyncio.to_thread(os.ftruncate, self._fdc(), size)
        self._size = size

    async def sync(self) -> None:
        await run_io(_fdatasync, self._fdc())

    def writev_sync(self, parts: Sequence[Buffer], offset: int) -> int:
        """Blocking positional write of several buffers (one pwritev where the kernel allows),
        for code running in a worker thread; returns the bytes written."""
        n = _pwritev_all(self._fdc(), parts, offset)
        self._size = max(self._size, offset + n)
        return n

    def fdatasync_sync(self) -> None:
        _fdatasync(self._fdc())

    async def append_durable(self, build: Callable[[int], Sequence[Buffer]]) -> tuple[int, int]:
        fd = self._fdc()

        def run() -> tuple[int, int]:
            off = self._size
            parts = build(off)
            n = _pwritev_all(fd, parts, off)
            self._size = off + n  # single writer: nothing else appends meanwhile
            _fdatasync(fd)
            return off, n

        return await run_io(run)

    def size(self) -> int:
        return self._size

    async def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _pwritev_all(fd: int, parts: Sequence[Buffer], offset: int) -> int:
    """Write a list of buffers at ``offset`` with as few syscalls as the kernel allows."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    total = sum(len(v) for v in views)
    i = 0
    while i < len(views):
        n = os.pwritev(fd, views[i : i + 1024], offset)  # IOV_MAX is 1024 on Linux
        offset += n
        while i < len(views) and n >= len(views[i]):
            n -= len(views[i])
            i += 1
        if n:
            views[i] = views[i][n:]
    return total


def _pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class LocalBlockDevice(BlockDevice):
    def __init__(self, root: str, durable: bool = True, uri: str | None = None):
        self.root = os.path.abspath(root)
        self.durable = durable
        self.uri = uri or f"trfs://{self.root}"
        os.makedirs(self.root, exist_ok=True)

    def _path(self, name: str) -> str:
        return os.path.join(self.root, check_name(name))

    def free_bytes(self) -> int | None:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def _sync_dir(self, path: str) -> None:
        if self.durable:
            fsync_dir(os.path.dirname(path))

    async def create(self, name: str) -> DeviceFile:
        path = self._path(name)

        def _create() -> int:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
            except FileExistsError:
                raise AlreadyExistsError(f"{self.uri}/{name} exists") from None
            self._sync_dir(path)
            return fd

        return LocalDeviceFile(name, path, await asyncio.to_thread(_create))

    async def open(self, name: str) -> DeviceFile:
        path = self._path(name)
        try:
            fd = await asyncio.to_thread(os.open, path, os.O_RDWR)
        except FileNotFoundError:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found") from None
        return LocalDeviceFile(name, path, fd)

    async def delete(self, name: str) -> None:
        path = self._path(name)

        def _delete() -> None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found") from None
            self._sync_dir(path)

        await asyncio.to_thread(_delete)

    async def delete_files(self, names: list[str]) -> None:
        """Every file removed in one worker-thread hop, each directory synced once."""
        def _all() -> None:
            dirs = set()
            for name in names:
                path = self._path(name)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                dirs.add(path)
            for path in {os.path.dirname(p): p for p in dirs}.values():
                self._sync_dir(path)

        await asyncio.to_thread(_all)

    async def rename(self, src: str, dst: str) -> None:
        ps, pd = self._path(src), self._path(dst)

        def _rename() -> None:
            os.makedirs(os.path.dirname(pd), exist_ok=True)
            try:
                os.replace(ps, pd)
            except FileNotFoundError:
                raise FileNotFoundInDeviceError(f"{self.uri}/{src} not found") from None
            self._sync_dir(pd)
            if os.path.dirname(ps) != os.path.dirname(pd):
                self._sync_dir(ps)

        await asyncio.to_thread(_rename)

    async def write_files(self, items: list[tuple[str, bytes]]) -> None:
        """Every file written and renamed into place in one worker-thread hop (``write_file``
        takes five: exists, create, write, close, rename)."""
        def _all() -> None:
            for name, data in items:
                path = self._path(name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path + ".tmp", "wb") as f:
                    f.write(data)
                    if self.durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(path + ".tmp", path)
                self._sync_dir(path)
        await asyncio.to_thread(_all)

    async def read_files(self, names: list[str]) -> list[bytes | None]:
        """Every file read in one worker-thread hop (``read_file`` takes three: open, read, close)."""
        def _all() -> list[bytes | None]:
            out: list[bytes | None] = []
            for name in names:
                try:
                    with open(self._path(name), "rb") as f:
                        out.append(f.read())
                except FileNotFoundError:
                    out.append(None)
            return out
        return await asyncio.to_thread(_all)

    async def list(self, prefix: str = "") -> list[str]:
        return await asyncio.to_thread(_walk, self.root, prefix, ())

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(os.path.exists, self._path(name))


def _walk(root: str, prefix: str, skip_dirs: tuple[str, ...]) -> list[str]:
    """Relative file names under ``root`` that start with ``prefix``, sorted."""
    base = os.path.join(root, prefix.rpartition("/")[0])
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel + "/"
        if not rel:
            dirnames[:] = [d for d in dirnames if d not in skip_dirs]
        out.extend(rel + f for f in filenames if (rel + f).startswith(prefix))
    return sorted(out)


class LocalObjectStore(ObjectStore):
    def __init__(self, root: str, uri: str | None = None):
        self.root = os.path.abspath(root)
        self.uri = uri or f"trfs://{self.root}"
        os.makedirs(os.path.join(self.root, _TMP_DIR), exist_ok=True)

    def _path(self, key: str) -> str:
        if check_name(key).split("/")[0] == _TMP_DIR:
            raise StorageIOError(f"key {key!r} is reserved")
        return os.path.join(self.root, key)

    async def put(self, key: str, data: Buffer) -> ObjectInfo:
        path = self._path(key)
        await asyncio.to_thread(self._put_sync, path, [data])
        return ObjectInfo(key, len(data))

    async def put_stream(self, key: str, chunks: AsyncIterable[bytes]) -> ObjectInfo:
        path = self._path(key)
        tmp = os.path.join(self.root, _TMP_DIR, uuid.uuid4().hex)
        fd = await asyncio.to_thread(os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        size = 0
        try:
            async for c in chunks:
                await asyncio.to_thread(_pwrite_all, fd, c, size)
                size += len(c)
            await asyncio.to_thread(self._publish, fd, tmp, path)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        finally:
            os.close(fd)
        return ObjectInfo(key, size)

    def _put_sync(self, path: str, chunks: Iterable[Buffer]) -> None:
        tmp = os.path.join(self.root, _TMP_DIR, uuid.uuid4().hex)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            off = 0
            for c in chunks:
                _pwrite_all(fd, c, off)
                off += len(c)
            self._publish(fd, tmp, path)
        except BaseException:
            _unlink_quiet(tmp)
            raise
        finally:
            os.close(fd)

    @staticmethod
    def _publish(fd: int, tmp: str, path: str) -> None:
        os.fsync(fd)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self._read, key, 0, None)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        return await asyncio.to_thread(self._read, key, offset, length)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return await asyncio.to_thread(self._read_many, key, list(ranges))

    def _read_many(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.uri}/{key} not found") from None
        try:
            return [os.pread(fd, max(n, 0), o) for o, n in ranges]
        finally:
            os.close(fd)

    def _read(self, key: str, offset: int, length: int | None) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.uri}/{key} not found") from None
        try:
            if length is None:
                length = os.fstat(fd).st_size - offset
            return os.pread(fd, max(length, 0), offset)
        finally:
            os.close(fd)

    async def head(self, key: str) -> ObjectInfo:
        try:
            st = await asyncio.to_thread(os.stat, self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.uri}/{key} not found") from None
        return ObjectInfo(key, st.st_size)

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        def _list() -> list[ObjectInfo]:
            out = []
            for k in _walk(self.root, prefix, (_TMP_DIR,)):
                try:
                    out.append(ObjectInfo(k, os.stat(os.path.join(self.root, k)).st_size))
                except FileNotFoundError:
                    continue  # deleted while listing
            return out

        return await asyncio.to_thread(_list)

    async def delete(self, key: str) -> None:
        path = self._path(key)

        def _delete() -> None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno == errno.EISDIR:
                    raise StorageIOError(f"{self.uri}/{key} is a directory") from e
                raise
            fsync_dir(os.path.dirname(path))

        await asyncio.to_thread(_delete)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
