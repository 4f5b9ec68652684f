"""Replication of active segments in one process (unit level; the multi-process tests are in
tests/node/cluster/test_replication*.py): majority acks, catch-up, gaps, fencing, divergence, and a
follower's copy recovering as the same active segment."""
import asyncio
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from catalog.abc import Put
from catalog.memory import MemoryCatalog
from rowstore.hlc import HybridClock, ts_from_ms
from rowstore.replication.leader import LEASE_DRIFT, clock_floor, lease_wait, Shipper, Transport, whole_prefix
from rowstore.db.serving.leadership import Leadership
from rowstore.errors import FencedError, UnavailableError
from rowstore.replication.follower import SegmentPiece, ReplicaStore
from rowstore.segments.position import NOTHING, Position, ReplicaRecord, keeps_log
from rowstore.schema import parse_schema
from rowstore.segments.active import ActiveSegment
from rowstore.segments.wal import REC, RecordKind, frame
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.errors import MirrorError
from terrafs.fs import FsConfig, TerrascaleFS
from tests.fixtures.waits import eventually_async

S1 = parse_schema("id int64 primary key, v string")


def NO_STEP_DOWN(sh) -> None:
    """These tests watch the fenced shipper itself; a node steps down through this hook
    (``NodeReplication._fenced``, node/cluster/controller.py)."""


def batch(lo, hi):
    return pa.record_batch({"id": pa.array(range(lo, hi), pa.int64()),
                            "v": pa.array([f"v{i}" * (i % 5) for i in range(lo, hi)])}, schema=S1.arrow())


class LocalTransport(Transport):
    """Followers in this process; a node in ``down`` does not answer."""

    def __init__(self, stores):
        self.stores, self.down, self.calls = stores, set(), 0
        self.stalled = False  # every message hangs: a link too slow to answer at all

    async def append(self, node, header, data):
        self.calls += 1
        if node in self.down:
            raise ConnectionError(f"{node} is down")
        if self.stalled:
            await asyncio.Event().wait()
        pieces = [SegmentPiece(s, q, o, d) for (s, q, o, _), d in zip(header["pieces"], data)]
        await asyncio.sleep(0)
        return await self.stores[node].append(header["table"], header["pid"], header["epoch"], header["base"],
                                              Position(*header["start"]), pieces, "n1", header["clock"])


