"""Memory and local-directory backends run the conformance suites."""
import os

import pytest

from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from tests.terrafs.conformance import BlockDeviceSuite, ObjectStoreSuite


class TestMemoryBlockDevice(BlockDeviceSuite):
    @pytest.fixture
    def make(self):
        return MemoryBlockDevice()


class TestLocalBlockDevice(BlockDeviceSuite):
    @pytest.fixture
    def make(self, tmp_path):
        return LocalBlockDevice(str(tmp_path / "block"))


class TestMemoryObjectStore(ObjectStoreSuite):
    @pytest.fixture
    def make(self):
        return MemoryObjectStore()


class TestLocalObjectStore(ObjectStoreSuite):
    @pytest.fixture
    def make(self, tmp_path):
        return LocalObjectStore(str(tmp_path / "objects"))


async def test_local_object_put_leaves_no_temp(tmp_path):
    s = LocalObjectStore(str(tmp_path))
    await s.put("a/b", b"x")
    assert os.listdir(tmp_path / ".tmp") == []
    assert [o.key for o in await s.list()] == ["a/b"]


async def test_memory_device_crash_drops_unsynced():
    dev = MemoryBlockDevice()
    f = await dev.create("wal")
    await f.append(b"durable")
    await f.sync()
    await f.append(b"lost")
    dev.crash()
    assert await (await dev.open("wal")).pread(0, 100) == b"durable"
