"""raft:// under failures, with real node processes on loopback (RFC 0005).

Each test keeps its own books of what was acknowledged and checks the
cluster against them afterwards; nothing here asserts on speed except the
issue's 2 s leader election bound.
"""
import asyncio
import os
import signal
import time

import pytest

from catalog.abc import Put
from catalog.errors import CatalogError, CatalogTimeoutError, CatalogUnavailableError
from terrafs.ranges import RangeAllocator
from tests.catalog.raft_cluster import Cluster, RemoteCatalog

_DOWN = (ConnectionError, OSError, asyncio.TimeoutError, CatalogError)


class Books:
    """What the cluster acknowledged: keys written and ids allocated (by whom)."""

    def __init__(self):
        self.keys: dict[str, bytes] = {}
        self.ids: dict[int, str] = {}
        self.failed = 0


async def writer(cl: Cluster, i: int, books: Books, stop: asyncio.Event, alloc_every: int = 3):
    """Transactions from node i until ``stop``: plain puts and id allocations."""
    alloc = RangeAllocator(RemoteCatalog(cl, [i]), "ids", 1, 1 << 20, stripes=4)
    seq = 0
    while not stop.is_set():
        seq += 1
        tag = f"n{i}-{seq}"
        try:
            if seq % alloc_every == 0:
                # A double allocation would overwrite the row: check_books compares it with the ack.
                got = await alloc.allocate(lambda ident, tag=tag: ([], [Put(f"alloc/{ident:08d}", tag.encode())]))
                assert got not in books.ids, f"id {got} allocated twice ({books.ids[got]} and {tag})"
                books.ids[got] = tag
            else:
                r = await cl.client(i).txn(ops=[Put(f"w/{tag}", tag.encode())], timeout=15)
                assert r["committed"]
                books.keys[f"w/{tag}"] = tag.encode()
        except _DOWN:
            books.failed += 1
            await asyncio.sleep(0.05)


async def check_books(cat: RemoteCatalog, books: Books):
    got = {e.key: e.value for e in await cat.scan("w/")}
    lost = [k for k in books.keys if got.get(k) != books.keys[k]]
    assert not lost, f"{len(lost)} acknowledged transactions lost, e.g. {lost[:5]}"
    rows = {int(e.key[6:]): e.value.decode() for e in await cat.scan("alloc/")}
    for ident, tag in books.ids.items():
        assert rows.get(ident) == tag, f"id {ident}: acknowledged to {tag}, catalog says {rows.get(ident)}"
    free = await RangeAllocator(cat, "ids", 1, 1 << 20).free_ranges()
    taken = [ident for ident in rows if any(lo <= ident < hi for lo, hi in free)]
    assert not taken, f"allocated ids still in the free table: {taken[:5]}"


async def measure_election(cl: Cluster, old: str, among: list[int]) -> float:
    t0 = time.monotonic()
    await cl.wait_leader(among, timeout=10, not_=old)
    return time.monotonic() - t0


@pytest.mark.slow
async def test_kill_leader_repeatedly_under_load(tmp_path):
    cl = Cluster(str(tmp_path))
    cl.start_all()
    books, stop = Books(), asyncio.Event()
    try:
        await cl.wait_leader()
        await RangeAllocator(RemoteCatalog(cl), "ids", 1, 1 << 20, stripes=4).init()
        tasks = [asyncio.ensure_future(writer(cl, i, books, stop)) for i in range(3)]
        elections = []
        for _ in range(4):
            await asyncio.sleep(1.0)
            lead = await cl.wait_leader()
            before = len(books.keys) + len(books.ids)
            cl.kill(lead)  # SIGKILL
            survivors = [i for i in range(3) if i != lead]
            elections.append(await measure_election(cl, cl.addrs[lead], survivors))
            await asyncio.sleep(0.5)
            cl.start(lead)
            await cl.wait_leader()
            assert len(books.keys) + len(books.ids) > before or books.failed  # the stream kept going
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        assert len(books.ids) > 10 and len(books.keys) > 50
        await check_books(RemoteCatalog(cl), books)
        # The bound, measured from SIGKILL to the survivors agreeing on a new leader.
        print(f"leader elections after kill -9: {[round(e, 3) for e in elections]} s")
        assert max(elections) < 2.0, f"leader elections took {elections}"
        # kill -9 all three and restart: everything acknowledged is still there
        cl.stop_all()
        cl.start_all()
        await cl.wait_leader()
        await check_books(RemoteCatalog(cl), books)
    finally:
        stop.set()
        cl.stop_all()


