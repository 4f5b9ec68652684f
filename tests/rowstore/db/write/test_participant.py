"""This node's share of a batch coordinated elsewhere (rowstore.db.write.participant, RFC 0010 §3):
an abort that arrives while the prepare's append is still in flight (the coordinator went
silent, the timeout fired) must roll the localids back once the append lands — otherwise the
log's next rows are numbered from a base replay will not use, and the key index points rows
off (``GET k`` answers another key's row)."""
import asyncio
import secrets

import pyarrow as pa
import pytest

from catalog.abc import Check, Put
from rowstore.db.write.two_phase import COMMITTED, txn_key
from rowstore.errors import UnavailableError
from rowstore.segments.wal import DECIDED, SPANS_NODES
from terrafs.catalog_ops import commit
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


async def _prepare_held_at_the_disk():
    """Ten rows committed, then a reserved batch whose prepare waits at a slow disk (BATCH X
    enqueued): (world, db, segment, its real append, the event releasing the disk, txn,
    reservation, the prepare's future)."""
    w = TablesWorld(partitions=1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(10)))
    part = (await db.tables.table(d)).parts[0]
    seg = await part.current()
    held, real = asyncio.Event(), seg.append_encoded

    async def slow_append(*a, **k):  # the disk (or the majority) is slow
        await held.wait()
        return await real(*a, **k)
    seg.append_encoded = slow_append
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 105)), 0, txn)
    prep = asyncio.ensure_future(db.participant.prepare(txn, r.ts))
    await asyncio.sleep(0.01)  # BATCH X enqueued, waiting for the disk
    return w, db, seg, real, held, txn, r, prep


async def test_an_abort_during_an_inflight_prepare_rolls_back_when_the_append_lands():
    w, db, seg, real, held, txn, r, prep = await _prepare_held_at_the_disk()
    await db.participant.abort(txn)  # the coordinator's timeout: aborted here
    held.set()
    with pytest.raises(UnavailableError):  # 503 at the edge: a timeout, retry (RFC 0010 §3)
        await prep
    seg.append_encoded = real
    await db.upsert("m", rows(range(20, 25), v=7.0))  # numbered right after the 10 committed rows
    assert seg.durable_rows == 15
    for k in range(20, 25):
        assert (await db.get("m", k))["v"] == 7.0
    assert await db.get("m", 100) is None
    w.crash()
    db = await w.start()  # replay drops the aborted BATCH X: the index must agree with it
    for k in range(20, 25):
        assert (await db.get("m", k))["v"] == 7.0, k
    got, _ = await db.read_all("m")
    assert got.column("id").to_pylist() == list(range(10)) + list(range(20, 25))
    assert pa.compute.all(pa.compute.equal(got.column("v").slice(10), 7.0)).as_py()


async def test_a_prepare_whose_caller_is_cancelled_finishes_and_is_then_aborted_whole():
    """The caller of a prepare goes away midway (a coordinator's own share whose request was
    cancelled, say): the prepare must not stop half-way — its BATCH X enqueued, the rows not
    accounted for — but finish, so that the abort that follows rolls it back; a cancelled one
    left index entries past a segment's end (found by the simulation running the node's own
    coordinator, seed 26)."""
    w, db, seg, real, held, txn, r, prep = await _prepare_held_at_the_disk()
    prep.cancel()
    held.set()
    with pytest.raises(asyncio.CancelledError):
        await prep
    seg.append_encoded = real
    assert await db.participant.prepare(txn, r.ts) == 5  # it finished: sent again, it answers as prepared
    await db.participant.abort(txn)
    await db.upsert("m", rows(range(20, 25), v=7.0))  # numbered right after the 10 committed rows
    assert seg.durable_rows == 15
    assert await db.get("m", 100) is None
    w.crash()
    db = await w.start()
    got, _ = await db.read_all("m")
    assert got.column("id").to_pylist() == list(range(10)) + list(range(20, 25))


