"""Deletes by predicate on three real nodes with R = 3 (RFC 0016 §6), every segment job and the
collector turned up, writers adding rows through random nodes, deletes by a random threshold
on ``v`` and keyed deletes of a few ids sent through random nodes, and a node killed with
SIGKILL and restarted every few seconds (so deletes lose participants, coordinators and
leaders in the middle). Checked from the history: each acknowledged delete's count is the rows
matching at T − 1 and none matches (or of a keyed delete, is there) at T; at the end every
acknowledged row is there unless a delete that may have committed after it matches it, and no
row is there that an acknowledged later delete matches."""
from __future__ import annotations

import random
import threading
import time

import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from tests.node.cluster.test_gc_cluster import JOBS
from tests.node.proc import FAST_CLUSTER, eventually

SECONDS = 24
CHECKED = 4  # acknowledged deletes checked at T - 1 and T, at least
HISTORY = '[history]\nretention = "8s"\n'  # versions 8 s old may be purged: a delete is checked at once


class History:
    def __init__(self):
        self.lock = threading.Lock()
        self.next = 0
        self.rows: dict[int, tuple[float, int | None]] = {}  # id -> (v, commit_ts when acknowledged)
        self.deletes: list[tuple[float, int | None, int | None]] = []  # (threshold, T, count); T None: unknown
        self.keyed: list[tuple[frozenset[int], int | None]] = []  # keyed deletes: (ids, T); T None: unknown
        self.checked = 0
        self.ok: set[int] = set()  # acknowledged deletes checked at T - 1 and T (a check cut off by a kill is skipped)


def _call(nodes, rng):
    node = rng.choice(nodes)
    if node.proc is None:
        raise ConnectionError("node is down")
    return node.client(timeout=30)


def _fails_well(e: Exception, errors: list) -> None:
    if isinstance(e, ApiError) and e.status >= 500 and e.status not in (503, 504):
        errors.append(repr(e))


