"""The node's views of itself that the admin routes serve (``node/http/ports.py``): the
Prometheus page, ``/v1/admin/status`` and the cluster view. Made with the node; ``open``
gives them the stores once they are open (``Node.open``)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from catalog.abc import Catalog
from catalog.raft import RaftCatalog
from node.cluster.controller import NodeReplication
from node.cluster.serving import Serving
from node.config import NodeConfig
from node.daemon.jobs import Jobs
from node.errors import ApiError
from node.http.limits import ConnectionGuard
from node.metrics import Metrics
from node.phase import Readiness
from rowstore.db.partition import segment_states
from terrafs.fs import TerrascaleFS
from terrafs.records import FileState, FileTier

CATCH_UP_BYTES = 4 << 20  # a follower further behind than one catch-up message is under-replicated


@dataclass(frozen=True)
class _Stores:
    fs: TerrascaleFS
    sv: Serving
    jobs: Jobs
    replication: NodeReplication


class Views:
    def __init__(self, cfg: NodeConfig, readiness: Readiness, metrics: Metrics, guard: ConnectionGuard,
                 http_url: str):
        self.cfg, self.readiness, self.metrics, self.guard, self.http_url = cfg, readiness, metrics, guard, http_url
        self.started = time.time()
        self._opened: _Stores | None = None
        self._raft_refused: dict[str, int] = {}

    def open(self, fs: TerrascaleFS, sv: Serving, jobs: Jobs, replication: NodeReplication) -> None:
        """The node's stores are open: the views may read them (``Node.open``)."""
        self._opened = _Stores(fs, sv, jobs, replication)

    @property
    def _parts(self) -> _Stores:
        if self._opened is None:
            raise ApiError(503, "not_ready", "the node is starting or stopping (see /readyz)")
        return self._opened

    async def render_metrics(self) -> tuple[bytes, str]:
        m = self.metrics
        m.pending.labels("http").set(len(self.guard.pending))
        if self._opened is not None:
            self._raft_metrics(self._opened.sv.catalog)
        if self._opened is not None and self.readiness.ready:
            await self._store_metrics(self._opened)
        return generate_latest(m.registry), CONTENT_TYPE_LATEST

    async def _store_metrics(self, o: _Stores) -> None:
        m, fs, db = self.metrics, o.fs, o.sv.db
        counts = {(s, t): 0 for s in FileState for t in FileTier}
        for r in await fs.list(owner=self.cfg.node_id):
            counts[(r.state, r.tier)] += 1
        for (s, t), n in counts.items():
            m.files.labels(s.value, t.value).set(n)
        m.cache_ratio.set(fs.cache.hit_ratio())
        for k, v in fs.cache.stats.items():
            m.cache_events.labels(k).set(v)
        for state, n in segment_states([r for _, r in await db.segment_records()]).items():
            m.segments.labels(state).set(n)
        stats = db.flush_stats()
        m.flushes.set(sum(s["flushes"] for s in stats))
        m.flushed_bytes.set(sum(s["flushed_bytes"] for s in stats))
        m.flush_appends.set(sum(s["appends"] for s in stats))
        m.flush_seconds.set(sum(s.get("flush_s", 0.0) for s in stats))
        m.flush_wait_seconds.set(sum(s.get("wait_s", 0.0) for s in stats))
        syncs, rounds, space = fs.block.fdatasyncs(), fs.block.rounds(), fs.block.space()
        if space is not None:
            m.device_allocated.set(space[0])
            m.device_used.set(space[1])
        if syncs is not None:
            m.device_syncs.set(syncs)
        if rounds is not None:
            hops, groups = rounds
            m.device_rounds.set(hops)
            m.device_round_groups.set(groups)
        m.memtable_bytes.set(db.memtable_bytes())
        m.write_stalls.set(db.maintenance.stalls)
        m.column_cache_bytes.set(db.column_runs.bytes)
        m.closed_ts.set(db.closed_ts)
        m.txn_held.set(db.participant.held)
        await self._placement_metrics(o)
        tot = db.gc.totals
        m.gc_runs.set(tot["runs"])
        m.gc_rows_copied.set(tot["rows_copied"])
        m.gc_bytes_reclaimed.set(tot["bytes_reclaimed"])
        m.gc_seconds.set(tot["run_seconds"])
        m.gc_deleted.set(tot["segments_deleted"])
        m.retention_segments.set(tot["retention_segments_dropped"])
        m.retention_bytes.set(tot["retention_bytes_dropped"])
        m.gc_garbage_ratio.set(await db.gc.garbage_ratio())

    async def _placement_metrics(self, o: _Stores) -> None:
        """Partitions led here and their epochs, and each follower's lag (a dropped table's
        series go away)."""
        m, db = self.metrics, o.sv.db
        m.partitions_led.clear()
        m.partition_epoch.clear()
        m.replica_lag_bytes.clear()
        m.replica_lag_seconds.clear()
        names = db.tables.names()
        under = 0
        for (tid, pid), sh in db.leadership.led().items():
            st, behind = sh.status(), False
            for node, f in st["followers"].items():
                lag = -1 if f["lag_bytes"] is None else f["lag_bytes"]
                m.replica_lag_bytes.labels(names.get(tid, tid), str(pid), node).set(lag)
                m.replica_lag_seconds.labels(names.get(tid, tid), str(pid), node).set(
                    f["ack_age_s"] if f["ack_age_s"] is not None else -1)
                behind |= lag < 0 or lag > CATCH_UP_BYTES
            under += behind
        m.under_replicated.set(under)
        for outcome, n in o.replication.elections.items():
            m.elections.labels(outcome).set(n)
        for d in await db.list_tables():
            pl = await o.sv.cluster.placement(d.name, d.partitions)
            led = pl.led_by(self.cfg.node_id)
            m.partitions_led.labels(d.name).set(len(led))
            for p in sorted(led):
                m.partition_epoch.labels(d.name, str(p)).set(pl.partitions[p].epoch)

    def _raft_metrics(self, catalog: Catalog) -> None:
        """The Raft port's refusals, counted on the replica's thread, into the node's counters."""
        if not isinstance(catalog, RaftCatalog):
            return
        st = catalog.connection_stats()
        self.metrics.raft_write_retries.set(st.pop("write_retries", 0))
        for reason, n in st.items():
            delta = n - self._raft_refused.get(reason, 0)
            if delta > 0:
                self.metrics.refused.labels("raft", reason).inc(delta)
                self._raft_refused[reason] = n

    async def status(self) -> dict[str, Any]:
        o, ready = self._parts, self.readiness.ready
        db, cluster = o.sv.db, o.sv.cluster
        recs = [r for _, r in await db.segment_records()] if ready else []
        tables = await db.list_tables() if ready else []
        owned = 0
        for d in tables:
            owned += len((await cluster.placement(d.name, d.partitions)).led_by(self.cfg.node_id))
        cs = await self._catalog_status(o)
        return {
            "node_id": self.cfg.node_id, "address": self.http_url, "ready": ready,
            "version": version("terrascale"),
            "uptime_s": round(time.time() - self.started, 3), "role": cs["role"],
            "partitions_owned": owned, "tables": len(tables), "segments": segment_states(recs),
            "closed_ts": db.closed_ts, "history_horizon": db.horizon(),
            "catalog_leader": cs["leader"], "catalog_revision": await o.sv.catalog.revision(),
            "memtable_bytes": db.memtable_bytes(),
            "jobs": {name: {"every_s": every, "last": o.jobs.last.get(name)}
                     for name, every in o.jobs.schedule.items()},
            "replication": self._replication_status(o),
        }

    def _replication_status(self, o: _Stores) -> dict[str, Any] | None:
        """Replicated partitions led here (epoch, lease, each follower's position and lag),
        the driver's view (dead nodes) and the elections run (RFC 0010 §5)."""
        if not o.replication.enabled:
            return None
        names = o.sv.db.tables.names()
        st = o.replication.status()
        st["led"] = {f"{names.get(k.split('/')[0], k.split('/')[0])}/{k.split('/')[1]}": v
                     for k, v in st["led"].items()}
        return st

    async def _catalog_status(self, o: _Stores) -> dict[str, Any]:
        """role / leader / term of the catalog, leader as a node id where it is known."""
        if not o.sv.cluster.multi:
            return {"role": "single", "leader": self.cfg.node_id, "term": 1, "members": None}
        cat = o.sv.catalog
        assert isinstance(cat, RaftCatalog)  # a cluster's catalog is raft:// (Cluster.multi)
        st = await cat.cluster_status()
        by_raft = {m.get("raft"): nid for nid, m in (await o.sv.cluster.members()).items()}
        return {"role": st["role"], "leader": by_raft.get(st["leader"], st["leader"]), "term": st["term"],
                "members": st["members"], "by_raft": by_raft, "has_quorum": st.get("has_quorum")}

    async def cluster_view(self) -> dict[str, Any]:
        o, ready = self._parts, self.readiness.ready
        cluster = o.sv.cluster
        cs = await self._catalog_status(o)
        members = await cluster.members()
        tables = await o.sv.db.list_tables() if ready else []
        parts = await cluster.partitions(tables)
        placement = {d.name: (await cluster.placement(d.name, d.partitions)).json() for d in tables}
        if cs["members"] is None:
            out = [{"id": self.cfg.node_id, "address": self.http_url, "alive": ready}]
        else:
            out = []
            for m in cs["members"]:
                nid = cs["by_raft"].get(m["address"])
                out.append({"id": nid or m["address"], "address": members.get(nid, {}).get("http"),
                            "raft_address": m["address"], "alive": bool(m["alive"]), "self": bool(m["self"])})
        return {"members": out, "leader": cs["leader"], "term": cs["term"], "partitions": parts,
                "placement": placement,
                "catalog": "raft" if cs["members"] is not None else "trkv"}
