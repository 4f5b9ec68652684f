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
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from catalog.errors import CatalogError
from catalog.raft import RaftCatalog
from catalog.raft.wire import ConnLimits
from node.daemon import sdnotify
from node.http.api import Api
from node.http.app import make_app
from node.cluster.members import Cluster
from node.config import NodeConfig
from node.cluster.controller import NodeReplication
from node.cluster.serving import Serving
from node.daemon.views import Views
from node.phase import Readiness
from node.errors import ConfigError
from node.http.limits import ConnectionGuard, GuardedSite, install_accept_handler
from node.daemon.jobs import Jobs
from node.metrics import Metrics
from rowstore.db.database import Database, TablesConfig
from rowstore.db.background.gc import GcConfig
from rowstore.segments.position import REP_PREFIX, ReplicaRecord
from terrafs.active import ActiveConfig
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import FileStateError, TerrafsError
from terrafs.failpoints import skewed_wall_clock
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.uri import open_block_device, open_catalog, open_object_store

log = logging.getLogger("terrascale.node")
T = TypeVar("T")


class Node:
    """The composition root: it makes every part, each given what it uses, and unwinds them in
    reverse. The HTTP surface and cluster control get narrow parts (``Serving``, the views, the
    job runner), never this object."""

    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.readiness = Readiness()
        self.incarnation = secrets.token_hex(8)  # this process, as other nodes tell it from a restart
        self.metrics = Metrics()
        self.guard = ConnectionGuard(cfg.handshake_timeout_s, cfg.max_pending_connections, self.refused("http"))
        self.views = Views(cfg, self.readiness, self.metrics, self.guard, self.http_url)
        self.api = Api(cfg, self.readiness, self.metrics, self.guard, self.incarnation, self.views)
        self.db: Database | None = None  # the engine, once open (tests and the in-process bench read it)
        self._stack = contextlib.AsyncExitStack()

    def refused(self, port: str) -> Callable[[str], None]:
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
        catalog = _configured("catalog.uri", lambda: open_catalog(
            c.catalog, secret_file=c.catalog_secret_file, dir=c.catalog_dir, limits=limits))
        await _reachable("catalog.uri", catalog.open())
        self._stack.push_async_callback(catalog.close)
        fs_cfg = FsConfig(node_id=c.node_id, flush=ActiveConfig(c.flush_bytes, c.flush_ms))
        fs = TerrascaleFS(catalog, block, volatile, objects, kek=kek, config=fs_cfg)
        t0 = time.perf_counter()
        report = await fs.open()
        self._stack.push_async_callback(fs.close)
        log.info("event=files_recovered node=%s reopened=%d recreated=%d rolled_back=%d local_deleted=%d",
                 c.node_id, len(report.reopened), len(report.recreated), len(report.rolled_back),
                 len(report.local_deleted))
        raft = catalog.self_addr if c.catalog.startswith("raft://") and isinstance(catalog, RaftCatalog) else None
        cluster = Cluster(catalog, c.node_id, self.http_url, raft, token=c.token, incarnation=self.incarnation)
        self._stack.push_async_callback(cluster.close)
        db = self.db = Database(fs, TablesConfig(partitions=c.partitions, seal_bytes=c.seal_bytes, columnar=c.columnar,
                                                 memtable_bytes=c.memtable_bytes,
                                                 column_cache_bytes=c.column_cache_bytes,
                                                 retention_ms=int(c.retention_s * 1000),
                                                 purge_lag_ms=int(c.purge_lag_s * 1000),
                                                 gc=GcConfig(c.gc_min_garbage, c.gc_grace_s, c.gc_max_bytes_per_run),
                                                 ack_timeout_s=c.ack_timeout_s,
                                                 replica_lease_s=c.failure_timeout_s / 2,
                                                 progress_every_s=c.subscription_progress_s,
                                                 subscriber_bytes=c.subscription_buffer_bytes),
                                now_ms=skewed_wall_clock(), coordinator_gone=cluster.gone,
                                lost=frozenset(report.recreated) | frozenset(report.missing))
        cluster.open(db.forget_cached_definitions, lambda tid, pid: db.leadership.shipper(tid, pid) is not None)
        sv = Serving(c, catalog, db, cluster)
        await self._check_missing(sv, set(report.missing))
        await self._open_db(sv)
        self._stack.push_async_callback(self._close_db, db)
        log.info("event=recovered node=%s tables=%d seconds=%.3f", c.node_id,
                 len(await db.list_tables()), time.perf_counter() - t0)
        await cluster.register()
        replication = NodeReplication(sv)
        replication.start()
        self._stack.push_async_callback(replication.stop)
        jobs = Jobs(db, self.metrics, c)
        jobs.start()
        self._stack.push_async_callback(jobs.stop)
        self.views.open(fs, sv, jobs, replication)
        self.api.open(sv, replication, jobs)
        # Everything built so far (libraries, compiled kernels, recovered tables) lives as long
        # as the process: out of the collector's generations, a full collection walks only
        # what serving allocates (gen-2 pauses of ~50 ms otherwise; +14% ingest in-process).
        gc.freeze()
        self.readiness.serve()
        self.metrics.ready.set(1)

    async def _check_missing(self, sv: Serving, missing: set[int]) -> None:
        """Sealed local files gone (a lost block device) are fatal, unless each is this node's
        copy of a replicated partition's segment: the partition's other replicas hold its
        bytes, and this node starts its copies over from the leader (RFC 0010 §5)."""
        if not missing:
            return
        covered = {r.inode for r in await sv.db.store.list(owner=self.cfg.node_id) if r.epoch > 0}
        for e in await sv.catalog.scan(REP_PREFIX):  # copies this node holds as a follower
            if e.key.endswith("/" + self.cfg.node_id):
                covered |= {inode for _, inode in ReplicaRecord.from_bytes(e.value, e.key).segs.values()}
        fatal = sorted(missing - covered)
        if fatal:
            raise FileStateError(f"sealed local files of inodes {fatal[:10]} are missing from the block device "
                                 "and no other node holds a copy")
        log.warning("event=copies_lost node=%s inodes=%d: rebuilt from the partitions' leaders", self.cfg.node_id,
                    len(missing))

    async def _open_db(self, sv: Serving) -> None:
        """Recover the partitions this node serves, and only those (RFC 0010).

        Other partitions have their write-ahead on other nodes' block devices, so they
        cannot be replayed here; ``Database.open`` takes the placement as a filter, and keeps
        it for tables opened later."""
        await sv.db.open(owns=sv.cluster.owns if sv.cluster.multi else None)

    async def _close_db(self, db: Database) -> None:
        try:
            out = await db.checkpoint(force=True)
            log.info("event=shutdown_checkpoint node=%s checkpointed=%s merged=%s", self.cfg.node_id,
                     out.get("checkpointed"), out.get("merged"))
        except Exception as e:  # noqa: BLE001 - the write-ahead log has it all; the next start replays it
            log.warning("event=shutdown_checkpoint_failed node=%s error=%r", self.cfg.node_id, e)
        await db.close()

    async def close(self) -> None:
        self.readiness.stop()
        self.metrics.ready.set(0)
        await self._stack.aclose()

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.cfg.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(f"security.tls_cert: cannot load the certificate and key: {e}") from None
        return ctx


def _configured(key: str, make: Callable[[], T]) -> T:
    try:
        return make()
    except (TerrafsError, CatalogError) as e:
        raise ConfigError(f"{key}: {e}") from None


async def _reachable(key: str, opening: Awaitable[None]) -> None:
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
    runner = web.AppRunner(make_app(node.api), access_log=None, shutdown_timeout=cfg.shutdown_timeout_s,
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
        node.readiness.stop()
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
