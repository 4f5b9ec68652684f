"""Reads: snapshots and queries through the key and column indexes, what external readers ask
a node for (plans, tails, the change feed; RFC 0006), a partition read from its objects alone
when its leader does not answer (watermarks; RFC 0010 §6), and the read leases that hold
segments back from the collector. Reading an offloaded segment *without* a node is
``rowstore/reads/external.py``."""
