"""The local durable catalog, ``trkv://DIR``: a checksummed, fsync'd log plus snapshots.

Format and recovery rules: docs/format/catalog-log.md. Transactions are group
committed; the new state becomes visible, and callers return, only after the
group's records are fdatasync'd. One process may open a directory (flock).
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from typing import Sequence

from catalog.abc import Check, Op, Put, TxnResult
from catalog.errors import CatalogConfigError, CatalogCorruptionError, CatalogUnavailableError
from catalog.fsutil import fsync_dir, lock_dir
from catalog.logfile import (
    BadRecord,
    LogRecord,
    decode_log_header,
    decode_record,
    encode_log_header,
    encode_record,
    find_valid_record_after,
)
from catalog.memory import StateReads
from catalog.state import CatalogState, validate_txn

log = logging.getLogger("catalog.local")
_SNAP = re.compile(r"^snap-([0-9a-f]{16})\.trkv$")
_LOG = re.compile(r"^log-([0-9a-f]{16})\.trkv$")


@dataclass
class _Pending:
    checks: tuple[Check, ...]
    ops: tuple[Op, ...]
    request_id: str | None
    fut: asyncio.Future[TxnResult]


class LocalCatalog(StateReads):
    def __init__(self, path: str, *, snapshot_bytes: int = 4 << 20, uri: str | None = None,
                 read_only: bool = False):
        self.path = os.path.abspath(path)
        self.read_only = read_only  # fsck: report a torn tail, write nothing
        self.uri = uri or f"trkv://{self.path}"
        self.snapshot_bytes = snapshot_bytes
        self.state = CatalogState()
        self._lock_fd = -1
        self._log_fd = -1
        self._log_name = ""
        self._log_size = 0
        self._queue: list[_Pending] = []
        self._inflight: dict[str, asyncio.Future[TxnResult]] = {}
        self._committer: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self.torn_tail: tuple[str, int] | None = None

    @classmethod
    def from_uri(cls, uri: str) -> "LocalCatalog":
        from urllib.parse import urlsplit

        parts = urlsplit(uri)
        if parts.scheme != "trkv" or parts.query:
            raise CatalogConfigError(f"{uri}: expected trkv:///abs/dir or trkv://./rel/dir")
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path:
            raise CatalogConfigError(f"{uri}: no directory")
        return cls(path, uri=uri)

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        if self._lock_fd >= 0:
            return
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        if self.read_only and not os.path.isdir(self.path):
            raise CatalogUnavailableError(f"{self.uri}: no catalog directory")
        fd = lock_dir(self.path, f"{self.uri} is open in another process (LOCK is held)")
        try:
            self._recover()
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    async def close(self) -> None:
        while self._committer is not None and not self._committer.done():
            await asyncio.shield(self._committer)
        for fd in (self._log_fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)  # closing releases the flock
        self._log_fd = self._lock_fd = -1

    def _st(self) -> CatalogState:
        if self._lock_fd < 0:
            raise CatalogUnavailableError(f"{self.uri} is not open")
        if self._failed is not None:
            raise CatalogUnavailableError(f"{self.uri}: a log write failed: {self._failed}")
        return self.state

    # -- recovery --------------------------------------------------------------------

    def _recover(self) -> None:
        names = sorted(os.listdir(self.path))
        for n in names:
            if n.endswith(".tmp") and not self.read_only:
                os.unlink(os.path.join(self.path, n))
        snaps = [n for n in names if _SNAP.match(n)]
        logs = [n for n in names if _LOG.match(n)]
        if snaps:
            where = os.path.join(self.path, snaps[-1])
            with open(where, "rb") as f:
                self.state = CatalogState.restore(f.read(), where)
        for i, name in enumerate(logs):
            self._replay(name, last=i == len(logs) - 1)
        if self.read_only:
            return
        if logs:
            self._open_log(logs[-1])
        else:
            self._new_log(self.state.revision)

    def _replay(self, name: str, last: bool) -> None:
        where = os.path.join(self.path, name)
        with open(where, "rb") as f:
            buf = f.read()
        decode_log_header(buf, where)
        pos = 22
        while pos < len(buf):
            try:
                rec, nxt = decode_record(buf, pos)
            except BadRecord as e:
                if not last or find_valid_record_after(buf, pos) is not None:
                    raise CatalogCorruptionError(where, e.offset, e.reason) from None
                log.warning("event=catalog_torn_tail file=%s offset=%d dropped_bytes=%d reason=%r",
                            where, pos, len(buf) - pos, e.reason)
                self.torn_tail = (where, pos)
                if self.read_only:
                    return
                with open(where, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
                return
            self._apply_record(rec, where, pos)
            pos = nxt

    def _apply_record(self, rec: LogRecord, where: str, pos: int) -> None:
        if rec.revision <= self.state.revision:
            return  # already in the snapshot (kept across a crash while snapshotting)
        if rec.revision != self.state.revision + 1:
            raise CatalogCorruptionError(where, pos, f"revision {rec.revision} follows "
                                         f"{self.state.revision}: the log has a gap")
        self.state.write(rec.ops, rec.revision)
        self.state.remember(TxnResult(True, rec.revision, (), rec.request_id))

    def _open_log(self, name: str) -> None:
        self._log_name = name
        self._log_fd = os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_APPEND)
        self._log_size = os.fstat(self._log_fd).st_size

    def _new_log(self, base: int) -> None:
        name = f"log-{base:016x}.trkv"
        path = os.path.join(self.path, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        os.write(fd, encode_log_header(base))
        os.fsync(fd)
        fsync_dir(self.path)
        if self._log_fd >= 0:
            os.close(self._log_fd)
        self._log_fd, self._log_name, self._log_size = fd, name, os.fstat(fd).st_size

    # -- writes: group commit ---------------------------------------------------------

    async def txn(self, checks: Sequence[Check] = (), ops: Sequence[Op] = (), *,
                  request_id: str | None = None) -> TxnResult:
        st = self._st()
        if self.read_only:
            raise CatalogUnavailableError(f"{self.uri} is open read-only")
        validate_txn(checks, ops, request_id)
        if request_id is not None:
            known = st.outcome(request_id)
            if known is not None:
                return known
            if request_id in self._inflight:
                return await asyncio.shield(self._inflight[request_id])
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(tuple(checks), tuple(ops), request_id, fut))
        if request_id is not None:
            self._inflight[request_id] = fut
        if self._committer is None or self._committer.done():
            self._committer = asyncio.ensure_future(self._commit_loop())
        return await asyncio.shield(fut)

    async def _commit_loop(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await self._commit_group(batch)
            except BaseException as e:  # noqa: BLE001 - the log can no longer be trusted: refuse writes
                self._failed = e
                for p in batch + self._queue:
                    if not p.fut.done():
                        p.fut.set_exception(CatalogUnavailableError(f"{self.uri}: log write failed: {e}"))
                self._queue = []
                return
            finally:
                for p in batch:
                    if p.request_id is not None:
                        self._inflight.pop(p.request_id, None)

    async def _commit_group(self, batch: list[_Pending]) -> None:
        """Evaluate in order against state + earlier effects, write, fsync, then publish."""
        st, rev = self.state, self.state.revision
        overlay: dict[str, int] = {}
        results: list[TxnResult] = []
        records: list[LogRecord] = []
        for p in batch:
            bad = st.conflicts(p.checks, overlay)
            if bad:
                results.append(TxnResult(False, rev, bad, p.request_id))
                continue
            rev += 1
            for op in p.ops:
                overlay[op.key] = rev if isinstance(op, Put) else 0
            records.append(LogRecord(rev, p.request_id, p.ops))
            results.append(TxnResult(True, rev, (), p.request_id))
        if records:
            data = b"".join(encode_record(r) for r in records)
            await asyncio.to_thread(self._append_sync, data)
        for r in records:
            st.write(r.ops, r.revision)
        for p, res in zip(batch, results):
            st.remember(res)
            if not p.fut.done():
                p.fut.set_result(res)
        if self._log_size > self.snapshot_bytes:
            await self._snapshot()

    def _append_sync(self, data: bytes) -> None:
        os.write(self._log_fd, data)
        os.fdatasync(self._log_fd)
        self._log_size += len(data)

    async def _snapshot(self) -> None:
        """Snapshot, start a new log, delete older files (each step crash-safe)."""
        raw = self.state.snapshot()  # only the committer mutates state; we are it
        rev = self.state.revision
        await asyncio.to_thread(self._snapshot_sync, raw, rev)

    def _snapshot_sync(self, raw: bytes, rev: int) -> None:
        name = f"snap-{rev:016x}.trkv"
        tmp = os.path.join(self.path, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, name))
        fsync_dir(self.path)
        self._new_log(rev)
        for n in os.listdir(self.path):  # every other file holds only revisions <= rev
            if (_SNAP.match(n) and n != name) or (_LOG.match(n) and n != self._log_name):
                os.unlink(os.path.join(self.path, n))
        fsync_dir(self.path)
        log.info("event=catalog_snapshot revision=%d bytes=%d", rev, len(raw))

