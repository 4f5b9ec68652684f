"""What cluster control and the HTTP surface work with once a node's stores are open: the
configuration, the catalog, the engine and the cluster's members. The daemon makes one when
it has opened them (``node/daemon/lifecycle.py``, ``Node.open``); nothing below the daemon
holds the daemon itself."""
from __future__ import annotations

from dataclasses import dataclass

from catalog.abc import Catalog
from node.cluster.members import Cluster
from node.config import NodeConfig
from rowstore.db.database import Database


@dataclass(frozen=True)
class Serving:
    cfg: NodeConfig
    catalog: Catalog
    db: Database
    cluster: Cluster
