"""The tables of one node, as one object (:class:`rowstore.db.database.Database`) over the
parts that do the work: the table registry, the committer, reads, external reads (plans,
tails, changes), leases, maintenance, and the one home of background tasks."""
