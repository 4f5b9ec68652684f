"""A scan paged through on three replicated nodes (R = 3) while the leader of the scanned
partition is killed with -9 between pages, and with seal, offload, checkpoint and GC run
between pages too: the pages, concatenated, are exactly the scan at the first page's T
(docs/rfcs/0013-measurement-keys.md §4) — no row repeated or skipped."""
from __future__ import annotations

import datetime as dt

import pytest

from bench.node_proc import raft_cluster, start_all
from node.client.ingest import schema_of
from rowstore.tables.keys import partition_of_key
from tests.node.proc import FAST_CLUSTER, eventually

T0 = dt.datetime(2026, 6, 1, tzinfo=dt.timezone.utc)


def _readings(sensor: str, lo: int, hi: int, v: float) -> list[dict]:
    return [{"sensor": sensor, "ts": (T0 + dt.timedelta(seconds=i)).isoformat(), "v": v} for i in range(lo, hi)]


def _page(c, **kw):
    """A page, asked again while the partition has no leader answering (503) or the node moves."""
    return eventually(lambda: c.scan_page("readings", **kw), 60)


@pytest.mark.slow
def test_pages_of_a_scan_survive_kill_9_of_its_partitions_leader(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        start_all(nodes)
        c = nodes[0].client(timeout=60)
        c.create_table("readings", [("sensor", "string"), ("ts", "timestamp"), ("v", "float64")],
                       ["sensor", "ts"], partitions=3, replicas=3)
        for s in ("s1", "s2", "s3"):
            eventually(lambda s=s: c.upsert("readings", _readings(s, 0, 400, 1.0)), 60)
        d = c.describe("readings")
        first = _page(c, prefix=["s2"], limit=50)
        T = first.as_of
        got = [(r["sensor"], r["ts"]) for r in first.rows.to_pylist()]
        # the rest written over after T: not in the scan
        eventually(lambda: c.upsert("readings", _readings("s2", 0, 400, 2.0)), 60)
        with nodes[0].client(timeout=60) as any_node:
            leaders = {p["partition"]: p["leader"] for p in any_node.describe("readings")["placement"]}
        pid = _partition_of_s2(d)
        victim = next(n for n in nodes if n.node_id == leaders[pid])
        survivors = [n for n in nodes if n is not victim]
        page, killed, jobs = first, False, ["seal", "offload", "checkpoint"]
        while page.next is not None:
            if not killed and len(got) >= 100:
                victim.kill()  # kill -9 of the scanned partition's leader between two pages
                killed = True
            cl = survivors[len(got) % 2].client(timeout=60)
            if jobs:
                job = jobs.pop(0)
                eventually(lambda job=job, cl=cl: cl.admin(job), 60)
            page = _page(cl, after=page.next)
            assert page.as_of == T
            got += [(r["sensor"], r["ts"]) for r in page.rows.to_pylist()]
            cl.close()
        assert killed, len(got)
        eventually(lambda: survivors[0].client(timeout=60).gc(), 60)
        want = [("s2", T0 + dt.timedelta(seconds=i)) for i in range(400)]
        assert got == want
        again = []  # the same scan from the start, after the failover and GC: the same rows at T
        page = _page(survivors[1].client(timeout=60), prefix=["s2"], as_of=T, limit=64)
        again += [(r["sensor"], r["ts"]) for r in page.rows.to_pylist()]
        while page.next is not None:
            page = _page(survivors[0].client(timeout=60), after=page.next)
            again += [(r["sensor"], r["ts"]) for r in page.rows.to_pylist()]
        assert again == want
        assert {r["v"] for r in page.rows.to_pylist()} == {1.0}
    finally:
        for n in nodes:
            n.ensure_stopped()


def _partition_of_s2(d: dict) -> int:
    """The partition of sensor s2's readings: the format's hash of the partition key."""
    return partition_of_key(schema_of(d).pk, ("s2",), d["partitions"])
