"""Hypothesis state machine: two nodes on one catalog and one object store, each serving some
partitions of a table (a placement with epochs), against a model of every key's versions.

Writes go to the node serving each key's partition; either node checkpoints, merges, seals,
offloads and runs garbage-collection passes at any moment (the horizon moving forward); a
partition moves between the nodes (release, placement switch, take); a node crashes and
restarts. After every step each node's reads of the partitions it serves — scans, point
gets, index queries, at the present and at past timestamps at or above the horizon — must
equal the model. A node's collector touching a partition it does not serve (RFC 0009,
"Who collects") retires segments the other node still reads: this machine finds it.
"""
import asyncio
import os
import time
from dataclasses import replace

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, rule

from catalog.memory import MemoryCatalog
from rowstore.db.database import Database, TablesConfig
from rowstore.db.background.gc import GcConfig
from rowstore.hlc import ms_of, ts_from_ms
from rowstore.tables.keys import encode_keys, partition_of
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

SCHEMA = "id int64 primary key, v float64, name string"
PARTS = 3
NODES = ("n1", "n2")
KEYS = st.lists(st.integers(0, 60), min_size=1, max_size=25, unique=True)


class TwoNodes:
    """Two nodes' devices on one catalog and object store; ``place`` is the placement:
    partition -> (node, epoch)."""

    def __init__(self):
        self.cat, self.objects = MemoryCatalog(), MemoryObjectStore()
        self.blocks = {n: MemoryBlockDevice() for n in NODES}
        self.place = {p: (NODES[p % 2], 1) for p in range(PARTS)}
        self.cfg = TablesConfig(partitions=PARTS, seal_bytes=4096, gc=GcConfig(min_garbage=0.2, grace_s=0.0))
        self.dbs: dict[str, Database] = {}

    async def start(self, node: str) -> Database:
        fs = TerrascaleFS(self.cat, self.blocks[node], MemoryBlockDevice(durable=False), self.objects,
                          config=FsConfig(node_id=node, sealed_block_size=4096, flush=ActiveConfig(flush_ms=0.5)))
        await fs.open()
        db = Database(fs, self.cfg)

        async def owns(d):
            return {p: e for p, (n, e) in self.place.items() if n == node}
        await db.open(owns)
        self.dbs[node] = db
        return db

    def crash(self, node: str) -> None:
        self.blocks[node].crash()
        self.dbs[node].tasks.cancel_all()


def pids_of(keys: np.ndarray) -> np.ndarray:
    return partition_of(encode_keys(pa.array(keys, pa.int64()), "int64"), PARTS)


class TwoNodeMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.world = TwoNodes()
        for n in NODES:
            self.run(self.world.start(n))
        self.d = self.run(self.world.dbs["n1"].create_table("t", SCHEMA, indexes=["name"]))
        self.run(self.world.dbs["n2"].tables.table(self.d))
        self.versions: dict[int, list[tuple[int, dict | None]]] = {}  # key -> [(commit_ts, row)]
        self.times: list[int] = []

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self):
        for n in NODES:
            self.world.crash(n)
        self.loop.run_until_complete(self._quiesce())
        self.loop.close()

    @staticmethod
    async def _quiesce():
        await asyncio.sleep(0.01)
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def db(self, node: str) -> Database:
        return self.world.dbs[node]

    def owner(self, pid: int) -> str:
        return self.world.place[pid][0]

    # -- writes ------------------------------------------------------------------------------

    def _by_owner(self, keys: list[int]) -> dict[str, np.ndarray]:
        ks = np.array(sorted(keys), np.int64)
        pids = pids_of(ks)
        out: dict[str, list] = {}
        for p in range(PARTS):
            if (pids == p).any():
                out.setdefault(self.owner(p), []).append(ks[pids == p])
        return {n: np.concatenate(v) for n, v in out.items()}

    @rule(keys=KEYS, v=st.floats(-100, 100, allow_nan=False, width=32))
    def upsert(self, keys, v):
        for node, ks in self._by_owner(keys).items():
            rows = [{"id": int(k), "v": float(v) + int(k), "name": f"s{int(k) % 4}"} for k in ks]
            res = self.run(self.db(node).upsert("t", pa.Table.from_pylist(rows, pa.schema(
                [("id", pa.int64()), ("v", pa.float64()), ("name", pa.string())]))))
            for r in rows:
                self.versions.setdefault(r["id"], []).append((res.commit_ts, r))
            self.times.append(res.commit_ts)

    @rule(keys=KEYS)
    def delete(self, keys):
        for node, ks in self._by_owner(keys).items():
            res = self.run(self.db(node).delete("t", ks.tolist()))
            for k in ks.tolist():
                self.versions.setdefault(k, []).append((res.commit_ts, None))
            self.times.append(res.commit_ts)

    # -- maintenance, on either node at any moment ------------------------------------------------

    @rule(node=st.sampled_from(NODES))
    def checkpoint(self, node):
        self.run(self.db(node).checkpoint())

    @rule(node=st.sampled_from(NODES))
    def merge(self, node):
        async def go():
            for p in self.db(node).tables.partitions():
                if any(lv == 0 for lv, _ in p.index.runs):
                    await p.index.merge(0, self.db(node).horizon())
        self.run(go())

    @rule(node=st.sampled_from(NODES))
    def seal_and_offload(self, node):
        self.run(self.db(node).seal())
        self.run(self.db(node).offload())

    @rule(node=st.sampled_from(NODES), advance=st.booleans(), data=st.data())
    def gc(self, node, advance, data):
        if advance and self.times:  # the horizon moves up to a write's timestamp, on both nodes
            target = self.times[data.draw(st.integers(0, 1000)) % len(self.times)]
            retention = max(time.time_ns() // 1_000_000 - ms_of(target), 0)
            if retention < self.world.cfg.retention_ms:
                self.world.cfg = replace(self.world.cfg, retention_ms=retention)
                for db in self.world.dbs.values():
                    db.reader.retention_ms = retention
        self.run(self.db(node).collect_garbage())

    @rule(node=st.sampled_from(NODES))
    def restart(self, node):
        self.world.crash(node)
        self.run(self.world.start(node))

    @rule(pid=st.integers(0, PARTS - 1))
    def move(self, pid):
        """The partition's node releases it, the placement switches (epoch + 1), the other
        node takes it (rowstore.db.serving.handoff)."""
        src, epoch = self.world.place[pid]
        dst = NODES[1 - NODES.index(src)]
        self.run(self.db(src).handoffs.release(self.d, pid))

        async def switch():
            self.world.place[pid] = (dst, epoch + 1)
            return True
        assert self.run(self.db(src).handoffs.switch(self.d, pid, switch))
        self.run(self.db(dst).handoffs.take(self.d, pid, epoch + 1))  # False: opened with the table just now
        assert pid in self.db(dst).tables.get(self.d.table_id).owned

    # -- checks ---------------------------------------------------------------------------------

    def _want(self, T: int) -> dict[int, dict]:
        out = {}
        for k, vs in self.versions.items():
            seen = [row for ts, row in vs if ts <= T]
            if seen and seen[-1] is not None:
                out[k] = seen[-1]
        return out

    @rule(data=st.data())
    def check_reads(self, data):
        # every draw first, the same for any state: what is drawn never depends on the clock
        picks = data.draw(st.lists(st.integers(0, 1000), min_size=2, max_size=2))
        names = data.draw(st.lists(st.sampled_from(["s0", "s1", "s2", "s3"]), min_size=6, max_size=6))
        keys = data.draw(st.lists(st.integers(0, 61), min_size=3, max_size=3))
        horizon = max(db.horizon() for db in self.world.dbs.values())
        past = [t for t in self.times if t >= horizon + ts_from_ms(250)]
        for node in NODES:
            db = self.db(node)
            mine = sorted(p for p in range(PARTS) if self.owner(p) == node)
            if not mine:
                continue
            closed = [t for t in past if t <= db.timeline.closed]  # another node's clock may be ahead
            for j, at in enumerate([None] + [closed[i % len(closed)] for i in picks if closed]):
                T = db.timeline.closed if at is None else at
                want = {k: r for k, r in self._want(T).items() if pids_of(np.array([k]))[0] in mine}
                got, _ = self.run(db.query("t", as_of=at, limit=None, partitions=mine))
                assert {r["id"]: r for r in got.to_pylist()} == want, (node, T)
                name = names[j]
                got, _ = self.run(db.query("t", where=[["name", "=", name]], as_of=at, columns=["id"], limit=None,
                                           partitions=mine))
                assert got.column("id").to_pylist() == sorted(k for k, r in want.items() if r["name"] == name), \
                    (node, T, at, name)
                for k in keys:
                    if pids_of(np.array([k]))[0] in mine:
                        assert self.run(db.get("t", k, as_of=at)) == want.get(k), (node, k, T)


TwoNodeMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TWO_NODE_EXAMPLES", 150)), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[p for p in Phase if p != Phase.shrink or not os.environ.get("TWO_NODE_NO_SHRINK")])
test_two_node_machine = TwoNodeMachine.TestCase