class Tick:
    """The replication's monotonic clock, moved by the test (leases run out when it says)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        self.now += s


TICK = Tick()



async def caught_up(sh, node: str) -> None:
    """AssertionError until the leader reports ``node`` at its log end."""
    assert sh.status()["followers"][node]["lag_bytes"] == 0, sh.status()["followers"][node]

async def world(n=3):
    cat, objects = MemoryCatalog(), MemoryObjectStore()
    fss = {}
    for i in range(1, n + 1):
        fs = TerrascaleFS(cat, MemoryBlockDevice(), MemoryBlockDevice(durable=False), objects,
                          config=FsConfig(node_id=f"n{i}", flush=ActiveConfig(flush_ms=0.5)))
        await fs.open()
        fss[f"n{i}"] = fs
    stores = {n: ReplicaStore(fs, lease_s=0.3, monotonic=TICK) for n, fs in fss.items() if n != "n1"}
    return fss, stores, LocalTransport(stores)


async def leader(fss, transport, epoch=1, base=0, start=NOTHING, segid=7, seq=1):
    sh = Shipper("T", 0, epoch, base, start, ["n2", "n3"], transport, lease_s=0.3, on_fenced=NO_STEP_DOWN,
                 clock=lambda: 0, monotonic=TICK)
    af = await fss["n1"].create()
    seg = ActiveSegment(segid, af, af.where)
    seg.seq = seq
    sh.register(seq, seg)
    sh.start_links()
    return sh, seg


async def test_groups_are_acknowledged_once_a_majority_holds_them_and_copies_are_the_same_segment():
    fss, stores, tr = await world()
    sh, seg = await leader(fss, tr)
    tr.down.add("n3")  # one follower down: leader + n2 is a majority of 3
    ids = await asyncio.gather(*(seg.append(batch(i * 50, i * 50 + 50), S1, 100 + i) for i in range(20)))
    assert sum(len(i) for i in ids) == 1000
    assert sh.lease_ok() and sh.status()["followers"]["n2"]["lag_bytes"] == 0
    tr.down.clear()  # n3 returns and catches up from the leader's file
    await eventually_async(lambda: caught_up(sh, "n3"))
    for n in ("n2", "n3"):
        rec, _, files = await stores[n].take("T", 0)
        assert rec.last == 1 and rec.promised == 1 and list(rec.segs) == [7]
        copy = await ActiveSegment.recover(7, files[7])
        assert copy.durable_rows == seg.durable_rows == 1000 and copy.file.durable_size == seg.file.durable_size
        for loc in (0, 499, 999):
            assert await copy.get_raw(loc) == await seg.get_raw(loc)
        assert (copy.min_ts, copy.max_ts) == (100, 119)
    await sh.close()


async def test_no_majority_no_ack_until_a_follower_returns():
    fss, stores, tr = await world()
    tr.down |= {"n2", "n3"}
    sh, seg = await leader(fss, tr)
    pending = asyncio.ensure_future(seg.append(batch(0, 10), S1, 5))
    await asyncio.sleep(0.2)
    assert not pending.done() and seg.durable_rows == 0 and not sh.lease_ok()
    assert await seg.file.read(0, 10) == b""  # nothing readable that a majority does not hold
    tr.down.discard("n3")
    assert len(await asyncio.wait_for(pending, 5)) == 10
    await sh.close()


async def test_a_fenced_leader_acknowledges_nothing_more():
    fss, stores, tr = await world()
    sh, seg = await leader(fss, tr)
    await seg.append(batch(0, 10), S1, 5)
    await stores["n2"].fence("T", 0, 2, force=True)  # a new epoch elsewhere
    await stores["n3"].fence("T", 0, 2, force=True)
    with pytest.raises(MirrorError):
        await asyncio.wait_for(seg.append(batch(10, 20), S1, 6), 5)
    assert sh.fenced == 2 and not sh.lease_ok()
    with pytest.raises(MirrorError):  # the file refuses every later append with the same reason
        await seg.append(batch(20, 30), S1, 7)
    with pytest.raises(FencedError):
        await stores["n2"].append("T", 0, 1, 0, NOTHING, [], "n1")
    await sh.close()


async def test_a_follower_refuses_a_fence_while_the_leader_is_within_its_lease():
    fss, stores, tr = await world()
    sh, seg = await leader(fss, tr)
    await seg.append(batch(0, 10), S1, 5)
    with pytest.raises(Exception, match="heard from leader"):
        await stores["n2"].fence("T", 0, 2)
    await sh.close()
    TICK.advance(0.35)  # the lease ran out
    got = await stores["n2"].fence("T", 0, 2)
    assert got["last"] == 1 and got["pos"] == [1, seg.file.durable_size]


async def test_a_forced_election_names_a_leader_only_after_the_old_lease_ran_out():
    """A forced promise (the leader left the membership; nobody fences it) answers how long ago
    the leader last reached this replica. Right after the promises the old leader still holds
    its lease — naming a new leader then (as forced elections did) gave two leases at once;
    ``lease_wait`` after them, it holds none, though no fence ever reached it."""
    fss, stores, tr = await world()
    sh, seg = await leader(fss, tr)
    await seg.append(batch(0, 10), S1, 5)
    tr.stalled = True  # the old leader's messages no longer arrive, nor do their answers
    answers = [await stores[n].fence("T", 0, 2, force=True) for n in ("n2", "n3")]
    assert sh.lease_ok() and sh.fenced is None  # the old leader would still serve reads
    wait = lease_wait(answers, 0.3)
    assert 0 < wait <= 0.3 * LEASE_DRIFT
    TICK.advance(wait)
    assert not sh.lease_ok()
    assert lease_wait([{"last": 1, "pos": [1, 0]}], 0.3) == 0.3 * LEASE_DRIFT  # an answer without the age
    await sh.close()


async def leading(fss, sh):
    """``sh`` leads from n1 with one active segment (segid 7, seq 1), its links started."""
    af = await fss["n1"].create()
    seg = ActiveSegment(7, af, af.where)
    seg.seq = 1
    sh.register(1, seg)
    sh.start_links()
    return seg


async def test_a_promise_answers_the_old_leaders_clock_and_the_new_leader_starts_above_its_lease():
    """Every round carries the leader's present; a promise answers the highest one it took, and
    the election's floor lies above every read T that leader could serve under the lease those
    rounds gave it — however far its clock ran ahead of the new leader's."""
    fss, stores, tr = await world()
    ahead = (1 << 62)  # a leader whose clock is far ahead of everyone's
    sh = Shipper("T", 0, 1, 0, NOTHING, ["n2", "n3"], tr, lease_s=0.3, on_fenced=NO_STEP_DOWN, clock=lambda: ahead,
                 monotonic=TICK)
    seg = await leading(fss, sh)
    await seg.append(batch(0, 10), S1, 5)
    answers = [await stores[n].fence("T", 0, 2, force=True) for n in ("n2", "n3")]
    assert [a["clock"] for a in answers] == [ahead, ahead]
    assert clock_floor(answers, 0.3) > ahead + ts_from_ms(300)
    assert clock_floor([{"last": 0, "pos": [0, 0]}], 0.3) == 0  # nobody heard from a leader
    await sh.close()


