"""The simulation's invariants (tests/sim/world.py runs them): what must hold of the
replicated log after every fault healed — and, for leases, at every moment."""
from __future__ import annotations

import asyncio

import pyarrow as pa

from rowstore.db.database import Database
from rowstore.db.write.two_phase import COMMITTED, txn_key
from rowstore.errors import UnavailableError
from rowstore.segments.position import NOTHING, Position
from tests.history.batches import UNKNOWN, HistoryViolation, Region, check as check_history
from tests.sim.nodes import ROWS, Violation

# A seed that acknowledged fewer batches (the world writes 4 once every fault healed, each
# retried until acknowledged), or answered fewer reads of the present, proves too little to
# pass: a change that failed every write, or every read, would otherwise pass every check.
MIN_ACKED, MIN_READS = 4, 10


class Checks:
    """Mixed into World: ``self.nodes``, ``self.place``, ``self.table``, ``self.parts``,
    ``self.ledger``, ``self.history``, ``self.layout``, ``self.reader``, ``self.catalog``,
    ``self.settled_at``, ``self._batch`` and ``self._shipper`` are its."""

    summary = None  # what the history check counted (tests/history/batches.py, Summary)

    async def _watch_leases(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
            self.check_leases()

    def check_leases(self) -> None:
        """At most one node serves reads of a partition at any moment."""
        for pid in range(self.parts):
            holders = [n.name for n in self.nodes.values() if n.up and n.db is not None and (
                sh := n.db.leadership.shipper(self.table.table_id, pid)) is not None and sh.lease_ok()]
            if len(holders) > 1:
                raise Violation(f"two leases of partition {pid} at once: {holders}")

    def _leader(self, pid: int) -> Database:
        return self.nodes[self.place[pid].leader].db

    async def check_all(self) -> None:
        got: set = set()
        # One snapshot of every partition, as a read across nodes takes it (RFC 0010 §4): a
        # batch whose commit lands between two partitions' reads at their own closed timestamps
        # would look half applied (seed 6482: both on one leader, committed between the reads).
        T = max(self._leader(pid).timeline.closed for pid in range(self.parts))
        final = self.history.read("checker", Region(frozenset(range(self.parts))), note="at the end, every partition")
        for pid in range(self.parts):
            try:
                t, _ = await self._leader(pid).query("t", limit=None, partitions=[pid], as_of=T, trusted=True)
            except BaseException:
                final.failed()
                raise
            got |= _rows(t)
        final.ok(T, got)
        batches: dict[int, int] = {}
        for k, b in got:
            if k // ROWS != b:
                raise Violation(f"row {k} carries batch {b}: never written")
            batches[b] = batches.get(b, 0) + 1
        lost = sorted(b for b in self.ledger.acked if batches.get(b) != ROWS)
        if lost:
            raise Violation(f"{len(lost)} acknowledged batches lost or torn: {lost[:10]}")
        phantom = sorted(b for b in batches if b not in self.ledger.acked and b not in self.ledger.maybe)
        if phantom:
            raise Violation(f"batches never sent: {phantom[:10]}")
        half = sorted(b for b, n in batches.items() if n != ROWS)
        if half:
            raise Violation(f"batches half applied: { {b: batches[b] for b in half[:10]} } of {ROWS} rows")
        feed = await self.check_feed(T)
        await self.reader.repeat()
        for pid in range(self.parts):
            await self.check_replicas(pid)
        await self.check_history(feed)

    async def check_history(self, feed: list[tuple[int, int]]) -> None:
        """The history (tests/history/batches.py): every write whose outcome the client did not
        learn and whose decision row it knows (a batch spanning nodes) resolved from the row
        — committed (the catalog's history: the coordinator deletes the row once every
        participant applied the batch), or aborted (the row says so, or there never was one:
        nothing can commit it any more, no participant holds it); then every check of the
        history against the feed."""
        for w in self.history.writes:
            if w.txn is not None and w.status == UNKNOWN and w.decided is None:
                committed = False
                for txn in self.ledger.txns.get(w.batch, {w.txn}):  # a request delivered twice: two txns
                    e = await self.catalog.get(txn_key(txn))
                    committed |= (e is not None and e.value == COMMITTED) or txn_key(txn) in self.catalog.committed_txns
                w.decided = "committed" if committed else "aborted"
        try:
            self.summary = check_history(self.history, self.layout, feed, min_acked=MIN_ACKED, min_reads=MIN_READS)
        except HistoryViolation as e:
            raise Violation(str(e)) from None

    async def check_feed(self, T: int) -> list[tuple[int, int]]:
        """The change feed up to T (the snapshot of the checks): every acknowledged write exactly
        once; its (key, commit_ts) pairs."""
        pairs = []
        for pid in range(self.parts):
            t, _ = await self._leader(pid).changes("t", 0, upto=T, partitions=[pid], trusted=True)
            pairs += list(zip(t.column("id").to_pylist(), t.column("commit_ts").to_pylist()))
        if len(set(pairs)) != len(pairs):
            raise Violation("the change feed holds a write twice")
        have = set(pairs)
        for b, cts in self.ledger.acked.items():
            missing = [k for k in range(b * ROWS, (b + 1) * ROWS) if (k, cts) not in have]
            if missing:
                _, pids = self._batch(b)
                seen = sorted((k, ts) for k, ts in pairs if b * ROWS <= k < (b + 1) * ROWS)
                raise Violation(f"the change feed lacks acknowledged batch {b} at {cts}: keys {missing} (partitions "
                                f"{sorted(set(pids[[k - b * ROWS for k in missing]].tolist()))}); it has {seen}")
        return pairs

    async def check_replicas(self, pid: int) -> None:
        """Every follower holds, byte for byte, every sealed segment the leader holds (one that
        kept no byte aside: no follower ever had a piece of it; one offloaded meanwhile: the
        object is its only copy) and nothing beyond the leader's last segment; on that active
        segment the bytes both made durable agree (a follower may hold a group the leader still
        waits on: shipped before its own write completes); and it reaches at least where the
        leader's log ended when every follower had caught up (the leader may append records of
        its own since)."""
        sh = self._shipper(pid)
        if sh is None:  # it stepped down meanwhile (the nodes' jobs go on): checked again after an election
            raise UnavailableError(f"the leader of partition {pid} stepped down during the checks")
        tid, settled = self.table.table_id, self.settled_at[pid]
        last = max(sh.segs, default=-1)  # the leader's active segment: the others it holds are sealed
        for f in sh.followers:
            r = await self.nodes[f].db.replicas.replica(tid, pid)
            if r.position() < settled:
                raise Violation(f"{f} holds {list(r.position())} of partition {pid}, behind the caught-up end "
                                f"{list(settled)}")
            copies = {seq: (segid, r.files.get(segid)) for segid, (seq, _) in r.rec.segs.items()}
            beyond = sorted(q for q in copies if q > last) if sh.segs else []  # none held: all offloaded
            if beyond:
                raise Violation(f"{f} holds segments {beyond} of partition {pid} past the leader's last ({last})")
            for seq, seg in sorted(sh.segs.items()):
                segid, copy = copies.get(seq, (seg.segid, None))
                if segid != seg.segid:
                    raise Violation(f"{f} holds segment {segid} at seq {seq}, the leader's log {seg.segid}")
                await self._same_bytes(f, pid, seq, seg, copy, sealed=seq < last)

    async def _same_bytes(self, f: str, pid: int, seq: int, seg, copy, sealed: bool) -> None:
        size = seg.file.durable_size
        if copy is None:
            if sealed and size > 0:
                rec, _ = await self._leader(pid).store.record(seg.segid)
                if rec.state.value != "offloaded":  # offloaded meanwhile: followers drop their copies
                    raise Violation(f"{f} has no copy of sealed segment {seg.segid} (seq {seq}, {size} bytes) of "
                                    f"partition {pid}")
            return
        if sealed and copy.durable_size != size:
            raise Violation(f"{f}'s copy of sealed segment {seg.segid} of partition {pid} holds {copy.durable_size} "
                            f"bytes, the leader's {size}")
        n = size if sealed else min(copy.durable_size, size)
        a, b = await copy.read(0, n), await seg.file.read(0, n)
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise Violation(f"{f}'s copy of segment {seg.segid} is not the leader's log: {n} bytes compared "
                            f"({copy.durable_size} there, {size} here), first difference at {at}")


def _held_end(sh) -> Position:
    """The end of what the leader made durable: the last segment it holds with bytes in it (a
    segment just begun holds none yet, and a follower has nothing of it to hold)."""
    full = [q for q, seg in sh.segs.items() if seg.file.durable_size > 0]
    return Position(max(full), sh.segs[max(full)].file.durable_size) if full else NOTHING


def _rows(t: pa.Table) -> frozenset:
    return frozenset(zip(t.column("id").to_pylist(), t.column("b").to_pylist()))