async def test_two_of_three_down_is_unavailable(tmp_path):
    cl = Cluster(str(tmp_path), catalog_kw={"timeout": 3.0, "quorum_grace": 1.0})
    cl.start_all()
    try:
        lead = await cl.wait_leader()
        c = cl.client(lead)
        await c.txn(ops=[Put("before", b"1")])
        for victim in [i for i in range(3) if i != lead]:
            cl.kill(victim)
        t0 = time.monotonic()
        while (await c.call("status"))["has_quorum"]:
            assert time.monotonic() - t0 < 10
            await asyncio.sleep(0.05)
        with pytest.raises(CatalogUnavailableError) as ei:
            await c.txn(ops=[Put("during", b"x")], rid="during-1")
        assert "unavailable" in str(ei.value) and not isinstance(ei.value, CatalogTimeoutError)
        with pytest.raises(CatalogUnavailableError):
            await c.call("get", key="before")  # linearizable: needs a quorum
        with pytest.raises(CatalogUnavailableError):
            await c.call("scan", prefix="")
        # a stale read is served locally, and says what this replica has
        assert (await c.call("get", key="before", stale=True))[0] == "before"
        st = await c.call("status")
        assert st["role"] == "follower" and st["leader"] is None  # the old leader stepped down
        for victim in [i for i in range(3) if i != lead]:
            cl.start(victim)
        await cl.wait_leader()
        cat = RemoteCatalog(cl)
        assert await cat.get("during") is None and await cat.outcome("during-1") is None  # never succeeded
        assert (await cat.get("before")).value == b"1"
    finally:
        cl.stop_all()


async def test_stopped_leader_is_replaced_and_rejoins_as_follower(tmp_path):
    cl = Cluster(str(tmp_path))
    cl.start_all()
    try:
        lead = await cl.wait_leader()
        old_term = (await cl.status(lead))["term"]
        cl.kill(lead, signal.SIGSTOP)
        survivors = [i for i in range(3) if i != lead]
        new = await cl.wait_leader(survivors, timeout=10, not_=cl.addrs[lead])
        r = await cl.client(new).txn(ops=[Put("while-stopped", b"1")])
        assert r["committed"]
        cl.procs[lead].send_signal(signal.SIGCONT)
        t0 = time.monotonic()
        while True:  # it hears the higher term and follows the new leader
            st = await cl.status(lead)
            if st["role"] == "follower" and st["leader"] == cl.addrs[new]:
                break
            assert time.monotonic() - t0 < 15, st
            await asyncio.sleep(0.05)
        assert st["term"] > old_term
        e = await cl.client(lead).call("get", key="while-stopped")  # linearizable, on the old leader
        assert e is not None and e[0] == "while-stopped"
    finally:
        cl.stop_all()


