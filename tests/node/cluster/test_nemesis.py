"""The nemesis suite: three real node processes, R = 3, writers batching across every partition
through every member, seal, offload, checkpoint and GC running on every node throughout, one
node's wall clock 2 s ahead (while it is a member) — and seeded rounds of faults: kill -9 and
restart (with the same fault files and clock), SIGSTOP and SIGCONT, node-to-node links cut one
way or both or slowed by 100-400 ms one way or both (``TERRASCALE_FAILPOINT_CUT_DIR``, see
terrafs/failpoints.py), a node cut off over HTTP while its heartbeats go on, one node's block
device filled to the last byte (a tmpfs, root only) and freed again — and membership changes
under them: with three members a fresh node joins (`admin cluster add`; the rounds go on while
the driver moves replicas to it), with four one that is not the catalog's Raft leader (nor the
small-disk node) leaves (`admin cluster remove`; writes still sent to it until no placement
names it, then it is stopped). Every round picks among the current members; the writers
follow them.

One checker for all of it, once every fault is healed and every follower caught up, over the
members at the end: every acknowledged batch whole through every member and none half-applied
or never written, every read of the present taken during the faults answered or refused as a
fault excuses (503, 421, no answer), its ``as_of`` read answering the same rows again, the
change feed holding every acknowledged batch's rows with no write twice — and once more after
kill -9 of the node leading the most partitions (what its replicas hold is the truth then).

Every write attempt and every read — the rounds' reads of the present and a reader's all along
(the table, a key, a key range page by page, several keys, through a random live member) —
is recorded with its call and return on the monotonic clock, its T and rows
(tests/history/batches.py); once every fault healed, each writer finishes the batch it was
writing (nothing left with an unknown outcome), and the history is checked against the
change feed: every read of the present linearizable with the writes, every read at T the
snapshot at T, every acknowledged commit_ts in real-time order with the reads — and the run
must have acknowledged at least MIN_ACKED batches.

``NEMESIS_ROUNDS`` (default 30) and ``NEMESIS_SEED`` (default: a fixed one; the seed is printed
with the trace of rounds) for the long mode."""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from bench.node_proc import joiner, raft_cluster
from node.errors import ApiError
from tests.fixtures.tmpfs import SmallDisk, can_mount
from tests.history.batches import History, Layout, Region, check as check_history
from tests.node.proc import FAST_CLUSTER, eventually
from tests.node.cluster.test_replication_faults import (RETRY, ROWS, Writers, caught_up, check_batches, counts,
                                                         pids_of)

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "30"))
SEED = int(os.environ.get("NEMESIS_SEED", "23"))
PARTS = 3
ALL = frozenset(range(PARTS))
# A run that acknowledged fewer batches, or answered fewer reads of the present, proves too
# little (the default seed's 30 rounds acknowledge about 500, and answer about 150)
MIN_ACKED, MIN_READS = 200, 50
JOBS = """
[jobs]
seal_every = "1s"
offload_every = "1s"
checkpoint_every = "1s"
[gc]
interval = "2s"
grace = "0s"
min_garbage = 0.2
[segments]
seal_bytes = "256KiB"
"""


