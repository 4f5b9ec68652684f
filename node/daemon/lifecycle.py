"""The node daemon: open stores -> recover -> ready -> serve; unwind in reverse on stop.

aiohttp serves HTTP on the same event loop as the storage engine (see
docs/DEPENDENCIES.md for why aiohttp). Startup steps register their cleanup
on an AsyncExitStack, so shutdown closes exactly what was opened, in reverse
(aiohttp's web_runner pattern):

    objects store -> catalog -> TerrascaleFS (recover files) -> Database (recover
    segments, decide prepared batches, replay indexes) -> cluster registration ->
    background jobs -> ready (/readyz 200, sd_notify READY=1)

Stop (SIGTERM/SIGINT): not ready (/readyz 503, STOPPING=1), stop accepting
connections, let in-flight requests finish, stop the jobs, checkpoint the
memtables (so the next start replays less), close the engine, the file system,
the catalog and the object store — all within ``node.shutdown_timeout``.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import secrets
import logging
import signal
import ssl
import time
from importlib.metadata import version

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from catalog.errors import CatalogError
from catalog.raft.wire import ConnLimits
from node.daemon import sdnotify
from node.http.app import make_app
from node.cluster.members import Cluster
from node.config import NodeConfig
from node.cluster.controller import NodeReplication
from node.errors import ConfigError
from node.http.limits import ConnectionGuard, GuardedSite, install_accept_handler
from node.daemon.jobs import Jobs
from node.daemon.metrics import Metrics
from rowstore.db.database import Database, TablesConfig
from rowstore.db.background.gc import GcConfig
from rowstore.db.partition import segment_states
from rowstore.segments.position import REP_PREFIX, ReplicaRecord
from terrafs.active import ActiveConfig
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import FileStateError, TerrafsError
from terrafs.failpoints import skewed_wall_clock
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.records import FileState, FileTier
from terrafs.uri import open_block_device, open_catalog, open_object_store

log = logging.getLogger("terrascale.node")
CATCH_UP_BYTES = 4 << 20  # a follower further behind than one catch-up message is under-replicated


class Node:
    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.ready = False
        self.stopping = False
        self.started = time.time()
        self.incarnation = secrets.token_hex(8)  # this process, as other nodes tell it from a restart
        self.fs: TerrascaleFS | None = None
        self.db: Database | None = None
        self.catalog = None
        self.jobs: Jobs | None = None
        self.cluster: Cluster | None = None
        self.replication: NodeReplication | None = None
        self.metrics = Metrics()
        self.guard = ConnectionGuard(cfg.handshake_timeout_s, cfg.max_pending_connections, self.refused("http"))
        self._raft_refused: dict[str, int] = {}
        self._stack = contextlib.AsyncExitStack()

    def refused(self, port: str):
        return lambda reason: self.metrics.refused.labels(port, reason).inc()

    @property
    def http_url(self) -> str:
        scheme = "https" if self.cfg.tls_cert else "http"
        host, port = self.cfg.listen
        return f"{scheme}://{self.cfg.advertise or f'{host}:{port}'}"

    async def open(self) -> None:
        """Open every store (failing fast with the config key at fault) and recover."""
        c = self.cfg
        kek = KeyEncryptionKey.load(c.encryption_key_file) if c.encryption_key_file else None
        block = _configured("storage.block", lambda: open_block_device(c.block, durable=True))
        volatile = _configured("storage.volatile", lambda: open_block_device(c.volatile, durable=False))
        objects = _configured("storage.objects", lambda: open_object_store(c.objects))
        await _reachable("storage.objects", objects.open_store())
        self._stack.push_async_callback(objects.close)
        limits = ConnLimits(c.handshake_timeout_s, c.max_pending_connections)
        self.catalog = _configured("catalog.uri", lambda: open_catalog(
            c.catalog, secret_file=c.catalog_secret_file, dir=c.catalog_dir, limits=limits))
        await _reachable("catalog.uri", self.catalog.open())
        self._stack.push_async_callback(self.catalog.close)
        fs_cfg = FsConfig(node_id=c.node_id, flush=ActiveConfig(c.flush_bytes, c.flush_ms))
        self.fs = TerrascaleFS(self.catalog, block, volatile, objects, kek=kek, config=fs_cfg)
        t0 = time.perf_counter()
        report = await self.fs.open()
        self._stack.push_async_callback(self.fs.close)
        log.info("event=files_recovered node=%s reopened=%d recreated=%d rolled_back=%d local_deleted=%d",
                 c.node_id, len(report.reopened), len(report.recreated), len(report.rolled_back),
                 len(report.local_deleted))
        raft = self.catalog.self_addr if c.catalog.startswith("raft://") else None
        self.cluster = Cluster(self.catalog, c.node_id, self.http_url, raft, token=c.token,
                               incarnation=self.incarnation)
        self._stack.push_async_callback(self.cluster.close)
        self.db = Database(self.fs, TablesConfig(partitions=c.partitions, seal_bytes=c.seal_bytes,
                                                 memtable_bytes=c.memtable_bytes,
                                                 retention_ms=int(c.retention_s * 1000),
                                                 purge_lag_ms=int(c.purge_lag_s * 1000),
                                                 gc=GcConfig(c.gc_min_garbage, c.gc_grace_s, c.gc_max_bytes_per_run),
                                                 ack_timeout_s=c.ack_timeout_s,
                                                 replica_lease_s=c.failure_timeout_s / 2),
                           now_ms=skewed_wall_clock(), coordinator_gone=self.cluster.gone,
                           lost=frozenset(report.recreated) | frozenset(report.missing))
        self.cluster.on_change = self.db.forget_cached_definitions
        self.cluster.leading = lambda tid, pid: self.db.leadership.shipper(tid, pid) is not None
        await self._check_missing(set(report.missing))
        await self._open_db()
        self._stack.push_async_callback(self._close_db)
        log.info("event=recovered node=%s tables=%d seconds=%.3f", c.node_id,
                 len(await self.db.list_tables()), time.perf_counter() - t0)
        await self.cluster.register()
        self.replication = NodeReplication(self)
        self.replication.start()
        self._stack.push_async_callback(self.replication.stop)
        self.jobs = Jobs(self.db, self.metrics, c)
        self.jobs.start()
        self._stack.push_async_callback(self.jobs.stop)
        # Everything built so far (libraries, compiled kernels, recovered tables) lives as long
        # as the process: out of the collector's generations, a full collection walks only
        # what serving allocates (gen-2 pauses of ~50 ms otherwise; +14% ingest in-process).
        gc.freeze()
        self.ready = True
        self.metrics.ready.set(1)

    async def _check_missing(self, missing: set[int]) -> None:
        """Sealed local files gone (a lost block device) are fatal, unless each is this node's
        copy of a replicated partition's segment: the partition's other replicas hold its
        bytes, and this node starts its copies over from the leader (RFC 0010 §5)."""
        if not missing:
            return
        covered = {r.inode for r in await self.db.store.list(owner=self.cfg.node_id) if r.epoch > 0}
        for e in await self.catalog.scan(REP_PREFIX):  # copies this node holds as a follower
            if e.key.endswith("/" + self.cfg.node_id):
                covered |= {inode for _, inode in ReplicaRecord.from_bytes(e.value, e.key).segs.values()}
        fatal = sorted(missing - covered)
        if fatal:
            raise FileStateError(f"sealed local files of inodes {fatal[:10]} are missing from the block device "
                                 "and no other node holds a copy")
        log.warning("event=copies_lost node=%s inodes=%d: rebuilt from the partitions' leaders", self.cfg.node_id,
                    len(missing))

    async def _open_db(self) -> None:
        """Recover the partitions this node serves, and only those (RFC 0010).

        Other partitions have their write-ahead on other nodes' block devices, so they
        cannot be replayed here; ``Database.open`` takes the placement as a filter, and keeps
        it for tables opened later."""
        await self.db.open(owns=self.cluster.owns if self.cluster.multi else None)

    async def _close_db(self) -> None:
        try:
            out = await self.db.checkpoint(force=True)
            log.info("event=shutdown_checkpoint node=%s checkpointed=%s merged=%s", self.cfg.node_id,
                     out.get("checkpointed"), out.get("merged"))
        except Exception as e:  # noqa: BLE001 - the write-ahead log has it all; the next start replays it
            log.warning("event=shutdown_checkpoint_failed node=%s error=%r", self.cfg.node_id, e)
        await self.db.close()

    async def close(self) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        await self._stack.aclose()

    # -- views for the API -----------------------------------------------------------------------

    async def render_metrics(self) -> tuple[bytes, str]:
        m = self.metrics
        m.pending.labels("http").set(len(self.guard.pending))
        self._raft_metrics()
        if self.fs is not None and self.ready:
            counts = {(s, t): 0 for s in FileState for t in FileTier}
            for r in await self.fs.list(owner=self.cfg.node_id):
                counts[(r.state, r.tier)] += 1
            for (s, t), n in counts.items():
                m.files.labels(s.value, t.value).set(n)
            m.cache_ratio.set(self.fs.cache.hit_ratio())
            for k, v in self.fs.cache.stats.items():
                m.cache_events.labels(k).set(v)
            for state, n in segment_states([r for _, r in await self.db.segment_records()]).items():
                m.segments.labels(state).set(n)
            stats = self.db.flush_stats()
            m.flushes.set(sum(s["flushes"] for s in stats))
            m.flushed_bytes.set(sum(s["flushed_bytes"] for s in stats))
            m.flush_appends.set(sum(s["appends"] for s in stats))
            m.flush_seconds.set(sum(s.get("flush_s", 0.0) for s in stats))
            m.flush_wait_seconds.set(sum(s.get("wait_s", 0.0) for s in stats))
            if self.fs.block.fdatasyncs() is not None:
                m.device_syncs.set(self.fs.block.fdatasyncs())
            if self.fs.block.rounds() is not None:
                hops, groups = self.fs.block.rounds()
                m.device_rounds.set(hops)
                m.device_round_groups.set(groups)
            m.memtable_bytes.set(self.db.memtable_bytes())
            m.closed_ts.set(self.db.closed_ts)
            m.txn_held.set(self.db.participant.held)
            await self._placement_metrics()
            tot = self.db.gc.totals
            m.gc_runs.set(tot["runs"])
            m.gc_rows_copied.set(tot["rows_copied"])
            m.gc_bytes_reclaimed.set(tot["bytes_reclaimed"])
            m.gc_seconds.set(tot["run_seconds"])
            m.gc_deleted.set(tot["segments_deleted"])
            m.gc_garbage_ratio.set(await self.db.gc.garbage_ratio())
        return generate_latest(m.registry), CONTENT_TYPE_LATEST

    async def _placement_metrics(self) -> None:
        """Partitions led here and their epochs, and each follower's lag (a dropped table's
        series go away)."""
        m = self.metrics
        m.partitions_led.clear()
        m.partition_epoch.clear()
        m.replica_lag_bytes.clear()
        m.replica_lag_seconds.clear()
        names = self.db.tables.names()
        under = 0
        for (tid, pid), sh in self.db.leadership.led().items():
            st, behind = sh.status(), False
            for node, f in st["followers"].items():
                lag = -1 if f["lag_bytes"] is None else f["lag_bytes"]
                m.replica_lag_bytes.labels(names.get(tid, tid), str(pid), node).set(lag)
                m.replica_lag_seconds.labels(names.get(tid, tid), str(pid), node).set(
                    f["ack_age_s"] if f["ack_age_s"] is not None else -1)
                behind |= lag < 0 or lag > CATCH_UP_BYTES
            under += behind
        m.under_replicated.set(under)
        if self.replication is not None:
            for outcome, n in self.replication.elections.items():
                m.elections.labels(outcome).set(n)
        for d in await self.db.list_tables():
            pl = await self.cluster.placement(d.name, d.partitions)
            led = pl.led_by(self.cfg.node_id)
            m.partitions_led.labels(d.name).set(len(led))
            for p in sorted(led):
                m.partition_epoch.labels(d.name, str(p)).set(pl.partitions[p].epoch)

    def _raft_metrics(self) -> None:
        """The Raft port's refusals, counted on the replica's thread, into the node's counters."""
        stats = getattr(self.catalog, "connection_stats", None)
        if stats is None:
            return
        st = stats()
        self.metrics.raft_write_retries.set(st.pop("write_retries", 0))
        for reason, n in st.items():
            delta = n - self._raft_refused.get(reason, 0)
            if delta > 0:
                self.metrics.refused.labels("raft", reason).inc(delta)
                self._raft_refused[reason] = n

    async def status(self) -> dict:
        recs = [r for _, r in await self.db.segment_records()] if self.ready else []
        tables = await self.db.list_tables() if self.ready else []
        owned = 0
        for d in tables:
            owned += len((await self.cluster.placement(d.name, d.partitions)).led_by(self.cfg.node_id))
        cs = await self._catalog_status()
        return {
            "node_id": self.cfg.node_id, "address": self.http_url, "ready": self.ready,
            "version": version("terrascale"),
            "uptime_s": round(time.time() - self.started, 3), "role": cs["role"],
            "partitions_owned": owned, "tables": len(tables), "segments": segment_states(recs),
            "closed_ts": self.db.closed_ts if self.db else None,
            "history_horizon": self.db.horizon() if self.db else None,
            "catalog_leader": cs["leader"], "catalog_revision": await self.catalog.revision(),
            "memtable_bytes": self.db.memtable_bytes() if self.db else 0,
            "jobs": {name: {"every_s": every, "last": (self.jobs.last.get(name) if self.jobs else None)}
                     for name, every in (self.jobs.schedule.items() if self.jobs else ())},
            "replication": self._replication_status(),
        }

    def _replication_status(self) -> dict | None:
        """Replicated partitions led here (epoch, lease, each follower's position and lag),
        the driver's view (dead nodes) and the elections run (RFC 0010 §5)."""
        if self.replication is None or not self.replication.enabled:
            return None
        names = self.db.tables.names()
        st = self.replication.status()
        st["led"] = {f"{names.get(k.split('/')[0], k.split('/')[0])}/{k.split('/')[1]}": v
                     for k, v in st["led"].items()}
        return st

    async def _catalog_status(self) -> dict:
        """role / leader / term of the catalog, leader as a node id where it is known."""
        if self.cluster is None or not self.cluster.multi:
            return {"role": "single", "leader": self.cfg.node_id, "term": 1, "members": None}
        st = await self.catalog.cluster_status()
        by_raft = {m.get("raft"): nid for nid, m in (await self.cluster.members()).items()}
        return {"role": st["role"], "leader": by_raft.get(st["leader"], st["leader"]), "term": st["term"],
                "members": st["members"], "by_raft": by_raft, "has_quorum": st.get("has_quorum")}

    async def cluster_view(self) -> dict:
        cs = await self._catalog_status()
        members = await self.cluster.members()
        tables = await self.db.list_tables() if self.ready else []
        parts = await self.cluster.partitions(tables)
        placement = {d.name: (await self.cluster.placement(d.name, d.partitions)).json() for d in tables}
        if cs["members"] is None:
            out = [{"id": self.cfg.node_id, "address": self.http_url, "alive": self.ready}]
        else:
            out = []
            for m in cs["members"]:
                nid = cs["by_raft"].get(m["address"])
                out.append({"id": nid or m["address"], "address": members.get(nid, {}).get("http"),
                            "raft_address": m["address"], "alive": bool(m["alive"]), "self": bool(m["self"])})
        return {"members": out, "leader": cs["leader"], "term": cs["term"], "partitions": parts,
                "placement": placement,
                "catalog": "raft" if cs["members"] is not None else "trkv"}

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.cfg.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(f"security.tls_cert: cannot load the certificate and key: {e}") from None
        return ctx


