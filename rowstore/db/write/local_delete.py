"""A delete by predicate coordinated on this node alone (docs/rfcs/0016-time-series-aggregates.md
§6): the phases ``node/cluster/commit.py`` runs across nodes — reserve, prepare, the decision
``txn/X`` in the catalog (the commit point), commit — with this node's participant as the one
share. A node alone, or a cluster node leading every partition the terms can match."""
from __future__ import annotations


from catalog.abc import Catalog, Check, Delete, Put
from rowstore.db.tasks import BackgroundTasks
from rowstore.db.write.committer import WriteResult
from rowstore.db.write.participant import Participant
from rowstore.db.write.two_phase import COMMITTED, txn_key
from rowstore.errors import UnavailableError
from rowstore.hlc import HybridClock, ts_from_ms
from rowstore.segments.wal import DECIDED
from terrafs.catalog_ops import commit
from terrafs.entropy import SYSTEM, Entropy


async def delete_where(participant: Participant, catalog: Catalog, clock: HybridClock, tasks: BackgroundTasks,
                       name: str, where: object = None, bbox: object = None, prefix: object = None,
                       pids: list[int] | None = None, entropy: Entropy = SYSTEM) -> WriteResult:
    """Delete what the terms match in partitions ``pids``, each of which must be served here
    (None: every one served here — a node alone serves them all); ``count``: the rows deleted.

    A cluster node passes the partitions it routed here: one it stopped leading since is
    refused (503) by the reservation, never skipped — a delete that skipped it would be
    acknowledged with that partition's rows still there."""
    d = await participant.definitions.describe(name)
    assert d.schema is not None  # describe() refuses a dropped table
    txn = DECIDED | entropy.bits(62)  # every share on this node: recovery may drop the decision
    floor = max(ts_from_ms(clock.now_ms()), clock.last + 1)
    r = await participant.reserve_where(name, d.table_id, d.schema.version, where, bbox, prefix, pids, floor, txn)
    try:
        n = await participant.prepare(txn, r.ts)
    except BaseException:
        await participant.abort(txn)
        raise
    key = txn_key(txn)
    res = await commit(catalog, [Check(key, 0)], [Put(key, COMMITTED)])
    if not res.committed:
        e = await catalog.get(key)
        if e is None or e.value != COMMITTED:  # its prepare outlived the timeout and was aborted
            await participant.abort(txn)
            raise UnavailableError(f"table {name!r}: the delete was aborted (its prepare timed out); retry")
    ts = await participant.commit(txn)
    tasks.spawn(commit(catalog, [], [Delete(key)]))
    return WriteResult(n, ts)