class Nemesis:
    """The rounds of faults. ``nodes``: the current members — what the rounds pick from, the
    writers write through and the checker reads (it changes with ``join`` and ``leave``)."""

    def __init__(self, tmp_path, nodes, rng: random.Random, disk: SmallDisk | None, extra: str):
        self.root, self.nodes, self.rng, self.disk, self.extra = tmp_path, list(nodes), rng, disk, extra
        self.all = list(nodes)  # every node process ever started (all stopped at the end)
        self.small = nodes[2] if disk else None  # its block device is the small one: it stays
        self.w: Writers | None = None
        self.cut_dirs: dict[str, object] = {}
        self.env: dict[str, dict] = {}  # each node's environment, again at each restart
        self.trace: list[str] = []
        self.reads: list[tuple[int, dict[int, int]]] = []
        self.bad_reads: list[str] = []  # answers no fault excuses (a 500, a 4xx other than 421)
        self.died: list[str] = []  # members that exited on their own (no round killed them)
        self.history = History(time.monotonic)

    def log(self, what: str) -> None:
        self.trace.append(f"{time.monotonic():.2f} {what}")

    def start(self, node, env: dict | None = None) -> None:
        d = self.cut_dirs[node.node_id] = self.root / f"cut-{node.node_id}"
        d.mkdir(exist_ok=True)
        self.env[node.node_id] = {"TERRASCALE_FAILPOINT_CUT_DIR": str(d), **(env or {})}
        node.start(wait=False, env=self.env[node.node_id])

    def cut(self, a: str, b: str) -> None:
        (self.cut_dirs[a] / b).touch()

    def slow(self, a: str, b: str, ms: int) -> None:
        tmp = self.cut_dirs[a] / f".tmp-{b}"  # written whole, then renamed (terrafs/failpoints.py)
        tmp.write_text(str(ms))
        os.replace(tmp, self.cut_dirs[a] / f"slow-{b}")

    def heal_links(self) -> None:
        for d in self.cut_dirs.values():
            for f in d.iterdir():
                f.unlink()

    def round(self) -> None:
        kinds = ["kill", "pause", "cut_one_way", "cut_both_ways", "isolate", "slow_link"]
        kinds += (["fill_disk"] if self.disk else []) + (["join"] if len(self.nodes) == 3 else ["leave"])
        kind = self.rng.choice(kinds)
        node = self.rng.choice(self.nodes)
        others = [n for n in self.nodes if n is not node]
        peer = self.rng.choice(others)
        hold = self.rng.uniform(1.0, 2.5)
        if kind == "join":
            self.join()
        elif kind == "leave":
            self.leave(self.rng.sample(self.nodes, len(self.nodes)))
        elif kind == "kill":
            self.log(f"kill -9 {node.node_id} for {hold:.1f} s")
            node.kill()
            time.sleep(hold)
            node.start(wait=False, env=self.env[node.node_id])
            node.wait_ready(90)
        elif kind == "pause":
            self.log(f"pause {node.node_id} for {hold:.1f} s")
            self.w.paused.add(node.node_id)
            os.kill(node.proc.pid, signal.SIGSTOP)
            time.sleep(hold)
            os.kill(node.proc.pid, signal.SIGCONT)
            self.w.paused.discard(node.node_id)
        elif kind in ("cut_one_way", "cut_both_ways"):
            self.log(f"{kind} {node.node_id} -> {peer.node_id} for {hold:.1f} s")
            self.cut(node.node_id, peer.node_id)
            if kind == "cut_both_ways":
                self.cut(peer.node_id, node.node_id)
            time.sleep(hold)
            self.heal_links()
        elif kind == "slow_link":
            ms, both = self.rng.randint(100, 400), self.rng.random() < 0.5
            self.log(f"slow_link {node.node_id} {'<->' if both else '->'} {peer.node_id} {ms} ms for {hold:.1f} s")
            self.slow(node.node_id, peer.node_id, ms)
            if both:
                self.slow(peer.node_id, node.node_id, ms)
            time.sleep(hold)
            self.heal_links()
        elif kind == "isolate":  # its HTTP path to and from every node; its Raft port still works
            self.log(f"isolate {node.node_id} for {hold + 2:.1f} s")
            for p in others:
                self.cut(node.node_id, p.node_id)
                self.cut(p.node_id, node.node_id)
            time.sleep(hold + 2)
            self.heal_links()
        elif kind == "fill_disk":
            self.log(f"fill_disk {self.small.node_id} for {hold:.1f} s")
            ballast = os.path.join(self.disk.path, "ballast")
            try:
                with open(ballast, "wb") as f:  # to the last byte (it may be full already)
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
            except OSError:
                pass
            time.sleep(hold)
            if os.path.exists(ballast):
                os.unlink(ballast)
        self.read_present()
        self.check_alive()
        time.sleep(0.3)

    def snapshot(self) -> None:
        """Each member's placement and what it leads, into the trace (best effort)."""
        for n in self.nodes:
            try:
                with n.client(timeout=10) as c:
                    place = [(p["leader"], p["epoch"], p["replicas"]) for p in c.describe("t")["placement"]]
                    led = {k: (st.get("epoch"), st.get("end"), {f: fs.get("lag_bytes") for f, fs in
                                                                st.get("followers", {}).items()})
                           for k, st in ((c.status()["replication"] or {}).get("led") or {}).items()}
                self.log(f"state via {n.node_id}: placement {place}; leads {led}")
            except Exception as e:  # noqa: BLE001 - a snapshot of a failing cluster: any answer is news
                self.log(f"state via {n.node_id}: {e!r}"[:300])

    def check_alive(self) -> None:
        """Every member no round has stopped still runs: a node that exits on its own fails the
        seed by name (not a minute later as writes left without an outcome)."""
        for n in self.nodes:
            rc = n.proc.poll() if n.proc is not None else None
            if rc is not None and n.node_id not in {d.split()[0] for d in self.died}:
                self.died.append(f"{n.node_id} exited with status {rc}")
                self.log(self.died[-1])

    def join(self) -> None:
        """A new node joins (`admin cluster add`); the driver moves replicas to it while the
        rounds go on (not waited for)."""
        new = joiner(self.root, self.nodes, self.extra, f"n{len(self.all) + 1}")
        self.log(f"join {new.node_id}")
        self.all.append(new)
        self.start(new)
        via = self.rng.choice(self.nodes)

        def add():
            with via.client(timeout=60) as c:  # an add that timed out may have been made
                if new.raft_address not in {m["raft_address"] for m in c.cluster()["members"]}:
                    c.add_member(new.raft_address)
        eventually(add, 60, 0.5)
        new.wait_ready(90)
        self.nodes.append(new)
        self.w.add(new)

    def leave(self, order: list) -> None:
        """The first member in ``order`` that is not the catalog's Raft leader (it cannot
        remove itself) nor the node with the small disk is removed (`admin cluster remove`,
        through another member) while writes still go to it; once no placement names it, it
        is stopped and no member any more."""
        gone = None

        def remove():
            nonlocal gone
            via = next(n for n in order if n is not gone)
            with via.client(timeout=60) as c:
                view = c.cluster()
                if gone is None:
                    gone = next(n for n in order if n.node_id != view["leader"] and n not in (self.small, via))
                elif gone.raft_address not in {m["raft_address"] for m in view["members"]}:
                    return via  # a remove that timed out was made
                self.log(f"leave {gone.node_id}: removed through {via.node_id}")
                try:
                    c.remove_member(gone.raft_address)
                except ApiError as e:
                    if e.status == 409:  # refused, nothing removed (it leads the catalog now, ...)
                        gone = None
                    raise
            return via
        via = eventually(remove, 60, 0.5)

        def unplaced():
            with via.client(timeout=60) as c:
                place = c.describe("t")["placement"]
            assert all(gone.node_id not in p["replicas"] for p in place), place
        try:
            eventually(unplaced, 120, 0.5)
        except AssertionError:
            self.snapshot()  # what each member leads and sees: why the move did not finish
            raise
        self.w.remove(gone)
        self.nodes.remove(gone)
        self.log(f"{gone.node_id} placed nowhere: stopping it")
        # SIGTERM: its jobs and requests wait out catalog timeouts (no longer in the Raft group),
        # which may pass its shutdown timeout (status 1; RFC 0010, the nemesis suite: open)
        rc, _ = gone.stop(90)
        self.log(f"{gone.node_id} stopped: exit status {rc}")

    def read_present(self) -> None:
        """A read of the present through a live node, kept with its T: read again at the end."""
        n = self.rng.choice([n for n in self.nodes if n.proc is not None and n.node_id not in self.w.paused])
        r = self.history.read(f"rounds via {n.node_id}", Region(ALL))
        try:
            with n.client(timeout=10) as c:
                doc = c._call("POST", "/v1/tables/t/query", {"columns": ["id", "b"], "limit": 10_000_000})
        except (ApiError, ConnectionError) as e:  # a fault may refuse it (503): nothing to keep then
            r.failed()
            self.log(f"read through {n.node_id} refused: {e!r}"[:200])
            self.refused(n, e)
            return
        r.ok(doc["as_of"], [(row["id"], row["b"]) for row in doc["rows"]])
        b = np.array([r["b"] for r in doc["rows"]], np.int64)
        ids, n_ = np.unique(b, return_counts=True)
        self.reads.append((doc["as_of"], dict(zip(ids.tolist(), n_.tolist()))))

    def read_at(self, c, T: int | None) -> tuple[int, list[tuple[int, int]]]:
        """The whole table through ``c`` at T (None: the present), recorded in the history."""
        r = self.history.read("checker", Region(ALL), T, note="after healing")
        try:
            doc = c._call("POST", "/v1/tables/t/query", {"columns": ["id", "b"], "limit": 10_000_000, "as_of": T}
                          if T is not None else {"columns": ["id", "b"], "limit": 10_000_000})
        except BaseException:
            r.failed()
            raise
        rows = [(row["id"], row["b"]) for row in doc["rows"]]
        r.ok(doc["as_of"], rows)
        return doc["as_of"], rows

    def refused(self, n, e: Exception) -> None:
        if not isinstance(e, ConnectionError) and e.status not in RETRY:
            self.bad_reads.append(f"{n.node_id}: {e.status} {e.code} {e}"[:300])

    def read_along(self, stop: threading.Event, rng: random.Random) -> None:
        """A client reading all along, every 0.2-0.5 s through a random live member: a key, a
        key range page by page, several keys, or the whole table — each read in the history."""
        while not stop.wait(rng.uniform(0.2, 0.5)):
            live = [n for n in list(self.nodes) if n.proc is not None and n.node_id not in self.w.paused]
            with self.w.lock:
                tried = sorted(self.w.tried)
            if not live or not tried:
                continue
            n, bid = rng.choice(live), rng.choice(tried)
            kind = rng.choice(("key", "key_range", "keys", "table"))
            keys = sorted({rng.choice(tried) * ROWS + rng.randrange(ROWS) for _ in range(8)})
            lo = bid * ROWS
            hi = lo + ROWS * rng.randint(1, 20)
            region = {"key": Region(ALL, keys=frozenset(keys[:1])), "key_range": Region(ALL, lo=lo, hi=hi),
                      "keys": Region(ALL, keys=frozenset(keys)), "table": Region(ALL)}[kind]
            r = self.history.read(f"reader via {n.node_id}", region, note=kind)
            try:
                with n.client(timeout=10) as c:
                    T, rows = _read(c, kind, keys, lo, hi)
            except (ApiError, ConnectionError) as e:
                r.failed()
                self.refused(n, e)
                continue
            r.ok(T, rows)