def _writer(nodes, h: History, stop: threading.Event, errors: list, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        with h.lock:
            ids = list(range(h.next, h.next + 20))
            h.next += 20
        rows = [{"id": i, "v": rng.uniform(0, 100)} for i in ids]
        with h.lock:
            h.rows.update((r["id"], (r["v"], None)) for r in rows)
        try:
            with _call(nodes, rng) as c:
                ts = c.upsert("d", rows)["commit_ts"]
            with h.lock:
                h.rows.update((r["id"], (r["v"], ts)) for r in rows)
        except (ApiError, ConnectionError, OSError) as e:
            _fails_well(e, errors)
            time.sleep(0.05)


def _keyed_deleter(nodes, h: History, stop: threading.Event, errors: list) -> None:
    """Keyed deletes of a few rows written so far (acknowledged or not), each checked at its T."""
    rng = random.Random(77)
    while not stop.is_set():
        time.sleep(0.3)
        with h.lock:
            if h.next < 100:
                continue
            ids = frozenset(rng.randrange(h.next) for _ in range(8))
        try:
            with _call(nodes, rng) as c:
                T = c.delete("d", sorted(ids))["commit_ts"]
        except (ApiError, ConnectionError, OSError) as e:
            _fails_well(e, errors)
            with h.lock:
                h.keyed.append((ids, None))
            continue
        with h.lock:
            h.keyed.append((ids, T))
        try:
            with _call(nodes, rng) as c:
                at = c.get_many("d", sorted(ids), columns=["id"], as_of=T)["rows"]
        except (ApiError, ConnectionError, OSError) as e:
            _fails_well(e, errors)
            continue
        if any(at):
            errors.append(f"keyed delete of {sorted(ids)} at {T}: {[r['id'] for r in at if r]} there at T")


def _deleter(nodes, h: History, stop: threading.Event, errors: list) -> None:
    rng = random.Random(99)
    while not stop.is_set():
        time.sleep(0.4)
        x = rng.uniform(0, 12)
        try:
            with _call(nodes, rng) as c:
                res = c.delete_where("d", where=[["v", "<", x]])
            with h.lock:
                h.deletes.append((x, res["commit_ts"], res["deleted"]))
        except (ApiError, ConnectionError, OSError) as e:
            _fails_well(e, errors)
            with h.lock:
                h.deletes.append((x, None, None))
            continue
        T, n = res["commit_ts"], res["deleted"]
        try:  # on any node, within the history kept
            with _call(nodes, rng) as c:
                at = c.query_json("d", where=[["v", "<", x]], columns=["id"], limit=None, as_of=T)
                before = c.query_json("d", where=[["v", "<", x]], columns=["id"], limit=None, as_of=T - 1)
        except (ApiError, ConnectionError, OSError) as e:
            _fails_well(e, errors)
            continue
        if at["rows"]:
            with h.lock:
                left = [(r["id"], h.rows[r["id"]][1], (h.rows[r["id"]][1] or 0) - T) for r in at["rows"]]
            errors.append(f"delete v < {x} at {T}: {len(at['rows'])} rows match at T: {left[:8]}")
        if len(before["rows"]) != n:
            errors.append(f"delete v < {x} at {T} said {n}; {len(before['rows'])} matched at T - 1")
        h.checked += 1
        h.ok.add(T)


def _check_final(node, h: History, acked, unknown) -> int:
    """The node's rows now against the history: every acknowledged row there unless a delete
    after it (or one never answered) matches it; none there that a later acknowledged delete
    matches. How many it holds."""
    with node.client(timeout=60) as c:
        final = {r["id"] for r in c.query_json("d", columns=["id"], limit=None)["rows"]}
    for i, (v, ts) in h.rows.items():
        keyed = [T for ids, T in h.keyed if i in ids]  # T None: may have committed
        if ts is not None and i not in final:
            assert any(v < x and T > ts for x, T, _ in acked) or any(v < x for x in unknown) or \
                any(T is None or T > ts for T in keyed), \
                f"{node.node_id}: acknowledged row {i} (v {v:.2f}, at {ts}) is gone and no delete after it matches it"
        if i in final:
            gone = [T for T in keyed if T is not None and ts is not None and T > ts]
            assert not gone, f"{node.node_id}: row {i} (at {ts}) survives later keyed deletes at {gone}"
            later = [(x, T) for x, T, _ in acked if v < x and ts is not None and T > ts]
            assert not later, (f"{node.node_id}: row {i} (v {v:.2f}, at {ts}) survives later deletes {later[:3]} "
                               f"(checked at T: {[T in h.ok for _, T in later[:3]]})")
    return len(final)


def _enough(h: History) -> bool:
    with h.lock:
        return h.checked >= CHECKED and sum(1 for r in h.rows.values() if r[1]) > 300


@pytest.mark.slow
def test_deletes_by_predicate_on_three_nodes_with_kills(tmp_path):
    jobs = JOBS.replace('[history]\nretention = "2s"\n', HISTORY)
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + jobs)
    rng = random.Random(5)
    try:
        start_all(nodes)
        with nodes[0].client(timeout=60) as c:
            c.create_table("d", [{"name": "id", "type": "int64"}, {"name": "v", "type": "float64"}], "id",
                           partitions=3, replicas=3)
        h, stop, errors = History(), threading.Event(), []
        threads = [threading.Thread(target=_writer, args=(nodes, h, stop, errors, s)) for s in range(2)]
        threads.append(threading.Thread(target=_deleter, args=(nodes, h, stop, errors)))
        threads.append(threading.Thread(target=_keyed_deleter, args=(nodes, h, stop, errors)))
        for t in threads:
            t.start()
        t0 = time.monotonic()
        # at least SECONDS, then on until enough was acknowledged to prove something (a slow
        # machine acknowledges less between kills), for at most twice as long again
        while time.monotonic() - t0 < SECONDS or (not _enough(h) and time.monotonic() - t0 < 3 * SECONDS):
            time.sleep(3)
            victim = rng.choice(nodes)
            victim.kill()
            time.sleep(0.5)
            victim.start(wait=False)
        stop.set()
        for t in threads:
            t.join(90)
        for n in nodes:
            n.wait_ready(90)
        acked = [d for d in h.deletes if d[1] is not None]
        assert h.checked >= CHECKED and sum(1 for r in h.rows.values() if r[1]) > 300, \
            f"too little acknowledged to prove anything: {h.checked} deletes checked, {len(h.rows)} rows sent"
        unknown = [x for x, T, _ in h.deletes if T is None]
        finals = [eventually(lambda n=n: _check_final(n, h, acked, unknown), 60, every=1.0) for n in nodes]
        assert not errors, errors[:5]
        print(f"deletes by predicate R=3 with kills: {len(h.rows)} rows sent, "
              f"{sum(1 for r in h.rows.values() if r[1])} acknowledged; {len(acked)} deletes acknowledged "
              f"({sum(n for *_, n in acked)} rows, {h.checked} checked at T - 1 and T), {len(unknown)} unanswered; "
              f"{sum(1 for _, T in h.keyed if T)} keyed deletes acknowledged; "
              f"{finals} rows at the end on each node")
    finally:
        for n in nodes:
            n.ensure_stopped()