async def test_a_read_beyond_the_clock_a_majority_took_waits_for_a_round_that_carries_it():
    """The election's floor is the highest clock a promising replica took from the old leader,
    plus the lease. A leader whose clock jumped ahead after its last rounds served reads at its
    new present, above any floor its followers could answer: the next leader committed below
    them (simulation seed 17 with ``--clock-jump 0.5``, found by the history checks: a read
    at T repeated at the end was refused by the new leader as in the future). A read at T
    beyond ``reach`` now waits for a round that carries the leader's present to a majority —
    after which every floor lies above T — and is refused when none comes."""
    fss, stores, tr = await world()
    present = [ts_from_ms(1_000_000)]
    sh = Shipper("T", 0, 1, 0, NOTHING, ["n2", "n3"], tr, lease_s=0.3, on_fenced=NO_STEP_DOWN,
                 clock=lambda: present[0], monotonic=TICK)
    lead = Leadership(SimpleNamespace(shippers={("T", 0): sh}), None, None, None, observe=None,
                      observe_durably=None, present=None, hold_present=None, monotonic=TICK)
    seg = await leading(fss, sh)
    await seg.append(batch(0, 10), S1, 5)
    assert lead.check_lease("T", [0], present[0]) is None  # within reach: nothing to wait for
    present[0] += ts_from_ms(2000)  # the wall clock jumps 2 s ahead
    T = present[0]
    floor = clock_floor([stores[n].status("T", 0) | {"clock": stores[n].leader_clocks[("T", 0)]}
                         for n in ("n2", "n3")], 0.3)
    assert floor <= T  # a new leader elected now could commit below a read served at T
    wait = lead.check_lease("T", [0], T)
    assert wait is not None
    await wait
    answers = [await stores[n].fence("T", 0, 2, force=True) for n in ("n2", "n3")]
    assert clock_floor(answers, 0.3) > T  # the round reached a majority: every floor is above T
    present[0] += ts_from_ms(2000)
    tr.down |= {"n2", "n3"}
    with pytest.raises(UnavailableError, match="took this leader's clock"):
        await lead.check_lease("T", [0], present[0])
    await sh.close()


async def test_a_promise_still_answers_the_leaders_clock_after_the_replica_state_was_reloaded():
    """A promotion here or elsewhere drops a replica's cached state (``forget``), which then
    reloads from its record. The clock the leader sent is not in the record: it must survive,
    or the next election's floor drops below the reads that leader served under the lease
    this replica gave it (found reading the fence path for simulation seeds 5199 and 5784,
    where the new leader refused a repeatable read at T as future, its clock below T)."""
    fss, stores, tr = await world()
    ahead = (1 << 62)
    sh = Shipper("T", 0, 1, 0, NOTHING, ["n2", "n3"], tr, lease_s=0.3, on_fenced=NO_STEP_DOWN, clock=lambda: ahead,
                 monotonic=TICK)
    seg = await leading(fss, sh)
    await seg.append(batch(0, 10), S1, 5)
    await sh.close()
    for n in ("n2", "n3"):
        stores[n].forget("T", 0)
    answers = [await stores[n].fence("T", 0, 2, force=True) for n in ("n2", "n3")]
    assert [a["clock"] for a in answers] == [ahead, ahead]


