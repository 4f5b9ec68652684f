"""A table's partitions placed across 3 real node processes (RFC 0010, step 1): any node
accepts any request; a batch spanning nodes commits atomically with one commit_ts; a read
sees one snapshot across nodes; kill -9 of a participant or of the coordinator loses no
acknowledged batch and leaves none half-applied."""
import base64
import http.client
import subprocess
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap

from bench.node_proc import TERRASCALE, raft_cluster, start_all
from node.errors import ApiError
from rowstore.tables.keys import encode_keys, partition_of
from tests.node.proc import eventually, holds

N = 60  # rows per batch: with 6 partitions over 3 nodes every batch spans every node


def rows(bid: int) -> pa.Table:
    keys = bid * 1000 + np.arange(N, dtype=np.int64)
    return pa.table({"id": keys, "b": pa.array(np.full(N, bid), pa.int64()),
                     "x": pa.array(np.arange(N, dtype=np.float64))})


def batches(c, **kw) -> dict[int, int]:
    """batch id -> rows of it visible."""
    t = c.query("t", columns=["b"], limit=10_000_000, **kw)
    ids, counts = np.unique(t.column("b").to_numpy(), return_counts=True)
    return dict(zip(ids.tolist(), counts.tolist()))


def held_share(node, table: str, base: int) -> pa.Table:
    """Reserve, as a coordinator "n1" that is not the running n1, a share of rows of the
    partitions ``node`` leads, and leave it held (as a coordinator killed mid-batch does)."""
    with node.client() as c:
        d = c.describe(table)
    mine = [p["partition"] for p in d["placement"] if p["leader"] == node.node_id]
    keys = np.arange(base, base + 2000, dtype=np.int64)
    keys = keys[np.isin(partition_of(encode_keys(pa.array(keys), "int64"), d["partitions"]), mine)][:20]
    rows = pa.table({"id": keys, "b": np.full(len(keys), -8), "x": np.zeros(len(keys))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    txn = (3 << 62) | 12345
    q = (f"/v1/internal/txn/reserve?table={table}&table_id={d['table_id']}&schema_version={d['schema_version']}"
         f"&floor=0&txn={txn}&delete=0")
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    conn.request("POST", q, body=sink.getvalue().to_pybytes(), headers={
        "Content-Type": "application/vnd.apache.arrow.stream", "X-Terrascale-Forwarded-By": "n1",
        "X-Terrascale-Incarnation": "0000000000000000"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    conn.close()
    return rows


class Writers:
    """One thread per node, each writing batches through its node until stopped."""

    def __init__(self, nodes, first_bid: int):
        self.nodes, self.acked, self.failed = nodes, {}, []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i, first_bid + i * 10_000)) for i in range(len(nodes))]

    def _run(self, i: int, bid: int) -> None:
        with self.nodes[i].client(timeout=60) as c:
            while not self.stop.is_set():
                try:
                    res = c.upsert("t", rows(bid))
                    assert res["committed"] == N
                    with self.lock:
                        self.acked[bid] = res["commit_ts"]
                except (ApiError, ConnectionError) as e:  # a node is down: a clean refusal
                    with self.lock:
                        self.failed.append(repr(e))
                    time.sleep(0.05)
                bid += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def wait(self, n: int, timeout: float = 60) -> None:
        eventually(lambda: holds(len(self.acked) >= n, f"{n} acknowledged ({len(self.acked)}, {self.failed[-3:]})"),
                   timeout, 0.05)

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(120)


def settled(c, timeout: float = 40) -> dict[int, int]:
    """``batches`` once reads answer: after a kill, a survivor's closed timestamp waits for the
    batches the dead node left prepared until they are resolved (409/503 until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return batches(c)
        except ApiError as e:
            if e.code not in ("future_timestamp", "unavailable") or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def check(nodes, acked: dict[int, int]) -> None:
    """Every acknowledged batch whole, from every node; no batch in part anywhere."""
    seen = None
    for n in nodes:
        with n.client(timeout=60) as c:
            got = settled(c)
        assert all(v == N for v in got.values()), {k: v for k, v in got.items() if v != N}
        assert set(acked) <= set(got), sorted(set(acked) - set(got))[:5]
        seen = got if seen is None else seen
        assert set(got) >= set(seen)  # a later read sees at least what an earlier one did


@pytest.mark.slow
def test_batches_across_nodes_are_atomic_and_reads_see_one_snapshot(tmp_path):
    nodes = raft_cluster(tmp_path, 3)
    try:
        start_all(nodes)
        c1, c2, c3 = (n.client(timeout=60) for n in nodes)
        c2.create_table("t", [("id", "int64"), ("b", "int64"), ("x", "float64")], "id", indexes=["b"],
                        partitions=6)
        place = c1.describe("t")["placement"]
        assert [p["leader"] for p in place] == ["n2", "n3", "n1"] * 2
        assert all(p["replicas"] == [p["leader"]] and p["epoch"] == 1 for p in place)
        for p in place:
            p.pop("watermark")  # describe's alone (an idle partition's follows the closed timestamp)
        assert c3.cluster()["placement"]["t"] == place
        assert c1.status()["partitions_owned"] == 2
        with Writers(nodes, 1) as w:
            w.wait(30)
            # while writes go on: every batch seen by a read is whole
            for c in (c1, c2, c3):
                assert all(v == N for v in batches(c).values())
        assert not w.failed, w.failed[:3]
        check(nodes, w.acked)
        for c in (c1, c2, c3):
            m = c.metrics()
            assert 'terrascale_partitions_led{table="t"} 2.0' in m and "terrascale_txn_held 0.0" in m
            assert 'terrascale_partition_epoch{partition=' in m
            assert 'terrascale_txn_across_nodes_total{outcome="committed"}' in m
        # one commit_ts for the whole batch, on every node: invisible just below it, whole at it
        for bid, ts in sorted(w.acked.items())[:5]:
            for c in (c1, c2, c3):
                assert batches(c, where=[["b", "=", bid]], as_of=ts - 1) == {}
                assert batches(c, where=[["b", "=", bid]], as_of=ts) == {bid: N}
        # point reads are routed to the partition's node; deletes span nodes too
        bid = min(w.acked)
        assert c3.get("t", bid * 1000 + 7) == {"id": bid * 1000 + 7, "b": bid, "x": 7.0}
        gone = c1.delete("t", [int(k) for k in rows(bid).column("id").to_numpy()] + [-1])
        assert gone["deleted"] == N
        for c in (c1, c2, c3):
            assert bid not in batches(c) and c.get("t", bid * 1000 + 7) is None
            assert batches(c, where=[["b", "=", bid]], as_of=gone["commit_ts"] - 1) == {bid: N}
        # a bad batch is refused whole before anything moves; a limit and a projection
        with pytest.raises(ApiError) as ei:
            c2.upsert("t", [{"id": 1, "b": 1, "x": 1.0}, {"id": 2, "b": "no", "x": 1.0}])
        assert ei.value.status == 400 and c2.get("t", 1) is None
        t = c3.query("t", columns=["id"], limit=5)
        assert t.column_names == ["id"] and t.column("id").to_pylist() == sorted(t.column("id").to_pylist())
        assert t.num_rows == 5 and t.column("id")[0].as_py() == min(k for k in w.acked if k != bid) * 1000
        # the bridge's reads across nodes: a plan at one T whose offloaded slices and tails add
        # up to the table, and a change feed with every node's changes in commit order
        total = sum(batches(c1).values())
        for c in (c1, c2, c3):
            c.admin("seal")
            c.admin("offload")
        c2.upsert("t", rows(999_999))  # a tail beside the offloaded segments
        plan = c1._call("POST", "/v1/tables/t/plan", {})
        assert plan["lease"] and len({s["segid"] for s in plan["sealed"]}) == len(plan["sealed"]) >= 3
        in_objects = sum(len(BitMap.deserialize(base64.b64decode(s["visible"]))) for s in plan["sealed"])
        sealed = [s["segid"] for s in plan["sealed"]]
        tails = sum(c3._call("POST", "/v1/tables/t/tail", {"partition": p, "as_of": plan["as_of"],
                                                          "sealed": sealed}, arrow=True).num_rows
                    for p in plan["tail"])
        assert in_objects == total and tails == N and sorted(plan["tail"]) == plan["tail"]
        feed = c3._call("POST", "/v1/tables/t/changes", {"after": 0}, arrow=True)
        ts = feed.column("commit_ts").to_numpy()
        assert (np.diff(ts) >= 0).all() and feed.num_rows == total + 3 * N + 1
        # (+ the deleted batch, written and deleted with the absent key -1, + the tail batch)
        assert set(feed.column("op").to_pylist()) == {"upsert", "delete"}
        # a schema change through one node holds on every node at once: rows with the new
        # column go through the others (across nodes) and read back everywhere
        c3.get("t", min(w.acked) * 1000 + 1)  # every node has the old definition cached
        c2.upsert("t", rows(888_888))
        c1.add_column("t", "note", "string")
        c3.upsert("t", [{"id": 70_000_000 + i, "b": -7, "x": 0.0, "note": f"n{i}"} for i in range(12)])
        for c in (c1, c2, c3):
            assert c.get("t", 70_000_005)["note"] == "n5"
            assert c.query("t", where=[["b", "=", -7]], columns=["note"]).num_rows == 12
        c2.drop_column("t", "note")
        with pytest.raises(ApiError) as ei:
            c1.upsert("t", [{"id": 1, "b": 1, "x": 1.0, "note": "gone"}, {"id": 2, "b": 1, "x": 1.0}])
        assert ei.value.status == 400
        # a share reserved for a coordinator that is gone (another incarnation of n1 than the
        # running one) is aborted by its participant at once: its locks go, txn/X says aborted
        hold = held_share(nodes[1], "t", 5_000_000_000)
        assert hold.num_rows > 0
        t0 = time.monotonic()  # the same keys, through n2 itself: they wait for the locks
        c2.upsert("t", pa.table({"id": hold.column("id"), "b": np.full(hold.num_rows, -9),
                                 "x": np.zeros(hold.num_rows)}))
        assert time.monotonic() - t0 < 8  # not the 10 s prepare timeout: n1 answered as another process
        assert "event=prepared_resolved" in nodes[1].log() and "outcome=aborted" in nodes[1].log()
        assert "terrascale_txn_held 0.0" in c2.metrics()
        assert batches(c1, where=[["b", "<", -7]]) == {-9: hold.num_rows}  # none of the held share
        # the CLI's bulk load sends each node its own rows (no two-phase commit across nodes)
        src = tmp_path / "bulk.parquet"
        keys = np.arange(10**7, 10**7 + 30_000, dtype=np.int64)
        pq.write_table(pa.table({"id": keys, "b": np.full(len(keys), -5), "x": keys.astype(np.float64)}), src)
        r = subprocess.run([TERRASCALE, "--endpoint", nodes[1].base, "ingest", "t", str(src), "--batch-rows", "7000",
                            "--no-progress"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "ingested 30000 rows in 5 batches" in r.stderr, r.stderr
        for c in (c1, c2, c3):
            assert batches(c, where=[["b", "=", -5]]) == {-5: 30_000}
        assert c1.get("t", 10**7 + 29_999)["x"] == 10**7 + 29_999
        for c in (c1, c2, c3):
            c.close()
    finally:
        for n in nodes:
            n.ensure_stopped()


@pytest.mark.slow
def test_kill_9_of_a_participant_and_of_the_coordinator_loses_nothing_acknowledged(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra='shutdown_timeout = "20s"\n')
    try:
        start_all(nodes)
        with nodes[0].client(timeout=60) as c:
            c.create_table("t", [("id", "int64"), ("b", "int64"), ("x", "float64")], "id", indexes=["b"],
                           partitions=6)
        acked: dict[int, int] = {}
        # a participant dies mid-load: batches through the others fail cleanly or commit whole
        with Writers(nodes[:2], 1) as w:
            w.wait(10)
            nodes[2].kill()
            eventually(lambda: holds(w.failed, "a batch refused while a participant is dead"), 30, 0.05)
        acked.update(w.acked)
        assert w.failed  # its partitions were unavailable
        nodes[2].start()
        check(nodes, acked)
        # the coordinator of every batch dies mid-load: the participants resolve what it left
        # prepared from the catalog after their timeout, and the batches are whole or absent
        with Writers(nodes[:1], 100_000) as w:
            w.wait(len(acked) + 10)
            log = nodes[0].kill()
        acked.update(w.acked)
        assert "Traceback" not in log
        nodes[0].start()
        check(nodes, acked)
        logs = "".join(n.log() for n in nodes[1:])
        assert "Traceback" not in logs
    finally:
        for n in nodes:
            n.ensure_stopped()
