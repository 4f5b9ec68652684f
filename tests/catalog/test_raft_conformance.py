"""raft:// runs the catalog conformance suite on a real 3-process cluster on loopback.

Every call goes to the next node in turn, so transactions are forwarded to the
leader and linearizable reads run on followers too.
"""
import pytest

from tests.catalog.conformance import CatalogSuite
from tests.catalog.raft_cluster import Cluster, RemoteCatalog


class TestRaftCatalog(CatalogSuite):
    durable = True

    @pytest.fixture
    async def make(self, tmp_path):
        cl = Cluster(str(tmp_path))
        cl.start_all()
        try:
            await cl.wait_leader()
            yield RemoteCatalog(cl)
        finally:
            cl.stop_all()

    @pytest.fixture
    def reopen(self):
        async def _reopen(c: RemoteCatalog):
            cl = c.cluster
            cl.stop_all()  # kill -9 every node, then start them again on the same directories
            cl.start_all()
            await cl.wait_leader()
            return RemoteCatalog(cl)
        return _reopen
