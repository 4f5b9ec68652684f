"""The memory and trkv:// catalogs run the conformance suite."""
import pytest

from catalog.local import LocalCatalog
from catalog.memory import MemoryCatalog
from tests.catalog.conformance import CatalogSuite


class TestMemoryCatalog(CatalogSuite):
    @pytest.fixture
    async def make(self):
        c = MemoryCatalog()
        await c.open()
        yield c
        await c.close()

    @pytest.fixture
    def reopen(self):
        return None


class TestLocalCatalog(CatalogSuite):
    durable = True

    @pytest.fixture
    async def make(self, tmp_path):
        c = LocalCatalog(str(tmp_path / "cat"))
        await c.open()
        yield c
        await c.close()

    @pytest.fixture
    def reopen(self, tmp_path):
        async def _reopen(c):
            await c.close()
            c2 = LocalCatalog(str(tmp_path / "cat"))
            await c2.open()
            return c2
        return _reopen


class TestLocalCatalogTinySnapshots(TestLocalCatalog):
    """Same suite with a snapshot after almost every transaction."""

    @pytest.fixture
    async def make(self, tmp_path):
        c = LocalCatalog(str(tmp_path / "cat"), snapshot_bytes=200)
        await c.open()
        yield c
        await c.close()
