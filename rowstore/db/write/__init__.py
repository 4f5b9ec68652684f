"""Writes: group commit, the two-phase commit of multi-partition batches (``txn/<id>``), and
this node's share of a batch another node coordinates (RFC 0003, RFC 0010 §3)."""