class _NoSegments:
    """A follower's segment store as ``Leadership.fence`` sees it: it leads nothing, holds no
    log of its own."""

    shippers: dict = {}

    async def own_log(self, table_id, pid):
        return None


def _follower(fs, store, wall):
    clock = HybridClock(fs.catalog, fs.cfg.node_id, now_ms=lambda: wall[0])
    lead = Leadership(_NoSegments(), store, None, None, observe=clock.observe, observe_durably=clock.observe_durably,
                      present=clock.present, hold_present=lambda ts: None, monotonic=TICK)
    return clock, lead


async def test_a_replica_restarted_still_answers_above_the_clock_it_acknowledged_to_a_leader_far_ahead():
    """The hole RFC 0010 §5 "Clocks" named: the clock a replica took from a leader lived in its
    process only. The old leader gone and that replica restarted, it answered the next fence
    its own present — its wall clock, here 10 s behind the leader's, more than the lease — and
    the election's floor lay below reads the old leader served. A round's clock is now taken
    into the replica's clock, whose mark is persisted before the round is acknowledged."""
    fss, stores, _ = await world()
    wall = [1_000_000]  # n2's wall clock, ms
    clock, lead = _follower(fss["n2"], stores["n2"], wall)
    await clock.open()
    tr = LocalTransport({"n2": lead, "n3": stores["n3"]})
    ahead = ts_from_ms(wall[0] + 10_000)
    sh = Shipper("T", 0, 1, 0, NOTHING, ["n2", "n3"], tr, lease_s=0.3, on_fenced=NO_STEP_DOWN, clock=lambda: ahead,
                 monotonic=TICK)
    seg = await leading(fss, sh)
    await seg.append(batch(0, 10), S1, 5)
    await sh.close()
    fresh = ReplicaStore(fss["n2"], lease_s=0.3, monotonic=TICK)  # n2's process restarted
    clock2, lead2 = _follower(fss["n2"], fresh, wall)
    await clock2.open()
    answer = await lead2.fence("T", 0, 2, force=True)
    assert answer["clock"] >= ahead
    assert clock_floor([answer], 0.3) > ahead + ts_from_ms(300)


async def test_a_replica_loaded_after_a_restart_counts_as_just_reached():
    """It may have acknowledged the leader just before the restart: a normal election waits out
    that leader's lease on it too."""
    fss, stores, tr = await world()
    sh, seg = await leader(fss, tr)
    await seg.append(batch(0, 10), S1, 5)
    await sh.close()
    fresh = ReplicaStore(fss["n2"], lease_s=0.3, monotonic=TICK)  # n2's process restarted
    with pytest.raises(Exception, match="heard from leader"):
        await fresh.fence("T", 0, 2)
    TICK.advance(0.35)
    assert (await fresh.fence("T", 0, 2))["last"] == 1


async def test_gaps_are_refused_resends_skipped_and_divergent_logs_dropped():
    fss, stores, _ = await world()
    f = stores["n2"]
    rec1 = frame(RecordKind.OPAQUE, b"a" * 30)
    got = await f.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, rec1)])
    assert got["pos"] == [1, len(rec1)] and got["last"] == 1 and not got["gap"]
    got = await f.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, rec1 + rec1)])  # a resend, overlapping
    assert got["pos"] == [1, 2 * len(rec1)]
    got = await f.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 5 * len(rec1), rec1)])  # beyond the end
    assert got["gap"] and got["pos"] == [1, 2 * len(rec1)]
    # epoch 3 continued epoch 1 from before this copy's end: this copy has a suffix the new
    # leader does not; it is cut at the new epoch's start (its prefix is the leader's log)
    got = await f.append("T", 0, 3, 1, Position(1, len(rec1)), [])
    assert got["pos"] == [1, len(rec1)] and got["last"] == 3
    got = await f.append("T", 0, 3, 1, Position(1, len(rec1)), [SegmentPiece(9, 1, 0, rec1 + rec1[:7])])
    assert got["pos"] == [1, len(rec1) + 7] and got["last"] == 3
    e = await fss["n2"].catalog.get("rs/rep/T/000/n2")
    assert ReplicaRecord.from_bytes(e.value, e.key).promised == 3


