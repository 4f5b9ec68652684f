"""Hypothesis state machine: a table against a dict-of-versions model.

Upserts, deletes, schema changes, checkpoints, merges, seals, offloads, garbage-collection
passes (clustered rewrites; the retention horizon moved forward; crashes at every GC step)
and crash restarts; after every step get / scan / query / bbox at random timestamps at or
above the horizon must equal the model's reconstruction (RFC 0003: the newest version with
commit_ts <= T, unless it is a deletion, in the columns and names of T), and reads below the
horizon are ``history_purged``. A variant runs with caches of one or two entries (block
cache, parsed index pages) and index pages of four entries.
"""
import asyncio
import time
from dataclasses import replace

import hypothesis.strategies as st
import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from rowstore.db.background.gc import GcConfig
from rowstore.errors import HistoryPurgedError
from rowstore.hlc import ms_of, ts_from_ms
from rowstore.index import key_run
from terrafs.failpoints import FailPointCrash, armed
from tests.rowstore.tables_world import TablesWorld

GC_POINTS = ["gc.after_copy", "gc.after_publish", "gc.after_index_checkpoint", "gc.after_retire", "gc.after_delete"]

SCHEMA = "id int64 primary key, loc point, v float64, n int64, name string"
KEYS = st.lists(st.integers(0, 40), min_size=1, max_size=25)
VALUES = st.floats(-100, 100, allow_nan=False, width=32)


class Model:
    def __init__(self):
        self.writes: list[tuple[int, dict]] = []  # (commit_ts, {key: {column id: value} | None})
        self.schemas: list[tuple[int, object]] = []  # (ts, SchemaVersion)

    def schema_at(self, T):
        return [s for ts, s in self.schemas if ts <= T][-1]

    def state_at(self, T) -> dict:
        out = {}
        for ts, w in self.writes:
            if ts <= T:
                for k, row in w.items():
                    if row is None:
                        out.pop(k, None)
                    else:
                        out[k] = row
        return out

    def rows_at(self, T) -> list[dict]:
        s = self.schema_at(T)
        return [{c.name: row.get(c.id) for c in s.columns} for _, row in sorted(self.state_at(T).items())]


