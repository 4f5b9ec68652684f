"""The client side: the Python clients of the HTTP API, bulk ingest and the offline fsck.
Imports no server module (``node.http``, ``node.cluster``, ``node.daemon``)."""

from node.client.client import AsyncClient, Client
from node.errors import ApiError

__all__ = ["ApiError", "AsyncClient", "Client"]
