"""The pysyncobj release the Raft catalog is written against.

``wire.py``, ``replica.py`` and ``journal.py`` override or use pysyncobj's private methods
and fields (RFC 0005): a pysyncobj release may rename any of them without notice. So
pyproject.toml pins this exact version, and ``tests/catalog/test_pysyncobj_pin.py``
fails with a clear message when another one is installed or a name below went missing.
Upgrading means: bump both, re-read the overridden methods against the new source, run
the Raft suites."""
from __future__ import annotations

PYSYNCOBJ_VERSION = "0.3.17"

# class (module path) -> private names the catalog overrides, calls or reads
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "pysyncobj.tcp_connection.TcpConnection": (
        "_TcpConnection__processRead", "_TcpConnection__processParseMessage"),
    "pysyncobj.tcp_server.TcpServer": ("_TcpServer__onNewConnection",),
    "pysyncobj.transport.TCPTransport": (
        "_createServer", "_onIncomingMessageReceived", "_onMessageReceived", "_connections",
        "_unknownConnections", "_nodeAddrToNode", "_syncObj", "_server", "_shouldConnect",
        "_onOutgoingConnected", "_onNodeConnected", "_onNewIncomingConnection", "_onDisconnected"),
    "pysyncobj.journal.Journal": ("_destroy",),
    "pysyncobj.syncobj.SyncObj": (
        "_poller", "_isLeader", "_getLeader", "_doDestroy", "_applyCommand", "_SyncObj__raftElectionDeadline"),
}