def test_which_logs_a_follower_keeps():
    assert keeps_log(4, Position(9, 9), 4, 3, Position(1, 1))  # already this epoch's
    assert keeps_log(3, Position(2, 10), 4, 3, Position(2, 10))  # the base epoch, up to start
    assert not keeps_log(3, Position(2, 11), 4, 3, Position(2, 10))  # past start: a suffix to cut (truncates_to)
    assert not keeps_log(2, Position(1, 1), 4, 3, Position(2, 10))  # an older epoch: may diverge
    assert keeps_log(0, NOTHING, 4, 3, Position(2, 10))  # nothing held: a prefix of anything


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=12), st.integers(0, 400))
def test_whole_prefix_cuts_after_the_last_whole_record(bodies, cut):
    recs = [frame(RecordKind.OPAQUE, b) for b in bodies]
    data = b"".join(recs)[:cut]
    n = whole_prefix(data)
    ends = np.cumsum([0] + [len(r) for r in recs])
    assert n == max(e for e in ends if e <= len(data)) and n <= len(data)
    assert REC.size == 8


async def test_a_longer_log_of_the_base_epoch_is_cut_at_the_start_not_dropped_and_wins_the_next_election():
    """S1 of the replication review: L led epoch 1 and its log ends past A's; A is elected at
    epoch 2 (base 1, start = A's end). L returns: it must keep its log up to A's start — every
    write acknowledged in epoch 1 is in it — not drop it all. If A dies before L copied epoch
    2's writes, the next election (the greatest (last, position) among a majority) must pick
    L over B, which lagged in epoch 1: B lacks acknowledged writes."""
    fss, stores, _ = await world(4)
    L, A, B = stores["n2"], stores["n3"], stores["n4"]
    body = [frame(RecordKind.OPAQUE, bytes([i]) * 50) for i in range(60)]
    log1 = b"".join(body)
    acked = len(b"".join(body[:40]))  # on L and A: a majority of {L, A, B}
    for store, n in ((L, len(log1)), (A, acked), (B, len(b"".join(body[:10])))):
        await store.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, log1[:n])])
    start = Position(1, acked)  # A's log end when epoch 2 began
    got = await L.append("T", 0, 2, 1, start, [])  # epoch 2's first message to L
    assert got["pos"] == list(start) and got["last"] == 2, got
    f = (await L.replica("T", 0)).files[9]
    assert await f.read(0, acked) == log1[:acked] and f.durable_size == acked
    answers = {n: await store.fence("T", 0, 3, force=True) for n, store in (("L", L), ("B", B))}  # A is dead
    chosen = max(answers, key=lambda n: (answers[n]["last"], Position(*answers[n]["pos"])))
    assert chosen == "L" and answers["L"]["pos"] == list(start), answers
    L.forget("T", 0)  # a restart: the cut copy and its record are what is durable
    r = await L.replica("T", 0)
    assert r.position() == start and r.rec.last == 2 and not r.rec.rewriting


async def test_a_cut_interrupted_before_its_switch_leaves_the_old_copy_and_no_orphan():
    from terrafs.failpoints import FailPointCrash, armed

    fss, stores, _ = await world()
    f = stores["n2"]
    rec1 = frame(RecordKind.OPAQUE, b"a" * 30)
    await f.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, rec1 * 3)])
    with armed("replica.after_cut_copy"), pytest.raises(FailPointCrash):
        await f.append("T", 0, 2, 1, Position(1, len(rec1)), [])
    f.forget("T", 0)  # a restart
    r = await f.replica("T", 0)
    assert r.position() == Position(1, 3 * len(rec1)) and not r.rec.rewriting and r.rec.last == 1
    assert {rec.inode for rec in await fss["n2"].list()} == {r.rec.segs[9][1]}  # the cut's file is gone
    got = await f.append("T", 0, 2, 1, Position(1, len(rec1)), [])
    assert got["pos"] == [1, len(rec1)] and got["last"] == 2


