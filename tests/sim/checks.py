"""The simulation's invariants (tests/sim/world.py runs them): what must hold of the
replicated log after every fault healed — and, for leases, at every moment."""
from __future__ import annotations

import asyncio

import pyarrow as pa

from rowstore.db.database import Database
from rowstore.errors import UnavailableError
from rowstore.segments.position import NOTHING, Position
from tests.sim.nodes import ROWS, Violation


class Checks:
    """Mixed into World: ``self.nodes``, ``self.place``, ``self.table``, ``self.parts``,
    ``self.ledger``, ``self.settled_at``, ``self._batch`` and ``self._shipper`` are its."""

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
        for pid in range(self.parts):
            t, _ = await self._leader(pid).query("t", limit=None, partitions=[pid], as_of=T, trusted=True)
            got |= _rows(t)
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
        for pid, T, seen in self.ledger.reads:
            again, _ = await self._leader(pid).query("t", limit=None, as_of=T, partitions=[pid])
            if _rows(again) != seen:
                raise Violation(f"as_of {T} of partition {pid} read {len(seen)} rows then, {len(_rows(again))} now")
        await self.check_feed()
        for pid in range(self.parts):
            await self.check_replicas(pid)

    async def check_feed(self) -> None:
        pairs = []
        for pid in range(self.parts):
            t, _ = await self._leader(pid).changes("t", 0, partitions=[pid])
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

    async def check_replicas(self, pid: int) -> None:
        """Every follower's copies agree with the leader's log, byte for byte, as far as both made
        them durable, and reach at least where the leader's log ended when every follower had
        caught up (the leader may append records of its own since)."""
        sh = self._shipper(pid)
        if sh is None:  # it stepped down meanwhile (the nodes' jobs go on): checked again after an election
            raise UnavailableError(f"the leader of partition {pid} stepped down during the checks")
        tid, settled = self.table.table_id, self.settled_at[pid]
        for f in sh.followers:
            r = await self.nodes[f].db.replicas.replica(tid, pid)
            if r.position() < settled:
                raise Violation(f"{f} holds {list(r.position())} of partition {pid}, behind the caught-up end "
                                f"{list(settled)}")
            for segid, (seq, _) in r.rec.segs.items():
                copy, seg = r.files.get(segid), sh.segs.get(seq)
                if seg is None or copy is None:
                    continue  # offloaded on the leader, or not open here
                if seg.segid != segid:
                    raise Violation(f"{f} holds segment {segid} at seq {seq}, the leader's log {seg.segid}")
                # a follower may hold a group the leader still waits on (shipped before its own
                # write completes): the bytes both made durable must agree
                n = min(copy.durable_size, seg.file.durable_size)
                a, b = await copy.read(0, n), await seg.file.read(0, n)
                if a != b:
                    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    raise Violation(f"{f}'s copy of segment {segid} is not the leader's log: {n} bytes there, "
                                    f"{seg.file.durable_size} here, first difference at {at}")



def _held_end(sh) -> Position:
    """The end of what the leader made durable: the last segment it holds with bytes in it (a
    segment just begun holds none yet, and a follower has nothing of it to hold)."""
    full = [q for q, seg in sh.segs.items() if seg.file.durable_size > 0]
    return Position(max(full), sh.segs[max(full)].file.durable_size) if full else NOTHING


def _rows(t: pa.Table) -> frozenset:
    return frozenset(zip(t.column("id").to_pylist(), t.column("b").to_pylist()))
