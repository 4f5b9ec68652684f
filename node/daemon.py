"""The node daemon: open stores -> recover -> ready -> serve; unwind in reverse on stop.

aiohttp serves HTTP on the same event loop as the storage engine (see
docs/DEPENDENCIES.md for why aiohttp). Startup steps register their cleanup
on an AsyncExitStack, so shutdown closes exactly what was opened, in reverse
(aiohttp's web_runner pattern). This module is the daemon's spine; the data
API (contract §3) arrives with the row store and tables (issues 3-5).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from catalog.errors import CatalogError
from node.config import NodeConfig
from node.errors import ConfigError
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import TerrafsError
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.active import ActiveConfig
from terrafs.records import FileState, FileTier
from terrafs.uri import open_block_device, open_catalog, open_object_store

log = logging.getLogger("terrascale.node")
SHUTDOWN_TIMEOUT_S = 30


class Node:
    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.ready = False
        self.started = time.time()
        self.fs: TerrascaleFS | None = None
        self.catalog = None
        self._stack = contextlib.AsyncExitStack()
        self.registry = CollectorRegistry()
        self._files = Gauge("terrascale_files", "TerrascaleFS files by state and tier",
                            ["state", "tier"], registry=self.registry)
        self._cache_ratio = Gauge("terrascale_block_cache_hit_ratio", "Sealed-block cache hit ratio",
                                  registry=self.registry)

    async def open(self) -> None:
        """Open every store (failing fast with the config key at fault) and recover."""
        c = self.cfg
        kek = KeyEncryptionKey.load(c.encryption_key_file) if c.encryption_key_file else None
        block = _configured("storage.block", lambda: open_block_device(c.block, durable=True))
        volatile = _configured("storage.volatile", lambda: open_block_device(c.volatile, durable=False))
        objects = _configured("storage.objects", lambda: open_object_store(c.objects))
        await _reachable("storage.objects", objects.open_store())
        self._stack.push_async_callback(objects.close)
        self.catalog = _configured("catalog.uri", lambda: open_catalog(c.catalog))
        await _reachable("catalog.uri", self.catalog.open())
        self._stack.push_async_callback(self.catalog.close)
        fs_cfg = FsConfig(node_id=c.node_id, flush=ActiveConfig(c.flush_bytes, c.flush_ms))
        self.fs = TerrascaleFS(self.catalog, block, volatile, objects, kek=kek, config=fs_cfg)
        report = await self.fs.open()
        self._stack.push_async_callback(self.fs.close)
        log.info("event=recovered node=%s reopened=%d recreated=%d rolled_back=%d local_deleted=%d",
                 c.node_id, len(report.reopened), len(report.recreated), len(report.rolled_back),
                 len(report.local_deleted))
        self.ready = True

    async def close(self) -> None:
        self.ready = False
        await self._stack.aclose()

    # -- HTTP ----------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/admin/status", self.status)
        return app

    @web.middleware
    async def _errors(self, request, handler):
        """No traceback ever reaches a client: every error has the contract's shape."""
        try:
            return await handler(request)
        except web.HTTPException as e:
            code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
            return error(e.status, code, e.reason)
        except (TerrafsError, CatalogError) as e:
            log.warning("event=request_failed path=%s error=%r", request.path, e)
            return error(500, "storage_error", str(e))
        except Exception as e:  # the last line of defence
            log.exception("event=request_crashed path=%s", request.path)
            return error(500, "internal", type(e).__name__)

    def _authorized(self, request) -> bool:
        return self.cfg.token is None or request.headers.get("Authorization") == f"Bearer {self.cfg.token}"

    async def healthz(self, request):
        return web.json_response({"status": "ok"})

    async def readyz(self, request):
        if not self._authorized(request):
            return error(401, "unauthorized", "missing or wrong bearer token")
        if not self.ready:
            return error(503, "not_ready", "recovery has not finished")
        await self.catalog.revision()  # the catalog answers
        return web.json_response({"status": "ready"})

    async def metrics(self, request):
        if not self._authorized(request):
            return error(401, "unauthorized", "missing or wrong bearer token")
        if self.fs is not None:
            counts = {(s, t): 0 for s in FileState for t in FileTier}
            for r in await self.fs.list():
                counts[(r.state, r.tier)] += 1
            for (s, t), n in counts.items():
                self._files.labels(s.value, t.value).set(n)
            self._cache_ratio.set(self.fs.cache.hit_ratio())
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(self, request):
        if not self._authorized(request):
            return error(401, "unauthorized", "missing or wrong bearer token")
        files = await self.fs.list() if self.fs else []
        by_state: dict[str, int] = {}
        for r in files:
            by_state[f"{r.state.value}/{r.tier.value}"] = by_state.get(f"{r.state.value}/{r.tier.value}", 0) + 1
        return web.json_response({
            "node_id": self.cfg.node_id, "uptime_s": round(time.time() - self.started, 3),
            "role": "single", "ready": self.ready, "catalog_revision": await self.catalog.revision(),
            "files": by_state, "catalog_leader": self.cfg.node_id,
        })


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


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


async def run(cfg: NodeConfig) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting, finish requests and close cleanly."""
    node = Node(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(node.app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    host, port = cfg.listen
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()  # /healthz answers and /readyz says 503 while recovering
        log.info("event=listening node=%s address=http://%s:%d", cfg.node_id, host, port)
        await node.open()
        log.info("event=ready node=%s", cfg.node_id)
        await stop.wait()
        log.info("event=stopping node=%s", cfg.node_id)
    finally:
        await runner.cleanup()  # stop accepting, let in-flight requests finish
        await node.close()
        log.info("event=stopped node=%s", cfg.node_id)