async def test_a_replica_that_missed_a_whole_epoch_is_cut_where_the_lineages_part():
    """last = 1, while epoch 2 continued epoch 1 from 100 and epoch 3 epoch 2 from 120: the
    replica's bytes below 100 are epoch 3's too (the epoch history, written with the placement
    by each election, says so); it keeps them instead of being copied whole again."""
    from rowstore.replication.epochs import Epoch, History, epochs_key

    fss, stores, _ = await world()
    f = stores["n2"]
    body = frame(RecordKind.OPAQUE, b"x" * 142)  # 150 bytes
    await f.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, body)])
    hist = History([Epoch(1, 0, NOTHING), Epoch(2, 1, Position(1, 100)), Epoch(3, 2, Position(1, 120))])
    await fss["n2"].catalog.txn([], [Put(epochs_key("T", 0), hist.to_bytes())])
    got = await f.append("T", 0, 3, 2, Position(1, 120), [])
    assert got["pos"] == [1, 100] and got["last"] == 1, got  # cut, and epoch 3's start not reached yet
    f2 = stores["n3"]  # without the history the same replica is copied whole again
    await f2.append("T", 1, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, body)])
    got = await f2.append("T", 1, 3, 2, Position(1, 120), [])
    assert got["pos"] == [0, 0], got


async def test_a_follower_whose_device_filled_catches_up_once_space_is_back():
    """Its copy's write hit a full device: appends to it are refused (the other follower makes
    the majority); once space is back the copy is cut to what it durably holds and the leader
    sends the rest — it does not stay behind for ever."""
    fss, stores, tr = await world()
    sh, seg = await leader(fss, tr)
    await seg.append(batch(0, 10), S1, 5)
    dev = fss["n2"].block
    dev.capacity = sum(len(d.buf) for d in dev._files.values()) + 100  # n2 fills on the next group
    for i in range(1, 6):
        await asyncio.wait_for(seg.append(batch(i * 10, i * 10 + 10), S1, 5 + i), 5)  # n1 + n3 acknowledge
    assert sh.status()["followers"]["n2"]["lag_bytes"] in (None, *range(1, 1 << 20))
    stores["n2"].resume_free_bytes = 0
    dev.capacity = None
    await eventually_async(lambda: caught_up(sh, "n2"))
    rec, _, files = await stores["n2"].take("T", 0)
    copy = await ActiveSegment.recover(7, files[7])
    assert copy.durable_rows == seg.durable_rows == 60
    await sh.close()


@pytest.mark.parametrize("ticks", [0, 1, 2, 3])
async def test_a_link_waiting_for_work_ends_when_cancelled_even_as_it_is_woken(ticks):
    """An idle link waits for a wake-up or its heartbeat. With ``asyncio.wait_for`` (3.11) a
    cancel that arrived just as the wake-up completed was swallowed and the link lived on — a
    task a node's shutdown could not end (the seeded simulation's clean-up spun on it, seed
    8851)."""
    fss, stores, tr = await world()
    sh = Shipper("T", 0, 1, 0, NOTHING, ["n2", "n3"], tr, lease_s=30.0, on_fenced=NO_STEP_DOWN, clock=lambda: 0,
                 monotonic=TICK)
    seg = await leading(fss, sh)
    await seg.append(batch(0, 10), S1, 5)
    await eventually_async(lambda: caught_up(sh, "n2"))
    await asyncio.sleep(0.05)  # every link idle, waiting for a wake-up
    tasks = list(sh._tasks.values())
    for link in sh._links.values():
        link.wake.set()
    for _ in range(ticks):
        await asyncio.sleep(0)
    for t in tasks:
        t.cancel()
    done, alive = await asyncio.wait(tasks, timeout=1.0)
    assert not alive
    await sh.close()


