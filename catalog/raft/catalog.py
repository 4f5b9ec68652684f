"""The Raft-replicated catalog, ``raft://h:p,h:p,h:p?self=h:p`` (RFC 0005, docs/raft.md).

Transactions are Raft entries applied by every replica's ``CatalogState``.
Linearizable reads wait for a batched barrier entry submitted after they
began; ``catalog.stale`` reads the local replica. pysyncobj's callbacks
resolve asyncio futures (``call_soon_threadsafe``); nothing here blocks the
event loop except the state lock, held for one apply at a time.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import time
import uuid
from typing import Any, Callable, Mapping, Sequence, TypedDict, TypeVar, Unpack, cast

from pysyncobj import FAIL_REASON

from catalog.abc import Catalog, Check, Entry, Op, TxnResult
from catalog.errors import (
    CatalogConfigError,
    CatalogError,
    CatalogTimeoutError,
    CatalogUnavailableError,
    InvalidTransactionError,
)
from catalog.fsutil import lock_dir
from catalog.raft.journal import decode_dump
from catalog.raft.replica import (BARRIER, MAX_ENTRY_BYTES, Callback, EntryError, Replica, encode_group,
                                  encode_txn)
from catalog.raft.wire import ConnLimits
from catalog.state import CatalogState, validate_txn

log = logging.getLogger("catalog.raft")
T = TypeVar("T")
Send = Callable[[Replica, Callback], None]  # submits one attempt of an entry to a replica
Answer = tuple[object, int]  # (result, FAIL_REASON) of one attempt
Queued = tuple[bytes, str, "asyncio.Future[TxnResult | EntryError]"]  # (payload, request id, its waiter)
_BARRIER = bytes([BARRIER])
# Failures after which the entry is certainly not in any log.
_NOT_SUBMITTED = {FAIL_REASON.MISSING_LEADER, FAIL_REASON.QUEUE_FULL, FAIL_REASON.NOT_LEADER}
_URI_OPTIONS = {"self", "timeout"}
MAX_GROUPS_IN_FLIGHT = 4  # more concurrent txns than this share entries (GROUP)


def parse_raft_uri(uri: str) -> tuple[list[str], str, dict[str, str]]:
    """``raft://a:1,b:2,c:3?self=a:1`` -> (members, self, other options)."""
    if not uri.startswith("raft://"):
        raise CatalogConfigError(f"{uri}: expected raft://host:port,...?self=host:port")
    rest = uri[len("raft://"):]
    hosts, _, query = rest.partition("?")
    opts = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
    for k in opts:
        if k not in _URI_OPTIONS:
            raise CatalogConfigError(f"{uri}: unknown option {k!r} (known: {', '.join(sorted(_URI_OPTIONS))})")
    members = [h.strip() for h in hosts.split(",") if h.strip()]
    me = opts.pop("self", "")
    for a in members + [me]:
        _check_addr(uri, a)
    if len(set(members)) != len(members):
        raise CatalogConfigError(f"{uri}: a member is listed twice")
    return members, me, opts


def _check_addr(uri: str, a: str) -> None:
    host, sep, port = a.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CatalogConfigError(f"{uri}: {a!r} is not host:port (self= is required)")
    if host in ("0.0.0.0", "::", "[::]"):
        raise CatalogConfigError(f"{uri}: {a!r}: the Raft port binds the address given, never a wildcard")


def read_secret(path: str) -> str:
    try:
        with open(path) as f:
            secret = f.read().strip()
    except OSError as e:
        raise CatalogConfigError(f"catalog.secret_file: cannot read {path}: {e.strerror}") from None
    if len(secret) < 16:
        raise CatalogConfigError(f"catalog.secret_file: {path} holds {len(secret)} characters; at least 16")
    return secret


class RaftOptions(TypedDict, total=False):
    """The keyword options of :class:`RaftCatalog` that ``from_uri`` passes on."""

    timeout: float
    attempt_timeout: float
    quorum_grace: float
    tuning: Mapping[str, object] | None
    limits: ConnLimits | None