async def test_a_prepare_sent_twice_appends_its_batch_once():
    """The network may deliver a prepare twice (a retry, a duplicate): the second waits for the
    first's outcome instead of appending BATCH X again. Appended twice, replay dropped the
    first copy and numbered every later row one batch lower than the index did — the index
    then named rows past the segment's end (found by the seeded simulation)."""
    w = TablesWorld(1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(10)))
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 105)), 0, txn)
    await asyncio.gather(db.participant.prepare(txn, r.ts), db.participant.prepare(txn, r.ts))
    await db.participant.prepare(txn, r.ts)  # and once more after it is prepared
    await commit(db.catalog, [Check(txn_key(txn), 0)], [Put(txn_key(txn), COMMITTED)])  # the decision
    await db.participant.commit(txn)
    await db.upsert("m", rows(range(20, 25), v=7.0))
    seg = await (await db.tables.table(d)).parts[0].current()
    assert seg.durable_rows == 20
    await db.seal()  # the sealed object is built by replaying the log
    for k in [*range(10), *range(100, 105), *range(20, 25)]:
        assert (await db.get("m", k))["id"] == k
    w.crash()
    db = await w.start()
    got, _ = await db.read_all("m")
    assert got.column("id").to_pylist() == [*range(10), *range(20, 25), *range(100, 105)]


@pytest.mark.parametrize("where", ["current", "clock"])
async def test_an_abort_before_the_prepare_appends_keeps_its_batch_out_of_the_log(where):
    """The same abort, earlier: while the prepare still waits for its segment (a full one being
    sealed) or for the clock to record a higher commit timestamp. The abort released the locks
    and the prepare then appended BATCH X anyway and answered 200: nothing rolled it back, the
    next batch was numbered after it, replay dropped it, and the index named rows past the
    segment's end (found by the nemesis suite, seed 1: an offloaded segment of 6 rows whose
    index named localid 9)."""
    w = TablesWorld(partitions=1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(10)))
    part = (await db.tables.table(d)).parts[0]
    seg = await part.current()
    held = asyncio.Event()
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 105)), 0, txn)
    if where == "current":
        real = part.current

        async def slow_current():  # the full segment is being sealed
            await held.wait()
            return await real()
        part.current = slow_current
        ts = r.ts
    else:
        clock, real = db.timeline.clock, db.timeline.clock.observe_durably

        async def slow_observe(t):  # the clock's new high-water mark goes to the disk
            await held.wait()
            return await real(t)
        clock.observe_durably = slow_observe
        ts = r.ts + 1000  # another participant reserved higher: this one moves its timestamp
    prep = asyncio.ensure_future(db.participant.prepare(txn, ts))
    await asyncio.sleep(0.01)
    await db.participant.abort(txn)  # the coordinator is gone: aborted here
    held.set()
    with pytest.raises(UnavailableError):
        await prep
    if where == "current":
        part.current = real
    else:
        clock.observe_durably = real
    await db.upsert("m", rows(range(20, 25), v=7.0))
    assert seg.durable_rows == 15
    await db.seal()  # the sealed object is built by replaying the log
    for k in range(20, 25):
        assert (await db.get("m", k))["v"] == 7.0, k
    assert await db.get("m", 100) is None
    w.crash()
    db = await w.start()
    got, _ = await db.read_all("m")
    assert got.column("id").to_pylist() == list(range(10)) + list(range(20, 25))


async def test_an_abort_that_overtakes_its_reserve_keeps_the_partition_free():
    """A coordinator gives up on a reserve still queued behind a partition's writer lock (its
    call timed out) and aborts it. The reserve used to take the lock later anyway and hold the
    partition until the prepare timeout — then the next stale reserve in the queue did the
    same, for as long as the queue was (simulation seed 4747: a partition held for a minute
    after every fault healed, no batch acknowledged). Aborted first, it now fails at once."""
    w = TablesWorld(partitions=1, prepare_timeout_s=30.0)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    first = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(5)), 0, first)
    stale = DECIDED | SPANS_NODES | secrets.randbits(60)
    queued = asyncio.ensure_future(db.participant.reserve("m", d.table_id, d.schema.version, rows(range(5, 10)), 0,
                                                          stale))
    await asyncio.sleep(0.01)  # waiting for the writer lock
    await db.participant.abort(stale)  # its coordinator gave up
    await db.participant.abort(first)
    with pytest.raises(UnavailableError, match="aborted by its coordinator"):
        await queued
    assert db.participant.held == 0
    await asyncio.wait_for(db.upsert("m", rows(range(20, 25))), 2.0)  # the partition is free
    late = DECIDED | SPANS_NODES | secrets.randbits(60)
    await db.participant.abort(late)  # the abort may even arrive before its reserve does
    with pytest.raises(UnavailableError):
        await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(30, 35)), 0, late)
    assert r.rows == 5 and (await db.read_all("m"))[0].column("id").to_pylist() == list(range(20, 25))