def _read(c, kind: str, keys: list[int], lo: int, hi: int) -> tuple[int | None, list[tuple[int, int]]]:
    """One read of ``kind`` through client ``c``: its T (None: the answer does not say) and the
    (id, b) of every row it saw."""
    if kind == "key":
        row = c.get("t", keys[0])
        return None, [] if row is None else [(row["id"], row["b"])]
    if kind == "keys":
        doc = c.get_many("t", keys)
        return doc["as_of"], [(row["id"], row["b"]) for row in doc["rows"] if row is not None]
    if kind == "table":
        doc = c._call("POST", "/v1/tables/t/query", {"columns": ["id", "b"], "limit": 10_000_000})
        return doc["as_of"], [(row["id"], row["b"]) for row in doc["rows"]]
    page = c.scan_page("t", start=[lo], end=[hi], columns=["id", "b"], limit=25)
    T, rows = page.as_of, []
    while True:
        rows += list(zip(page.rows.column("id").to_pylist(), page.rows.column("b").to_pylist()))
        if page.next is None:
            return T, rows
        page = c.scan_page("t", after=page.next)


def feed_check(c, acked: set[int], rows_per: int) -> list[tuple[int, int]]:
    """The change feed through ``c``: every acknowledged batch once; its (id, commit_ts) pairs."""
    t = c._call("POST", "/v1/tables/t/changes", {"after": 0}, arrow=True)
    pairs = list(zip(t.column("id").to_pylist(), t.column("commit_ts").to_pylist()))
    assert len(pairs) == len(set(pairs)), "the change feed holds a write twice"
    ids = set(t.column("id").to_pylist())
    missing = [b for b in acked if any(b * rows_per + i not in ids for i in range(rows_per))]
    assert not missing, f"the change feed lacks acknowledged batches {sorted(missing)[:10]}"
    return pairs


