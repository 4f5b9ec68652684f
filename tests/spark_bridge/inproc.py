"""A real node served from this process: the daemon's ``Node`` and ``Api`` on their own
event loop in a thread, configured from the same TOML a ``NodeProc`` writes. Tests use it
when they must call the running node's engine directly (the simulated garbage collector);
everything else reaches it over HTTP like any node."""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from bench.node_proc import NodeProc
from node.http.app import make_app
from node.config import load
from node.daemon.lifecycle import Node


class InProcessNode:
    def __init__(self, root, extra: str = "", objects: str | None = None):
        self.files = NodeProc(root, extra=extra)  # its config file, port and client()
        if objects is not None:
            text = self.files.config.read_text()
            self.files.config.write_text(text.replace(f'objects = "trfs://{self.files.data}/objects"',
                                                      f'objects = "{objects}"'))
        self.base = self.files.base
        self.node: Node | None = None
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def client(self, **kw):
        return self.files.client(**kw)

    @property
    def db(self):
        return self.node.db

    def start(self) -> "InProcessNode":
        ready, failed = threading.Event(), []
        self._thread = threading.Thread(target=self._run, args=(ready, failed), name="inproc-node", daemon=True)
        self._thread.start()
        if not ready.wait(60) or failed:
            raise AssertionError(f"the in-process node did not start: {failed}")
        return self

    def _run(self, ready: threading.Event, failed: list) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(ready))
        except BaseException as e:  # noqa: BLE001 - reported to start()
            failed.append(e)
            ready.set()
        finally:  # as asyncio.run does: cancel what is left, then close the generators
            left = asyncio.all_tasks(self._loop)
            for t in left:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())

    async def _serve(self, ready: threading.Event) -> None:
        cfg = load(str(self.files.config))
        self.node = Node(cfg)
        runner = web.AppRunner(make_app(self.node.api), access_log=None)
        await runner.setup()
        host, port = cfg.listen
        await web.TCPSite(runner, host, port).start()
        try:
            await self.node.open()
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await self.node.close()

    def call(self, coro, timeout: float = 60):
        """Run ``coro`` on the node's event loop (where its engine lives) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        self._loop.close()
