"""Background jobs, each on its own schedule, each also runnable now from the admin API.

- checkpoint: checkpoint the largest memtables while over the budget, then merges;
  every ``jobs.checkpoint_every`` (and at once when the budget is crossed).
- offload: rewrite sealed segments as objects, drop the local copies; every ``jobs.offload_every``.
- seal: seal every partition's current segment (rollover at ``seal_bytes`` is inline in the
  engine); every ``jobs.seal_every``, off by default.
- gc: one garbage-collection pass (docs/rfcs/0009-gc.md); every ``gc.interval`` (60s; 0s: off).

The jobs are ``rowstore.db.database.Database`` methods.
The group-commit flush timer (``segments.flush_ms``) lives in the write path
itself (``terrafs/active.py``), not here. A job never runs twice at once: the
admin API's "run now" waits for a scheduled run in progress and then runs.
Every run is timed (``terrascale_job_seconds``) and counted by outcome.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from node.config import NodeConfig
from node.metrics import Metrics
from node.tasks import cancel_all
from rowstore.db.database import Database

log = logging.getLogger("terrascale.node")
BUDGET_POLL_S = 0.2
SPACE_EVERY_S = 1.0  # how often a node whose block device filled up looks for space again


class Jobs:
    def __init__(self, db: Database, metrics: Metrics, cfg: NodeConfig):
        self.db, self.m = db, metrics
        self.schedule = {"checkpoint": cfg.checkpoint_every_s, "offload": cfg.offload_every_s,
                         "seal": cfg.seal_every_s, "gc": cfg.gc_interval_s}
        self._locks = {name: asyncio.Lock() for name in self.schedule}
        self._tasks: list[asyncio.Task[None]] = []
        self.last: dict[str, dict[str, Any]] = {}

    async def run(self, name: str, trigger: str = "admin", **kw: Any) -> dict[str, Any]:
        """Run job ``name`` now; returns what it did (the engine's report)."""
        jobs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
            "checkpoint": lambda: self.db.checkpoint(force=trigger == "admin"), "offload": self.db.offload,
            "seal": self.db.seal, "gc": lambda: self.db.collect_garbage(**kw)}
        work = jobs[name]
        async with self._locks[name]:
            t0 = time.perf_counter()
            try:
                out = await work()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.m.job_runs.labels(name, trigger, "error").inc()
                raise
            took = time.perf_counter() - t0
            self.m.job_seconds.labels(name).observe(took)
            self.m.job_runs.labels(name, trigger, "ok").inc()
        if any(v for k, v in out.items() if k != "job") or trigger == "admin":
            log.info("event=job_done job=%s trigger=%s seconds=%.3f %s", name, trigger, took,
                     " ".join(f"{k}={_short(v)}" for k, v in out.items()))
        self.last[name] = {"at": time.time(), "seconds": round(took, 4), "result": out}
        return out

    def start(self) -> None:
        for name, every in self.schedule.items():
            if every > 0:
                self._tasks.append(asyncio.ensure_future(self._loop(name, every)))
        self._tasks.append(asyncio.ensure_future(self._space_loop()))

    async def _space_loop(self) -> None:
        """Writes resume by themselves after a full block device (``Database.resume_writes``)."""
        while True:
            await asyncio.sleep(SPACE_EVERY_S)
            try:
                out = await self.db.resume_writes()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - logged; tried again in a second
                log.warning("event=resume_writes_failed error=%r", e)
                continue
            if out.get("revived") or out.get("stepped_down"):
                log.warning("event=writes_resumed %s", " ".join(f"{k}={v}" for k, v in out.items()))

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    async def _loop(self, name: str, every: float) -> None:
        """Every ``every`` seconds; the checkpoint job also as soon as the memtable budget is crossed."""
        next_at = time.monotonic() + every
        while True:
            if name == "checkpoint":
                while time.monotonic() < next_at and self.db.memtable_bytes() <= self.db.cfg.memtable_bytes:
                    await asyncio.sleep(min(BUDGET_POLL_S, max(next_at - time.monotonic(), 0)))
            else:
                await asyncio.sleep(max(next_at - time.monotonic(), 0))
            next_at = time.monotonic() + every
            try:
                await self.run(name, "schedule")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - logged, counted, retried at the next tick
                log.warning("event=job_failed job=%s error=%r", name, e)


def _short(v: object) -> str:
    if isinstance(v, list):
        return str(len(v)) if len(v) > 8 else ",".join(map(str, v)) or "0"
    return str(v)
