"""What the HTTP surface asks of the daemon, as small interfaces (the daemon implements them,
``node/daemon/``; the HTTP layer never holds the daemon itself): the node's status and
cluster view, its metrics page, and background jobs run now. Also what the data API's
handlers use of ``node.http.api.Api`` (``HandlerApi``), which imports their modules."""
from __future__ import annotations

from typing import Any, Protocol

from node.cluster.controller import NodeReplication
from node.cluster.members import Cluster
from node.cluster.router import Router
from node.cluster.serving import Serving
from node.config import NodeConfig
from node.http.coalesce import Coalescer
from node.metrics import Metrics
from node.phase import Readiness
from rowstore.db.database import Database


class StatusSource(Protocol):
    async def status(self) -> dict[str, Any]:
        """``GET /v1/admin/status``: this node's status (docs/REFERENCE.md §3)."""

    async def cluster_view(self) -> dict[str, Any]:
        """``GET /v1/admin/cluster``: members, the catalog's leader, partitions and placement."""


class MetricsSource(Protocol):
    async def render_metrics(self) -> tuple[bytes, str]:
        """The Prometheus text of ``GET /metrics`` and its content type."""


class NodeViews(StatusSource, MetricsSource, Protocol):
    """The daemon's views of itself the admin routes serve."""


class JobRunner(Protocol):
    async def run(self, name: str, trigger: str = "admin", **kw: Any) -> dict[str, Any]:
        """Run background job ``name`` (seal, offload, checkpoint, gc) now; what it did."""


class HandlerApi(Protocol):
    """What the handlers of ``routes/admin.py``, ``tables.py``, ``rows.py`` and ``console.py``
    use of ``node.http.api.Api`` (which implements it): ``api.py`` imports those modules, so
    they cannot import ``Api`` back. The other route sets take ``Api`` itself."""

    @property
    def cfg(self) -> NodeConfig: ...

    @property
    def readiness(self) -> Readiness: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def views(self) -> NodeViews: ...

    @property
    def serving(self) -> Serving: ...

    @property
    def router(self) -> Router: ...

    @property
    def replication(self) -> NodeReplication: ...

    @property
    def jobs(self) -> JobRunner: ...

    @property
    def cluster(self) -> Cluster: ...

    @property
    def multi(self) -> bool: ...

    @property
    def writes(self) -> Coalescer: ...

    @property
    def db(self) -> Database: ...

    def parsed(self, body: bytes) -> Any:
        """A small JSON body parsed on the loop."""