async def test_a_batch_being_committed_counts_as_held_until_its_rows_are_applied():
    """``held`` is what the simulation waits on before its checks (no batch left in doubt): a
    commit took the batch out of the held ones before applying its rows, so the checks could
    read one partition with the batch and the other without (simulation seed 5147)."""
    w = TablesWorld(partitions=1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(5)), 0, txn)
    await db.participant.prepare(txn, r.ts)
    await commit(db.catalog, [Check(txn_key(txn), 0)], [Put(txn_key(txn), COMMITTED)])
    t = asyncio.ensure_future(db.participant.commit(txn))
    await asyncio.sleep(0)  # the commit enqueued COMMIT X and yields before it applies the rows
    assert db.participant.held == 1
    await t
    assert db.participant.held == 0 and (await db.get("m", 4))["id"] == 4


async def test_a_read_of_the_present_waits_for_a_prepared_share():
    """Once this node's share is prepared, the batch may commit and be read on another node
    before this share hears the decision. A read of the present here then waits for it (and is
    unavailable when it does not come), instead of reading just below it — a reader that saw the
    batch elsewhere would miss it here (simulation seed 860)."""
    w = TablesWorld(partitions=1)
    db = await w.start()
    db.reader.closed_wait_s = 0.2
    d = await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(3)))
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 102)), 0, txn)
    assert await db.snapshot() < r.ts  # reserved, not prepared: no other share can be visible
    await db.participant.prepare(txn, r.ts)
    with pytest.raises(UnavailableError):
        await db.snapshot()
    with pytest.raises(UnavailableError):
        await db.get("m", 100)  # the point read's fast path too
    waiting = asyncio.ensure_future(db.read_all("m"))
    await asyncio.sleep(0.05)
    await commit(db.catalog, [Check(txn_key(txn), 0)], [Put(txn_key(txn), COMMITTED)])  # decided elsewhere
    await db.participant.commit(txn)
    got, T = await waiting
    assert T >= r.ts and sorted(got.column("id").to_pylist()) == [0, 1, 2, 100, 101]
    assert (await db.get("m", 101))["id"] == 101


async def test_a_share_whose_coordinator_went_silent_is_decided_once_the_catalog_answers():
    """The coordinator went silent; this node decides from the catalog (aborted by
    compare-and-set) — and its catalog is unreachable for a while. Before, the expiry gave up at
    the first failure: the share stayed prepared, holding its partition's lock for ever (the
    simulation with per-node catalog faults, seed 11). Now it tries again until it knows."""
    from catalog.errors import CatalogUnavailableError

    w = TablesWorld(partitions=1, prepare_timeout_s=0.2)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    txn_call, outages = w.cat.txn, [CatalogUnavailableError("no quorum")] * 3

    async def unreachable_for_a_while(checks=(), ops=(), *, request_id=None):
        if outages and any(isinstance(o, Put) and o.key == txn_key(txn) for o in ops):
            raise outages.pop()
        return await txn_call(checks, ops, request_id=request_id)
    w.cat.txn = unreachable_for_a_while
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 105)), 0, txn)
    await db.participant.prepare(txn, r.ts)
    for _ in range(200):  # the expiry: 0.2 s, then the catalog's outages, each waited out
        if db.participant.held == 0:
            break
        await asyncio.sleep(0.05)
    assert db.participant.held == 0 and not outages
    await asyncio.wait_for(db.upsert("m", rows(range(5), v=3.0)), 5)  # the partition takes writes
    assert await db.get("m", 100) is None and (await db.get("m", 4))["v"] == 3.0
    await db.close()


