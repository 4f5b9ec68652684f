"""The Raft-replicated catalog backend, ``raft://`` (RFC 0005, docs/raft.md)."""
from catalog.raft.catalog import RaftCatalog, StaleReads, parse_raft_uri, read_secret

__all__ = ["RaftCatalog", "StaleReads", "parse_raft_uri", "read_secret"]