class TableMachine(RuleBasedStateMachine):
    CLUSTER_BY = "loc"  # copies are written in Hilbert order of the point column
    FS: dict = {}

    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.world = TablesWorld(partitions=3, fs_cfg=self.FS, gc=GcConfig(min_garbage=0.2, grace_s=0.0))
        self.db = self.run(self.world.start())
        d = self.run(self.db.create_table("t", SCHEMA, indexes=["loc", "v", "name"], cluster_by=self.CLUSTER_BY))
        self.model = Model()
        self.model.schemas.append((d.ts, d.schema))
        self.extra = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self):
        self.world.crash()  # cancels the last incarnation's background work
        self.loop.run_until_complete(self._quiesce())
        self.loop.close()

    @staticmethod
    async def _quiesce():
        """Let pending timers fire (lazy flushes), then end every task the dead node left."""
        await asyncio.sleep(0.01)
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    @property
    def schema(self):
        return self.model.schemas[-1][1]

    # -- writes ------------------------------------------------------------------------------

    @rule(keys=KEYS, vals=st.lists(VALUES, min_size=25, max_size=25), data=st.data())
    def upsert(self, keys, vals, data):
        s = self.schema
        rows = []
        for i, k in enumerate(keys):
            row = {}
            for c in s.columns:
                t = str(c.type)
                if c.id in s.primary_key:
                    row[c.id] = k
                elif t == "point":
                    row[c.id] = None if i % 7 == 3 else {"x": float(vals[i] % 10), "y": float(vals[-i - 1] % 10)}
                elif t == "float64":
                    row[c.id] = float(vals[i])
                elif t == "string":
                    row[c.id] = None if i % 5 == 4 else f"s{int(vals[i]) % 4}"
                else:
                    row[c.id] = int(vals[i]) % 9
            rows.append(row)
        table = pa.table({c.name: pa.array([r[c.id] for r in rows], c.type.arrow()) for c in s.columns})
        res = self.run(self.db.upsert("t", table))
        self.model.writes.append((res.commit_ts, {r[s.primary_key[0]]: r for r in rows}))

    @rule(keys=KEYS)
    def delete(self, keys):
        res = self.run(self.db.delete("t", keys))
        self.model.writes.append((res.commit_ts, dict.fromkeys(keys)))

    @rule()
    def add_column(self):
        self.extra += 1
        name = f"e{self.extra}"
        self._alter(lambda s: s.add_column(name, "int64"))

    @precondition(lambda self: any(c.name.startswith("e") for c in self.schema.columns))
    @rule(data=st.data())
    def drop_column(self, data):
        name = data.draw(st.sampled_from([c.name for c in self.schema.columns if c.name.startswith("e")]))
        self._alter(lambda s: s.drop_column(name))

    @rule()
    def rename_v(self):
        old = "v" if self.schema.by_name("v") else "w"
        self._alter(lambda s: s.rename_column(old, "w" if old == "v" else "v"))

    def _alter(self, change):
        d = self.run(self.db.alter_table("t", change))
        self.model.schemas.append((d.ts, d.schema))

    # -- maintenance ---------------------------------------------------------------------------

    @rule()
    def checkpoint(self):
        self.run(self.db.checkpoint())

    @rule()
    def merge(self):
        async def go():
            for p in self.db.tables.partitions():
                if any(lv == 0 for lv, _ in p.index.runs):
                    await p.index.merge(0, self.db.horizon())
        self.run(go())

    @rule()
    def seal_and_offload(self):
        self.run(self.db.seal())
        self.run(self.db.offload())

    @rule(tear=st.booleans())
    def restart(self, tear):
        self.world.crash(tear)
        self.db = self.run(self.world.start())

    # -- garbage collection ----------------------------------------------------------------------

    def _advance_horizon(self, data) -> None:
        """Move the retention horizon up to a write's timestamp (never back)."""
        ts = [w[0] for w in self.model.writes] or [self.db.timeline.closed]
        target = ts[data.draw(st.integers(0, 1000)) % len(ts)]  # draws never depend on the clock
        retention = max(time.time_ns() // 1_000_000 - ms_of(target), 0)
        if retention < self.world.cfg.retention_ms:
            self.world.cfg = replace(self.world.cfg, retention_ms=retention)  # a restart keeps it
            self.db.reader.retention_ms = retention

    @rule(advance=st.booleans(), data=st.data())
    def gc(self, advance, data):
        if advance:
            self._advance_horizon(data)
        self.run(self.db.collect_garbage())

    @rule(point=st.sampled_from(GC_POINTS), advance=st.booleans(), data=st.data())
    def gc_crash(self, point, advance, data):
        """A pass that dies at ``point`` (if it gets there), then a crash and a restart."""
        if advance:
            self._advance_horizon(data)
        with armed(point):
            try:
                self.run(self.db.collect_garbage())
            except FailPointCrash:
                pass
        self.world.crash()
        self.db = self.run(self.world.start())

    # -- checks ---------------------------------------------------------------------------------

    def _times(self, data) -> list[int | None]:
        """Timestamps to read at: some at or above the horizon, and None (the present)."""
        ts = [w[0] for w in self.model.writes] + [s[0] for s in self.model.schemas]
        picks = data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=3))  # never clock-dependent
        horizon = self.db.horizon()
        below = [t for t in ts if t < horizon]
        if below:  # purged history is refused, never answered from what is left
            try:
                self.run(self.db.read_all("t", as_of=below[picks[0] % len(below)]))
                raise AssertionError("a read below the horizon was answered")
            except HistoryPurgedError:
                pass
        ts = [t for t in ts if t >= horizon + ts_from_ms(250)]  # margin: the horizon moves with the clock
        return [ts[i % len(ts)] if ts else None for i in picks[1:]] + [None]  # as many as picks: same draws

    @rule(data=st.data())
    def check_reads(self, data):
        for at in self._times(data):
            T = self.db.timeline.closed if at is None else at
            want = self.model.rows_at(T)
            got, _ = self.run(self.db.read_all("t", as_of=at))
            assert got.to_pylist() == want, T
            for k in data.draw(st.lists(st.integers(0, 41), max_size=3)):
                row = self.run(self.db.get("t", k, as_of=at))
                assert row == next((r for r in want if r["id"] == k), None), (k, T)
            s = self.model.schema_at(T)
            vname = "v" if s.by_name("v") else "w"
            lo = data.draw(VALUES)
            nmax = data.draw(st.integers(0, 9))
            box = dict(zip(("xmin", "ymin"), sorted(data.draw(st.tuples(st.integers(0, 10), st.integers(0, 10))))))
            box.update(xmax=box["xmin"] + data.draw(st.integers(0, 6)), ymax=box["ymin"] + data.draw(st.integers(0, 6)))
            name = data.draw(st.sampled_from(["s0", "s1", "s2", "s3"]))

            def inbox(p, box=box):
                return p is not None and box["xmin"] <= p["x"] <= box["xmax"] and box["ymin"] <= p["y"] <= box["ymax"]

            got, _ = self.run(self.db.query("t", where=[[vname, ">=", lo], ["n", "<", nmax]], as_of=at, limit=None))
            assert got.to_pylist() == [r for r in want if r[vname] is not None and r[vname] >= lo
                                       and r["n"] is not None and r["n"] < nmax], T
            got, _ = self.run(self.db.query("t", bbox={"column": "loc", **box}, where=[["name", "=", name]],
                                            as_of=at, columns=["id"], limit=None))
            assert got.column("id").to_pylist() == [r["id"] for r in want if inbox(r["loc"]) and r["name"] == name]


TableMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_table_machine = TableMachine.TestCase


class TinyCacheMachine(TableMachine):
    """Caches of 1-2 entries and 4-entry index pages: every read evicts what another needs
    (the parsed-page eviction bug of `IndexRun.pages` would fail here)."""

    CLUSTER_BY = None  # primary-key order
    FS = {"cache_memory_bytes": 2 * 4096, "cache_volatile_bytes": 4096}

    def __init__(self):
        self._saved = (key_run.PARSED_PAGES, key_run.PAGE_ENTRIES)
        key_run.PARSED_PAGES, key_run.PAGE_ENTRIES = 2, 4
        try:
            super().__init__()
        except BaseException:
            key_run.PARSED_PAGES, key_run.PAGE_ENTRIES = self._saved
            raise

    def teardown(self):
        try:
            super().teardown()
        finally:
            key_run.PARSED_PAGES, key_run.PAGE_ENTRIES = self._saved


TinyCacheMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_tiny_cache_machine = TinyCacheMachine.TestCase