def _configured(key: str, make):
    try:
        return make()
    except (TerrafsError, CatalogError) as e:
        raise ConfigError(f"{key}: {e}") from None


async def _reachable(key: str, opening) -> None:
    try:
        await opening
    except (TerrafsError, CatalogError, OSError) as e:
        raise ConfigError(f"{key}: store is unreachable: {e}") from None


async def _watchdog(every: float) -> None:
    while True:
        await asyncio.sleep(every)
        sdnotify.notify("WATCHDOG=1")


async def run(cfg: NodeConfig) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting, finish requests and close cleanly."""
    node = Node(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ctx = node.ssl_context()
    runner = web.AppRunner(make_app(node), access_log=None, shutdown_timeout=cfg.shutdown_timeout_s,
                           handle_signals=False)
    await runner.setup()
    host, port = cfg.listen
    install_accept_handler(loop, node.refused("http"), node.guard)
    site = GuardedSite(runner, host, port, guard=node.guard, ssl_context=ctx, backlog=1024)
    dog = None
    try:
        try:
            await site.start()  # /healthz answers and /readyz says 503 while recovering
        except OSError as e:
            raise ConfigError(f"node.listen: cannot listen on {host}:{port}: {e.strerror}") from None
        log.info("event=listening node=%s address=%s", cfg.node_id, node.http_url)
        opening = asyncio.ensure_future(node.open())
        await asyncio.wait([opening, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if not opening.done():  # stopped while recovering
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
        else:
            opening.result()
            log.info("event=ready node=%s address=%s", cfg.node_id, node.http_url)
            sdnotify.notify(f"READY=1\nSTATUS=serving on {node.http_url}")
            every = sdnotify.watchdog_interval()
            dog = asyncio.ensure_future(_watchdog(every)) if every else None
            await stop.wait()
        log.info("event=stopping node=%s", cfg.node_id)
    finally:
        node.stopping = True
        node.ready = False
        sdnotify.notify("STOPPING=1")
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(_shutdown(runner, node), cfg.shutdown_timeout_s + 5)
        except asyncio.TimeoutError:
            log.error("event=shutdown_timeout node=%s seconds=%.0f", cfg.node_id, cfg.shutdown_timeout_s)
            raise
        finally:
            if dog is not None:
                dog.cancel()
        log.info("event=stopped node=%s seconds=%.3f", cfg.node_id, time.perf_counter() - t0)


async def _shutdown(runner: web.AppRunner, node: Node) -> None:
    await runner.cleanup()  # stop accepting, let in-flight requests finish (shutdown_timeout)
    await node.close()