@pytest.mark.slow
async def test_membership_change_under_load(tmp_path):
    cl = Cluster(str(tmp_path))
    cl.start_all()
    books, stop = Books(), asyncio.Event()
    try:
        lead = await cl.wait_leader()
        await RangeAllocator(RemoteCatalog(cl), "ids", 1, 1 << 20, stripes=4).init()
        tasks = [asyncio.ensure_future(writer(cl, i, books, stop)) for i in range(3)]
        await asyncio.sleep(0.5)
        new = cl.add_slot()
        cl.start(new)  # knows the current members; they do not know it yet
        await cl.client(lead).call("add_member", address=cl.addrs[new])
        with pytest.raises(CatalogError, match="refused"):  # the same change again is refused
            await cl.client(lead).call("add_member", address=cl.addrs[new])
        cl.members.append(cl.addrs[new])
        t0 = time.monotonic()
        while True:  # the new node catches up and answers linearizable reads
            try:
                st = await cl.status(new)
                if st["leader"] is not None and len(st["members"]) == 4:
                    await cl.client(new).call("revision")
                    break
            except _DOWN:
                pass
            assert time.monotonic() - t0 < 20
            await asyncio.sleep(0.1)
        tasks.append(asyncio.ensure_future(writer(cl, new, books, stop)))
        await asyncio.sleep(1.0)
        lead = await cl.wait_leader()
        victim = next(i for i in range(3) if i != lead)
        await cl.client(lead).call("remove_member", address=cl.addrs[victim])
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        live = [i for i in sorted(cl.procs) if i != victim]
        for i in live:
            assert len((await cl.status(i))["members"]) == 3
        await check_books(RemoteCatalog(cl, live), books)
        assert any(t.startswith(f"n{new}-") for t in books.ids.values()) or \
            any(k.startswith(f"w/n{new}-") for k in books.keys)
    finally:
        stop.set()
        cl.stop_all()


async def test_compaction_restart_and_snapshot_to_a_lagging_follower(tmp_path):
    """journalFile + fullDumpFile always together: compaction then kill -9 keeps everything,
    and a follower that missed compacted entries is caught up from the dump."""
    cl = Cluster(str(tmp_path), tuning={"logCompactionMinEntries": 20})
    cl.start_all()
    try:
        lead = await cl.wait_leader()
        lagging = next(i for i in range(3) if i != lead)
        cl.kill(lagging)
        c = cl.client(lead)
        for i in range(120):
            await c.txn(ops=[Put(f"k/{i:03d}", b"%d" % i)], rid=f"r{i}")
        assert os.path.exists(os.path.join(cl.root, f"n{lead}", "dump.trd"))
        cl.start(lagging)
        t0 = time.monotonic()
        while await cl.client(lagging).call("revision", stale=True) < 120:
            assert time.monotonic() - t0 < 20
            await asyncio.sleep(0.1)
        assert len(await cl.client(lagging).call("scan", prefix="k/", stale=True)) == 120
        cl.stop_all()  # kill -9 every node after compaction, then restart
        cl.start_all()
        await cl.wait_leader()
        cat = RemoteCatalog(cl)
        assert len(await cat.scan("k/")) == 120 and await cat.revision() == 120
        assert (await cat.txn(ops=[Put("again", b"")], request_id="r7")).revision == 8  # ids remembered
    finally:
        cl.stop_all()


async def test_transfer_leadership_then_remove_the_old_leader(tmp_path):
    cl = Cluster(str(tmp_path))
    cl.start_all()
    try:
        lead = await cl.wait_leader()
        await cl.client(lead).txn(ops=[Put("a", b"1")])
        with pytest.raises(CatalogError, match="refused"):  # the leader cannot remove itself
            await cl.client(lead).call("remove_member", address=cl.addrs[lead])
        target = next(i for i in range(3) if i != lead)
        # A transfer is refused (request_denied) while the target's log lags the leader's; on a
        # loaded machine it may take a moment to catch up, so ask again until it is accepted.
        t0 = time.monotonic()
        while True:
            await cl.client(lead).call("revision")
            try:
                await cl.client(lead).call("transfer", to=cl.addrs[target])
                break
            except CatalogError as e:
                assert "request_denied" in str(e) and time.monotonic() - t0 < 10, e
                await asyncio.sleep(0.1)
        assert await cl.wait_leader(not_=cl.addrs[lead]) == target
        await cl.client(target).call("remove_member", address=cl.addrs[lead])
        rest = [i for i in range(3) if i != lead]
        for i in rest:
            st = await cl.status(i)
            t0 = time.monotonic()
            while len(st["members"]) != 2:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.05)
                st = await cl.status(i)
        r = await cl.client(rest[1]).txn([], [Put("b", b"2")])
        assert r["committed"] and (await RemoteCatalog(cl, rest).get("a")).value == b"1"
    finally:
        cl.stop_all()