async def test_an_abort_while_the_prepare_waits_for_the_catalog_releases_the_timestamp():
    """The prepare moves the batch's timestamp up and waits for the clock's mark in the catalog;
    the coordinator gives up meanwhile and aborts (the abort leaves the roll-back to the
    prepare); then the catalog fails that wait. The prepare rolls back: its timestamp leaves
    the in-flight set and the partition's lock is free. Before, nothing did: ``closed`` stayed
    below that timestamp for ever and no commit on the node was acknowledged again
    (simulation seed 41116, catalog stalls)."""
    w = TablesWorld(partitions=1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(10)))
    clock, held, real = db.participant.timeline.clock, asyncio.Event(), db.participant.timeline.clock.observe_durably

    async def stalled(ts):  # the catalog stalls, then the write of the clock's mark fails
        await held.wait()
        raise UnavailableError("the catalog did not answer")
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 105)), 0, txn)
    clock.observe_durably = stalled
    prep = asyncio.ensure_future(db.participant.prepare(txn, r.ts + 1000))  # another participant's larger ts
    await asyncio.sleep(0.01)
    await db.participant.abort(txn)  # the coordinator's timeout
    held.set()
    with pytest.raises(UnavailableError):
        await prep
    clock.observe_durably = real
    assert db.participant.timeline.in_flight == 0 and db.participant.held == 0
    res = await asyncio.wait_for(db.upsert("m", rows(range(20, 25))), 10)  # the lock is free, closed moves on
    assert await db.get("m", 20) is not None and await db.get("m", 100) is None
    assert res.commit_ts > r.ts
    await db.close()


async def test_a_reserve_delivered_again_after_its_batch_ended_holds_nothing():
    """A reserve delivered twice — the second after this node's share was committed (its
    commit still on its way to a majority) — took a new, empty reservation of the same txn; the
    coordinator's commit then committed that one and answered a timestamp, so the coordinator
    dropped the decision while this node's real share was still unconfirmed. A failover then
    found ``BATCH X`` without ``COMMIT X`` or a decision and rolled it back: the batch half
    applied (simulation seed 212897). A transaction that ended here is never reserved again,
    and a commit of a reservation that was never prepared commits nothing and says so."""
    w = TablesWorld(partitions=1, prepare_timeout_s=30.0)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    p = db.participant

    async def reserve(txn, keys):
        return await p.reserve("m", d.table_id, d.schema.version, rows(keys), 0, txn)

    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await reserve(txn, range(5))
    await p.prepare(txn, r.ts)
    await commit(db.catalog, [Check(txn_key(txn), 0)], [Put(txn_key(txn), COMMITTED)])
    assert await p.commit(txn) == r.ts
    with pytest.raises(UnavailableError, match="committed here already"):
        await reserve(txn, range(5))  # the first reserve, delivered again
    assert p.held == 0 and await p.commit(txn) == 0  # the commit delivered again: decided, nothing to do

    aborted = DECIDED | SPANS_NODES | secrets.randbits(60)
    await reserve(aborted, range(10, 15))
    await p.abort(aborted)
    with pytest.raises(UnavailableError, match="aborted here already"):
        await reserve(aborted, range(10, 15))

    unprepared = DECIDED | SPANS_NODES | secrets.randbits(60)
    await reserve(unprepared, range(20, 25))
    await commit(db.catalog, [Check(txn_key(unprepared), 0)], [Put(txn_key(unprepared), COMMITTED)])
    with pytest.raises(UnavailableError, match="never prepared"):
        await p.commit(unprepared)
    assert p.held == 0
    await asyncio.wait_for(db.upsert("m", rows(range(30, 32))), 2.0)  # no lock left held
    got, _ = await db.read_all("m")
    assert sorted(got.column("id").to_pylist()) == [0, 1, 2, 3, 4, 30, 31]
    await db.close()
