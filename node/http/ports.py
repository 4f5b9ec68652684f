"""What the HTTP surface asks of the daemon, as small interfaces (the daemon implements them,
``node/daemon/``; the HTTP layer never holds the daemon itself): the node's status and
cluster view, its metrics page, and background jobs run now."""
from __future__ import annotations

from typing import Any, Protocol


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