class RaftCatalog(Catalog):
    def __init__(self, members: list[str], self_addr: str, path: str, secret: str, *,
                 uri: str | None = None, timeout: float = 10.0, attempt_timeout: float = 2.0,
                 quorum_grace: float = 3.0, tuning: Mapping[str, object] | None = None,
                 limits: ConnLimits | None = None):
        if not secret:
            raise CatalogConfigError("raft://: a cluster secret is required (catalog.secret_file)")
        if not path:
            raise CatalogConfigError("raft://: a directory is required (catalog.dir)")
        self.members, self.self_addr = list(members), self_addr
        self.path = os.path.abspath(path)
        self.uri = uri or f"raft://{','.join(members)}?self={self_addr}"
        self.timeout, self.attempt_timeout, self.quorum_grace = timeout, attempt_timeout, quorum_grace
        self._secret, self._tuning, self._limits = secret, tuning, limits
        self._rep: Replica | None = None
        self._lock_fd = -1
        self._closed = False
        self._next_barrier: asyncio.Future[None] | None = None
        self._barrier_running = False
        self._queue: list[Queued] = []
        self._in_flight = 0
        self.stale = StaleReads(self)

    @classmethod
    def from_uri(cls, uri: str, *, secret_file: str | None, dir: str | None,
                 **kw: Unpack[RaftOptions]) -> "RaftCatalog":
        members, me, opts = parse_raft_uri(uri)
        if not secret_file:
            raise CatalogConfigError("catalog.secret_file: required with a raft:// catalog")
        if not dir:
            raise CatalogConfigError("catalog.dir: required with a raft:// catalog")
        if "timeout" in opts:
            kw.setdefault("timeout", float(opts["timeout"]))
        return cls(members, me, dir, read_secret(secret_file), uri=uri, **kw)

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._rep is not None:
            return
        self._closed = False
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        fd = lock_dir(self.path, f"{self.uri}: {self.path} is open in another process")
        try:
            dump = os.path.join(self.path, "dump.trd")
            if os.path.exists(dump):  # refuse a damaged dump here, before pysyncobj half-loads it
                with open(dump, "rb") as f:
                    decode_dump(f.read(), dump)
            try:
                rep = Replica(self.self_addr, self.members, self.path, self._secret, self._tuning, self._limits)
            except Exception as e:
                if type(e).__name__ == "SyncObjException":
                    raise CatalogUnavailableError(f"{self.uri}: cannot bind {self.self_addr}") from e
                raise
            rep.start()
        except BaseException:
            os.close(fd)
            raise
        self._rep, self._lock_fd = rep, fd
        log.info("event=raft_open self=%s members=%s dir=%s", self.self_addr, ",".join(self.members), self.path)

    async def close(self) -> None:
        rep, self._rep = self._rep, None
        self._closed = True
        if rep is not None:
            await asyncio.to_thread(rep.stop)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def connection_stats(self) -> dict[str, int]:
        """Connections the Raft port refused, by reason; write retries of the replica's files."""
        rep = self._rep
        if rep is None or rep.transport is None:
            return {}
        return {**dict(rep.transport.refused), "write_retries": rep.journal.retries}

    def replica(self) -> Replica:
        rep = self._rep
        if rep is None:
            raise CatalogUnavailableError(f"{self.uri} is not open")
        if rep.fatal is not None:
            raise CatalogUnavailableError(f"{self.uri}: replica stopped: {rep.fatal}")
        return rep

    # -- submitting entries --------------------------------------------------------------------

    def _submit(self, send: Callable[[Callback], None]) -> asyncio.Future[Answer]:
        """Hand one attempt to the tick thread; the future gets (result, FAIL_REASON)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Answer] = loop.create_future()

        def done(res: object, err: int) -> None:
            def resolve() -> None:
                if not fut.done():
                    fut.set_result((res, err))
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # the loop is gone; nobody waits
                pass

        send(done)
        return fut

    async def _attempt(self, send: Callable[[Callback], None], timeout: float) -> tuple[object, int | None]:
        """The attempt's answer, or (None, None) when it timed out."""
        fut = self._submit(send)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return None, None

    async def _replicate(self, send: Send, what: str) -> object:
        """Submit until SUCCESS or the deadline; retries are safe (request ids, barriers).

        An attempt that times out stays pending: whichever attempt answers first wins,
        and all of them carry the same entry, so the state machine applies it once."""
        deadline = time.monotonic() + self.timeout
        submitted, delay, last = False, 0.01, "no attempt"
        pending: set[asyncio.Future[Answer]] = set()
        while True:
            rep = self.replica()
            now = time.monotonic()
            v = rep.view
            if not v.has_quorum and now - v.no_quorum_since > self.quorum_grace:
                if not submitted and not pending:
                    raise CatalogUnavailableError(
                        f"{self.uri}: unavailable: no quorum ({self.self_addr} reaches too few members "
                        f"for {now - v.no_quorum_since:.1f} s); {what} was not applied")
                last = "no quorum"
            elif now < deadline and v.has_quorum:
                pending.add(self._submit(functools.partial(send, rep)))
            wait = max(min(self.attempt_timeout if pending else delay, deadline - now), 0)
            if pending:
                done, _ = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    submitted, last = True, "timed out"
                for f in done:
                    pending.discard(f)
                    res, err = f.result()
                    if err == FAIL_REASON.SUCCESS:
                        return res
                    if err not in _NOT_SUBMITTED:
                        submitted = True
                    last = _reason(err)
                if done and not pending:
                    await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
                    delay = min(delay * 2, 0.2)
            else:
                await asyncio.sleep(wait)
                delay = min(delay * 2, 0.2)
            if time.monotonic() >= deadline:
                break
        if submitted or pending:
            raise CatalogTimeoutError(f"{self.uri}: {what}: outcome unknown after {self.timeout:g} s "
                                      f"(last: {last}); it may still commit")
        raise CatalogUnavailableError(f"{self.uri}: unavailable: {what} was not applied "
                                      f"within {self.timeout:g} s (last: {last})")

    async def txn(self, checks: Sequence[Check] = (), ops: Sequence[Op] = (), *,
                  request_id: str | None = None) -> TxnResult:
        self.replica()
        validate_txn(checks, ops, request_id)
        rid = request_id if request_id is not None else "~" + uuid.uuid4().hex
        payload = encode_txn(checks, ops, rid)
        if len(payload) > MAX_ENTRY_BYTES:
            raise InvalidTransactionError(f"transaction encodes to {len(payload)} bytes; max {MAX_ENTRY_BYTES}")
        fut: asyncio.Future[TxnResult | EntryError] = asyncio.get_running_loop().create_future()
        self._queue.append((payload, rid, fut))
        self._pump()
        res = await fut
        if isinstance(res, EntryError):
            raise CatalogError(f"{self.uri}: transaction {rid} refused by the state machine: {res.reason}")
        return res if request_id is not None else dataclasses.replace(res, request_id=None)

    def _pump(self) -> None:
        """Start entries for queued txns: alone while few are in flight, else grouped."""
        while self._queue and self._in_flight < MAX_GROUPS_IN_FLIGHT:
            take, size = 0, 3
            while take < len(self._queue) and (take == 0 or size + 4 + len(self._queue[take][0]) <= MAX_ENTRY_BYTES):
                size += 4 + len(self._queue[take][0])
                take += 1
            batch, self._queue = self._queue[:take], self._queue[take:]
            self._in_flight += 1
            asyncio.ensure_future(self._run_entry(batch))

    async def _run_entry(self, batch: list[Queued]) -> None:
        single = len(batch) == 1
        payload = batch[0][0] if single else encode_group([p for p, _, _ in batch])
        what = f"transaction {batch[0][1]}" if single else f"{len(batch)} transactions ({batch[0][1]}, ...)"
        try:
            res = await self._replicate(lambda rep, cb: rep.submit(payload, cb), what)
        except Exception as e:  # noqa: BLE001 - every waiter of the batch learns it
            for _, rid, fut in batch:
                if not fut.done():
                    fut.set_exception(_for_request(e, rid, single))
        else:
            results = [res] if single else res if isinstance(res, list) else [res] * len(batch)
            for (_, _, fut), r in zip(batch, results):
                if not fut.done():
                    # a TXN entry (alone or in a GROUP) applies to one of these (replica.apply_entry)
                    fut.set_result(cast("TxnResult | EntryError", r))
        finally:
            self._in_flight -= 1
            self._pump()

    # -- linearizable reads --------------------------------------------------------------------

    async def barrier(self) -> None:
        """Return once this replica has applied everything committed before the call."""
        fut = self._next_barrier
        if fut is None:
            fut = self._next_barrier = asyncio.get_running_loop().create_future()
            if not self._barrier_running:
                self._start_barrier()
        await asyncio.shield(fut)

    def _start_barrier(self) -> None:
        fut, self._next_barrier = self._next_barrier, None
        assert fut is not None  # started only for a barrier that callers wait on
        self._barrier_running = True
        asyncio.ensure_future(self._run_barrier(fut))

    async def _run_barrier(self, fut: asyncio.Future[None]) -> None:
        try:
            await self._replicate(lambda rep, cb: rep.submit(_BARRIER, cb), "linearizable read")
        except CatalogTimeoutError as e:  # a read has no unknown outcome: it just failed
            fut.set_exception(CatalogUnavailableError(str(e).replace("outcome unknown", "no answer")))
        except BaseException as e:  # noqa: BLE001 - the waiter gets whatever ended the call
            fut.set_exception(e)
        else:
            fut.set_result(None)
        finally:
            self._barrier_running = False
            if self._next_barrier is not None:
                self._start_barrier()
        if fut.done() and not fut.cancelled():
            fut.exception()  # retrieved: waiters re-raise it themselves

    async def _read(self, fn: Callable[[CatalogState], T]) -> T:
        await self.barrier()
        return self.replica().read(fn)

    async def get(self, key: str) -> Entry | None:
        return await self._read(lambda st: st.get(key))

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        keys = list(keys)
        return await self._read(lambda st: {k: e for k in keys if (e := st.get(k)) is not None})

    async def scan(self, prefix: str = "", *, start: str | None = None, end: str | None = None,
                   limit: int | None = None, reverse: bool = False) -> list[Entry]:
        return await self._read(lambda st: st.scan(prefix, start, end, limit, reverse))

    async def outcome(self, request_id: str) -> TxnResult | None:
        return await self._read(lambda st: st.outcome(request_id))

    async def revision(self) -> int:
        return await self._read(lambda st: st.revision)

    # -- cluster -------------------------------------------------------------------------------

    async def cluster_status(self) -> dict[str, Any]:
        """Members (alive = connected to this node), leader, term, as this node sees them.

        Answers without a quorum (it reports the lack of one)."""
        rep = self.replica()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any] | Exception | None] = loop.create_future()

        def task() -> None:
            st: dict[str, Any] | Exception | None
            try:
                st = rep.status() if rep.fatal is None else None
            except Exception as e:  # noqa: BLE001
                st = e

            def resolve() -> None:
                if not fut.done():
                    fut.set_result(st)

            loop.call_soon_threadsafe(resolve)

        rep.post(task)
        st = await asyncio.wait_for(fut, self.attempt_timeout)
        if st is None:
            raise CatalogUnavailableError(f"{self.uri}: replica stopped")
        if isinstance(st, Exception):
            raise CatalogError(f"{self.uri}: status failed: {st}") from st
        return st

    async def add_member(self, address: str) -> None:
        """Add one node (started with the current members in its URI). One change at a time."""
        await self._membership("add", address)

    async def remove_member(self, address: str) -> None:
        """Remove one node (not the current leader: ``transfer_leadership`` first)."""
        await self._membership("rem", address)

    async def _membership(self, op: str, address: str) -> None:
        _check_addr(self.uri, address)
        res = await self._replicate_membership(op, address)
        if res is not None:
            raise CatalogError(res)
        log.info("event=raft_membership op=%s address=%s", op, address)

    async def _replicate_membership(self, op: str, address: str) -> str | None:
        deadline = time.monotonic() + self.timeout
        while True:
            rep = self.replica()
            res, err = await self._attempt(functools.partial(rep.submit_membership, op, address),
                                           min(self.attempt_timeout, max(deadline - time.monotonic(), 0.01)))
            if err == FAIL_REASON.SUCCESS:
                return None
            if err == FAIL_REASON.REQUEST_DENIED:
                return (f"{self.uri}: membership change {op} {address} refused (another change is not "
                        f"committed yet, the node is already {'a member' if op == 'add' else 'absent'}, "
                        f"or it is the leader)")
            if time.monotonic() >= deadline:
                raise CatalogTimeoutError(f"{self.uri}: membership change {op} {address}: outcome unknown "
                                          f"(last: {_reason(err) if err is not None else 'timed out'})")
            await asyncio.sleep(0.05)

    async def transfer_leadership(self, to: str | None = None) -> None:
        """Ask the leader (this node) to hand over to ``to`` or the most caught-up follower."""
        rep = self.replica()
        res, err = await self._attempt(lambda cb: rep.post(lambda: rep.transferLeadership(to, cb)),
                                       self.attempt_timeout)
        if err != FAIL_REASON.SUCCESS:
            raise CatalogError(f"{self.uri}: leadership transfer refused "
                               f"({_reason(err) if err is not None else 'timed out'})")