@pytest.mark.slow
def agrees_with_query(c) -> None:
    """An aggregate through ``c`` (rows per batch, every node's partials merged at one T, after
    every fault, seal, offload, checkpoint, merge and GC) counts what a query at its T returns."""
    def both():
        a = c.aggregate("t", [{"fn": "count"}], group_by=["b"])
        got = {r["b"]: r["count"] for r in a["rows"] if r["b"] is not None and r["b"] >= 0}
        return got, counts(c, as_of=a["as_of"])
    got, want = eventually(both, 60)
    assert got == want, f"aggregate and query disagree: {sorted(set(got.items()) ^ set(want.items()))[:5]}"


def test_nemesis_rounds_lose_nothing_and_agree(tmp_path):
    rng = random.Random(SEED)
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS)
    disk = SmallDisk(nodes[2].data / "block", 256) if can_mount() else None
    nem = Nemesis(tmp_path, nodes, rng, disk, FAST_CLUSTER + JOBS)
    w = None
    try:
        for n in nodes:  # its wall clock runs 2 s ahead
            nem.start(n, {"TERRASCALE_FAILPOINT_CLOCK_SKEW_MS": "2000"} if n is nodes[1] else None)
        for n in nodes:
            n.wait_ready(90)
        with nodes[0].client(timeout=60) as c:
            c.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=3, replicas=3)
        w = nem.w = Writers(nodes, n=4, retry=RETRY | {507}, history=nem.history).start()
        w.wait_acks(8)
        reading = threading.Event()
        reader = threading.Thread(target=nem.read_along, args=(reading, random.Random(SEED ^ 0x4EAD)), daemon=True)
        reader.start()
        for _ in range(ROUNDS):
            nem.round()
        nem.log("heal")
        reading.set()
        reader.join(30)
        w.stop(finish_s=60)  # each writer's last batch acknowledged: no outcome left unknown
        nem.log("writers stopped")
        nem.check_alive()
        assert not nem.died, f"members exited with no round stopping them: {nem.died}"
        assert not w.bad, f"answers no fault excuses: {w.bad[:5]}"
        assert not nem.bad_reads, f"reads answered what no fault excuses: {nem.bad_reads[:5]}"
        if w.unacked():  # what each member leads and sees then, for the trace: a liveness failure's state
            nem.snapshot()
        assert not w.unacked(), f"batches left with no outcome a minute after healing: {sorted(w.unacked())[:10]}"
        acked = w.acked_ids()
        members = nem.nodes
        eventually(lambda: caught_up(members, 3), 90)
        nem.log("caught up")
        for n in members:
            with n.client(timeout=60) as c:
                got = eventually(lambda c=c: counts(c), 30)
                check_batches(got, acked)
                assert set(got) <= w.tried, f"batches never written: {sorted(set(got) - w.tried)[:5]}"
                agrees_with_query(c)
        with members[0].client(timeout=60) as c:
            for T, seen in nem.reads:
                _, rows = eventually(lambda T=T: nem.read_at(c, T), 30)
                again = np.unique(np.array([b for _, b in rows], np.int64), return_counts=True)
                assert dict(zip(*(a.tolist() for a in again))) == seen, f"as_of {T} changed"
            pairs = eventually(lambda: feed_check(c, acked, ROWS), 30)  # 503 while a leadership moves
            eventually(lambda: nem.read_at(c, None), 30)  # the present, once all is written
        nem.log("history read")
        summary = check_history(nem.history, Layout(ROWS, lambda keys: pids_of(keys, PARTS)), pairs,
                                min_acked=MIN_ACKED, min_reads=MIN_READS)
        nem.log("history checked")
        # the replicas hold it all: kill -9 the node leading the most partitions, read again
        led = eventually(lambda: caught_up(members, 3), 90)  # leader balancing may be moving one
        top = max(members, key=lambda n: sum(1 for who, _ in led.values() if who == n.node_id))
        top.kill()
        nem.log(f"final kill -9 of {top.node_id}")
        for n in members:
            if n is not top:
                with n.client(timeout=60) as c:
                    check_batches(eventually(lambda c=c: counts(c), 60), acked)
                    agrees_with_query(c)
        print(f"nemesis seed {SEED}: {ROUNDS} rounds, {len(acked)} batches acknowledged, "
              f"{len(nem.reads)} as_of reads, members {[n.node_id for n in members]}, errors {w.errors}\n"
              f"history: {summary}\n"
              + "\n".join(nem.trace))
    except BaseException:
        print(f"nemesis seed {SEED}, rounds:\n" + "\n".join(nem.trace))
        raise
    finally:
        if w is not None:
            w.stop_ev.set()
        for n in nem.all:
            if n.proc is not None:
                try:
                    os.kill(n.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            n.ensure_stopped()
        if disk is not None:
            disk.remove()
