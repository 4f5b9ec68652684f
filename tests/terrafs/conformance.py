"""Conformance suites every BlockDevice and ObjectStore backend runs.

A backend's test module subclasses a suite and provides a ``make`` fixture
that yields a fresh, opened instance (zarr-python's pattern).
"""
from __future__ import annotations

import asyncio
import os

import pytest

from terrafs.errors import (
    AlreadyExistsError,
    ConfigurationError,
    FileNotFoundInDeviceError,
    ObjectNotFoundError,
)


class BlockDeviceSuite:
    """Behaviour every BlockDevice must have."""

    async def test_create_append_pread(self, make):
        dev = make
        f = await dev.create("a/b.dat")
        assert await f.append(b"hello ") == 0
        assert await f.append(b"world") == 6
        assert f.size() == 11
        await f.sync()
        assert await f.pread(0, 11) == b"hello world"
        assert await f.pread(6, 100) == b"world"
        assert await f.pread(20, 5) == b""
        await f.close()
        g = await dev.open("a/b.dat")
        assert g.size() == 11 and await g.pread(0, 5) == b"hello"
        await g.close()

    async def test_create_exclusive(self, make):
        await (await make.create("x")).close()
        with pytest.raises(AlreadyExistsError):
            await make.create("x")

    async def test_open_missing(self, make):
        with pytest.raises(FileNotFoundInDeviceError):
            await make.open("nope")

    async def test_truncate(self, make):
        f = await make.create("t")
        await f.append(b"0123456789")
        await f.truncate(4)
        assert f.size() == 4
        assert await f.append(b"xy") == 4
        assert await f.pread(0, 100) == b"0123xy"
        await f.close()

    async def test_delete_and_list(self, make):
        for n in ["p/1", "p/2", "q/1", "p3"]:
            await (await make.create(n)).close()
        assert await make.list("p") == ["p/1", "p/2", "p3"]
        assert await make.list("p/") == ["p/1", "p/2"]
        await make.delete("p/1")
        assert not await make.exists("p/1")
        assert await make.list() == ["p/2", "p3", "q/1"]
        with pytest.raises(FileNotFoundInDeviceError):
            await make.delete("p/1")

    async def test_rename_replaces(self, make):
        await make.write_file("cfg", b"old")
        await make.write_file("cfg", b"new")
        assert await make.read_file("cfg") == b"new"
        await make.rename("cfg", "cfg2")
        assert await make.list() == ["cfg2"]

    async def test_concurrent_appends_do_not_overlap(self, make):
        f = await make.create("c")
        chunks = [bytes([i]) * 1000 for i in range(50)]
        offs = await asyncio.gather(*(f.append(c) for c in chunks))
        assert sorted(offs) == [i * 1000 for i in range(50)]
        for off, c in zip(offs, chunks):
            assert await f.pread(off, 1000) == c
        await f.close()

    async def test_bad_names(self, make):
        for bad in ["", "/abs", "a/../b", "a//b", "sp ace"]:
            with pytest.raises(ConfigurationError):
                await make.create(bad)


class ObjectStoreSuite:
    """Behaviour every ObjectStore must have."""

    async def test_put_get_head(self, make):
        info = await make.put("seg/1.obj", b"abcdef")
        assert info.size == 6
        assert await make.get("seg/1.obj") == b"abcdef"
        assert (await make.head("seg/1.obj")).size == 6

    async def test_get_range(self, make):
        data = os.urandom(10_000)
        await make.put("r", data)
        assert await make.get_range("r", 0, 10) == data[:10]
        assert await make.get_range("r", 9_990, 10) == data[9_990:]
        assert await make.get_range("r", 5_000, 1234) == data[5_000:6_234]
        assert await make.get_range("r", 9_995, 100) == data[9_995:]

    async def test_missing(self, make):
        with pytest.raises(ObjectNotFoundError):
            await make.get("missing")
        with pytest.raises(ObjectNotFoundError):
            await make.head("missing")
        with pytest.raises(ObjectNotFoundError):
            await make.get_range("missing", 0, 1)

    async def test_overwrite_is_whole(self, make):
        await make.put("k", b"1" * 1000)
        await make.put("k", b"2" * 10)
        assert await make.get("k") == b"2" * 10

    async def test_list_prefix_sorted(self, make):
        for k in ["a/2", "a/1", "b/1", "a10"]:
            await make.put(k, k.encode())
        assert [o.key for o in await make.list("a")] == ["a/1", "a/2", "a10"]
        assert [o.key for o in await make.list("a/")] == ["a/1", "a/2"]
        assert [(o.key, o.size) for o in await make.list()] == [
            ("a/1", 3), ("a/2", 3), ("a10", 3), ("b/1", 3)]

    async def test_delete_idempotent(self, make):
        await make.put("d", b"x")
        await make.delete("d")
        await make.delete("d")
        with pytest.raises(ObjectNotFoundError):
            await make.get("d")
        assert await make.list("d") == []

    async def test_empty_object(self, make):
        await make.put("empty", b"")
        assert await make.get("empty") == b""
        assert (await make.head("empty")).size == 0

    async def test_put_stream(self, make):
        chunks = [os.urandom(100_000) for _ in range(7)]

        async def gen():
            for c in chunks:
                yield c

        info = await make.put_stream("big/obj", gen())
        assert info.size == 700_000
        assert await make.get("big/obj") == b"".join(chunks)

    async def test_concurrent_puts(self, make):
        await asyncio.gather(*(make.put(f"c/{i:03d}", bytes([i]) * 100) for i in range(40)))
        objs = await make.list("c/")
        assert len(objs) == 40
        assert await make.get("c/017") == bytes([17]) * 100