class StaleReads:
    """Reads of this replica's local state: no quorum needed, possibly behind the leader."""

    def __init__(self, cat: RaftCatalog):
        self._cat = cat

    async def get(self, key: str) -> Entry | None:
        return self._cat.replica().read(lambda st: st.get(key))

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        keys = list(keys)
        return self._cat.replica().read(lambda st: {k: e for k in keys if (e := st.get(k)) is not None})

    async def scan(self, prefix: str = "", *, start: str | None = None, end: str | None = None,
                   limit: int | None = None, reverse: bool = False) -> list[Entry]:
        return self._cat.replica().read(lambda st: st.scan(prefix, start, end, limit, reverse))

    async def revision(self) -> int:
        return self._cat.replica().read(lambda st: st.revision)


def _for_request(e: Exception, rid: str, alone: bool) -> Exception:
    """The failure of a shared entry as each of its transactions' own exception."""
    if not alone:
        try:
            e = type(e)(str(e))
        except TypeError:
            e = CatalogError(str(e))
    setattr(e, "request_id", rid)  # noqa: B010 - any exception class: the instance gets the attribute
    return e


def _reason(err: int) -> str:
    names: dict[int, str] = {v: k.lower() for k, v in vars(FAIL_REASON).items() if not k.startswith("_")}
    return names.get(err, str(err))
