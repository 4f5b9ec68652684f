"""The tables of one node, as one object (:class:`rowstore.db.database.Database`) over the
parts that do the work, one subpackage per concern: ``write/`` (group and two-phase commit,
this node's share of a batch coordinated elsewhere), ``read/`` (snapshots and queries, what
external readers ask for, reads without a leader, read leases), ``background/`` (maintenance,
garbage collection) and ``serving/`` (a partition starting or stopping being served here:
leadership of a replicated one, hand-off of a one-copy one). Beside them, what every part
shares: the table registry and the one home of background tasks. Parts import the shared
modules and ``read/``'s watermarks and leases, never ``database.py`` (tests/structure)."""