async def test_no_byte_of_an_epoch_is_written_before_the_epoch_is_the_records_last():
    """Simulation seed 36's first suspect: a follower wrote an epoch's bytes, then failed to
    record that epoch as its ``last`` (the catalog did not answer). A fence in between would
    answer the older epoch with a position past the new epoch's start — bytes the older epoch's
    log does not have there — and an election ranking (last, position) could continue the older
    lineage over them. The epoch is recorded first; until it is, nothing past ``start`` lands."""
    fss, stores, _ = await world()
    f = stores["n2"]
    body = frame(RecordKind.OPAQUE, b"a" * 30)
    await f.append("T", 0, 1, 0, NOTHING, [SegmentPiece(9, 1, 0, body)])
    start = Position(1, len(body))
    cat, txn, failing = fss["n2"].catalog, fss["n2"].catalog.txn, [True]

    async def txn_failing_the_last(checks, ops, **kw):  # the catalog is lost to a write naming epoch 2
        for op in ops:
            if failing[0] and isinstance(op, Put) and op.key.startswith("rs/rep/T/000/") and \
                    ReplicaRecord.from_bytes(op.value, op.key).last == 2:
                raise ConnectionError("the catalog's leader is unreachable")
        return await txn(checks, ops, **kw)
    cat.txn = txn_failing_the_last
    with pytest.raises(ConnectionError):  # a piece below start and one past it, in one message
        await f.append("T", 0, 2, 1, start, [SegmentPiece(9, 1, 0, body + body)])
    r = await f.replica("T", 0)
    assert r.position() == start and r.files[9].durable_size == len(body) and r.rec.last == 1
    got = await f.fence("T", 0, 3, force=True)
    assert (got["last"], got["pos"]) == (1, list(start))  # the truth: epoch 1's log, up to start
    f2 = stores["n3"]  # a copy below start takes epoch 1's bytes up to it, then stops there
    with pytest.raises(ConnectionError):
        await f2.append("T", 0, 2, 1, start, [SegmentPiece(9, 1, 0, body + body)])
    r2 = await f2.replica("T", 0)
    assert r2.position() == start and r2.rec.last == 0 and await r2.files[9].read(0, len(body)) == body
    failing[0] = False
    got = await f2.append("T", 0, 2, 1, start, [SegmentPiece(9, 1, 0, body + body)])
    assert got["pos"] == [1, 2 * len(body)] and got["last"] == 2 and not got["gap"]


async def test_a_leader_replaced_while_away_cannot_begin_a_segment():
    """Simulation seed 36 (with ``--pause 1``): a leader was stopped through the election that
    replaced it, so nobody fenced it. Back, it began a segment after its successor had adopted
    the partition's rows; no later promotion moved that row, and its fences then answered the
    empty log the row stood for instead of the longer newer one it held as a follower — the
    next election discarded a log a majority held. A segment row is written with the
    partition's epoch history as read (``Shipper.lead_checks``), refused once the history
    names a newer epoch — also when the election commits between the read and the row."""
    from rowstore.replication.epochs import Epoch, History, epochs_key
    from rowstore.segments.store import SegmentStore

    fss, _, tr = await world()
    fs = fss["n1"]
    store = SegmentStore(fs)
    await store.open()
    fenced = []
    sh = Shipper("T", 0, 1, 0, NOTHING, ["n2", "n3"], tr, lease_s=0.3, on_fenced=fenced.append, clock=lambda: 0,
                 monotonic=TICK, catalog=fs.catalog)
    store.shippers[("T", 0)], store.epochs[("T", 0)] = sh, 1
    key = epochs_key("T", 0)
    await fs.catalog.txn([], [Put(key, History([Epoch(1, 0, NOTHING)]).to_bytes())])
    assert (await store.create("T", 0)).seq == 1  # still the newest epoch: it leads
    elect = [History([Epoch(1, 0, NOTHING), Epoch(2, 1, NOTHING)])]
    checks = sh.lead_checks

    async def elected_meanwhile():  # the election commits between the read and the row
        got = await checks()
        if elect:
            await fs.catalog.txn([], [Put(key, elect.pop().to_bytes())])
        return got
    sh.lead_checks = elected_meanwhile
    rows = len(await store.list(table="T"))
    with pytest.raises(FencedError, match="epoch 2 was elected after 1"):
        await store.create("T", 0)
    assert len(await store.list(table="T")) == rows and fenced == [sh] and sh.fenced == 2
    await sh.close()
