"""One Raft replica of the catalog: a hardened pysyncobj ``SyncObj`` (RFC 0005).

The replicated state is a ``CatalogState``; the one replicated method applies
an encoded entry and never raises. The replica runs its own tick thread
(``autoTick=False``): tick, flush the outbox (journal fsync before acks), run
tasks posted by the event loop thread, publish a ``View``. State changes and
local reads both hold ``lock``.
"""
from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

import pysyncobj.syncobj as pso
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import Journal
from pysyncobj.node import TCPNode
from pysyncobj.pipe_notifier import PipeNotifier

from catalog.abc import Check, Op, TxnResult
from catalog.errors import CatalogCorruptionError
from catalog.fsutil import fsync_dir
from catalog.logfile import decode_ops, encode_ops
from catalog.raft.journal import DurableJournal, JournalEntry, JournalError, decode_dump, encode_dump
from catalog.raft.wire import BATCH_BYTES, ConnLimits, HardenedTransport, install_plain_pickle, plain_dumps
from catalog.state import CatalogState, validate_txn

if TYPE_CHECKING:
    from pysyncobj.node import Node
    from pysyncobj.poller import Poller

log = logging.getLogger("catalog.raft")
T = TypeVar("T")
# pysyncobj's answer to a submitted entry: (what the replicated method returned, FAIL_REASON)
Callback = Callable[[object, int], None]

# Entry payloads (inside pysyncobj's pickled command). Part of the journal format.
TXN, BARRIER, GROUP = 1, 2, 3
MAX_ENTRY_BYTES = 60 * 1024  # < BATCH_BYTES: pysyncobj's chunked path (broken >= 64 KiB) never runs
assert MAX_ENTRY_BYTES < BATCH_BYTES

# Tuned defaults (RFC 0005, problem 8); every one can be overridden for tests.
TUNING = dict(
    appendEntriesUseBatch=False,     # send at once; batching cost ~100 ms per txn
    appendEntriesPeriod=0.05,        # heartbeat
    raftMinTimeout=0.2, raftMaxTimeout=0.6,   # a new leader well within 2 s (RFC 0005)
    connectionTimeout=1.0, connectionRetryTime=0.2,
    leaderFallbackTimeout=1.0,       # a leader cut off from the majority steps down
    appendEntriesBatchSizeBytes=BATCH_BYTES, logCompactionBatchSize=BATCH_BYTES,
    logCompactionMinEntries=5000, logCompactionMinTime=300,
    bindRetryTime=0.1, maxBindRetries=50,
    commandsWaitLeader=False,        # no leader: fail at once (definitely not applied)
    dynamicMembershipChange=True, useFork=False,
)
TICK_WAIT = 0.02


@dataclass(frozen=True)
class EntryError:
    """The deterministic outcome of an entry that could not be applied."""

    reason: str


@dataclass(frozen=True)
class View:
    """What the tick thread last saw; read without locks by the event loop."""

    role: str = "follower"
    leader: str | None = None
    term: int = 0
    has_quorum: bool = False
    no_quorum_since: float = 0.0
    commit_index: int = 0
    last_applied: int = 0


# What applying an entry gives: a txn's result (or why it could not apply), a barrier's
# revision, a group's results in order.
Applied = Union[TxnResult, int, EntryError, list["Applied"]]


# -- entry codec ------------------------------------------------------------------------------

def encode_txn(checks: Sequence[Check], ops: Sequence[Op], request_id: str) -> bytes:
    rid = request_id.encode()
    out = bytearray(struct.pack("<BH", TXN, len(rid)) + rid + struct.pack("<H", len(checks)))
    for c in checks:
        kb = c.key.encode()
        out += struct.pack("<H", len(kb)) + kb + struct.pack("<Q", c.version)
    return bytes(out) + encode_ops(ops)


def decode_txn(p: bytes) -> tuple[list[Check], list[Op], str]:
    (rl,) = struct.unpack_from("<H", p, 1)
    rid = p[3:3 + rl].decode()
    pos = 3 + rl
    (n,) = struct.unpack_from("<H", p, pos)
    pos += 2
    checks: list[Check] = []
    for _ in range(n):
        (kl,) = struct.unpack_from("<H", p, pos)
        key = p[pos + 2:pos + 2 + kl].decode()
        (ver,) = struct.unpack_from("<Q", p, pos + 2 + kl)
        checks.append(Check(key, ver))
        pos += 10 + kl
    ops, pos = decode_ops(p, pos)
    if pos != len(p):
        raise ValueError("trailing bytes in entry")
    return checks, ops, rid


def encode_group(payloads: list[bytes]) -> bytes:
    """Several txn payloads as one entry, applied in order (group commit at the catalog level)."""
    out = bytearray(struct.pack("<BH", GROUP, len(payloads)))
    for p in payloads:
        out += struct.pack("<I", len(p)) + p
    return bytes(out)


def _split_group(p: bytes) -> list[bytes]:
    (n,) = struct.unpack_from("<H", p, 1)
    pos = 3
    out: list[bytes] = []
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", p, pos)
        out.append(p[pos + 4:pos + 4 + ln])
        pos += 4 + ln
    if pos != len(p) or any(len(x) == 0 or x[0] != TXN for x in out):
        raise ValueError("malformed group")
    return out


def apply_entry(state: CatalogState, payload: object) -> Applied:
    """Apply one entry. Deterministic and never raises (RFC 0005, problem 4)."""
    try:
        if not isinstance(payload, bytes) or not payload:
            return EntryError("entry is not bytes")
        if payload[0] == BARRIER:
            return state.revision
        if payload[0] == GROUP:
            return [apply_entry(state, p) for p in _split_group(payload)]
        if payload[0] != TXN:
            return EntryError(f"unknown entry kind {payload[0]}")
        checks, ops, rid = decode_txn(payload)
        validate_txn(checks, ops, rid)
        return state.apply(checks, ops, rid)
    except Exception as e:  # noqa: BLE001 — an error value, the same on every replica
        return EntryError(f"{type(e).__name__}: {e}")


def _read_synced(filename: str) -> bytes:
    with open(filename, "rb") as f:
        raw = f.read()
        os.fsync(f.fileno())  # a dump received from the leader was only renamed
    fsync_dir(os.path.dirname(filename))
    return raw


def _create_journal(journal: str | Journal | None) -> Journal:
    return journal if isinstance(journal, Journal) else _stock_create_journal(journal)


_stock_create_journal = pso.createJournal


class Replica(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped: its SyncObj is Any
    _poller: Poller  # pysyncobj's, then wrapped in a _FlushingPoller

    def __init__(self, self_addr: str, partners: list[str], path: str, secret: str,
                 tuning: Mapping[str, object] | None = None, limits: ConnLimits | None = None):
        install_plain_pickle()
        self.limits = limits
        pso.createJournal = _create_journal  # lets conf.journalFile be our Journal object
        self.lock = threading.Lock()
        self.state = CatalogState()
        self.path, self.address = path, self_addr
        self.view = View(no_quorum_since=time.monotonic())
        self.fatal: BaseException | None = None
        self._tasks: collections.deque[Callable[[], object]] = collections.deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.transport: HardenedTransport | None = None
        self.journal = DurableJournal(path, stopping=lambda: self._stopping, on_retry=self._shed)
        self.journal.align_to_dump(os.path.join(path, "dump.trd"))  # before pysyncobj loads the dump
        self._dump_state: int = SERIALIZER_STATE.NOT_SERIALIZING
        self._dump_thread: threading.Thread | None = None
        self._dump_args: tuple[str, JournalEntry, JournalEntry, list[str], CatalogState] | None = None
        conf = SyncObjConf(**{**TUNING, **(tuning or {})}, autoTick=False, password=secret,
                           bindAddress=self_addr, journalFile=self.journal,
                           fullDumpFile=os.path.join(path, "dump.trd"),
                           serializer=self._serialize, deserializer=self._deserialize,
                           serializeChecker=self._dump_status)
        super().__init__(self_addr, [p for p in partners if p != self_addr], conf,
                         transportClass=self._make_transport)
        self._poller = _FlushingPoller(self._poller, self._flush)
        self._wake = PipeNotifier(self._poller)

    def _shed(self) -> None:
        if self.transport is not None:
            self.transport.shed_pending(0.0)

    def _make_transport(self, syncobj: SyncObj, self_node: Node, others: Iterable[Node]) -> HardenedTransport:
        self.transport = HardenedTransport(syncobj, self_node, others, self.limits)
        return self.transport

    # -- the state machine -----------------------------------------------------------------

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped: callers see _apply as Any
    def _apply(self, payload: object) -> Applied:
        with self.lock:
            return apply_entry(self.state, payload)

    def read(self, fn: Callable[[CatalogState], T]) -> T:
        """Run ``fn(state)`` under the state lock (problem 7: no torn multi-key reads)."""
        with self.lock:
            return fn(self.state)

    def _serialize(self, tmp: str, data: tuple[JournalEntry, JournalEntry, Iterable[Node]]) -> None:
        """pysyncobj's dump hook (tick thread). It renames ``tmp`` over the dump as soon as we
        return, and drops journal entries once ``_dump_status`` says SUCCESS.

        The state is copied here (C-level copies, milliseconds); encoding and writing the new
        dump runs on a helper thread so heartbeats go on. Meanwhile ``tmp`` is a hard link to
        the current dump, so the rename changes nothing and the dump on disk always matches the
        journal. The first dump (none on disk yet) is written here, synchronously: it is small."""
        last, prev, cluster = data
        members = sorted(n.address for n in cluster)
        state = self.state.copy()
        final = self.conf.fullDumpFile
        if os.path.exists(tmp):
            os.unlink(tmp)
        self._dump_state = SERIALIZER_STATE.SERIALIZING
        try:
            if not os.path.exists(final):
                self._write_dump(tmp, last, prev, members, state)
                self._dump_state = SERIALIZER_STATE.SUCCESS
                return
            os.link(final, tmp)
        except OSError:  # e.g. EMFILE: this compaction fails, a later one runs
            log.exception("event=raft_dump_failed file=%s", final)
            self._dump_state = SERIALIZER_STATE.FAILED
            return
        # Start writing only after pysyncobj's rename of tmp (it follows our return): see _dump_status.
        self._dump_args = (final, last, prev, members, state)

    def _dump_in_background(self, final: str, last: JournalEntry, prev: JournalEntry, members: list[str],
                            state: CatalogState) -> None:
        tmp = final + ".bg.tmp"
        try:
            if os.path.exists(final + ".tmp"):
                os.unlink(final + ".tmp")  # the placeholder link, left by the no-op rename
            self._write_dump(tmp, last, prev, members, state)
            os.replace(tmp, final)
            fsync_dir(os.path.dirname(final))
            self._dump_state = SERIALIZER_STATE.SUCCESS
        except Exception:
            log.exception("event=raft_dump_failed file=%s", final)
            self._dump_state = SERIALIZER_STATE.FAILED

    @staticmethod
    def _write_dump(path: str, last: JournalEntry, prev: JournalEntry, members: list[str],
                    state: CatalogState) -> None:
        raw = encode_dump(last, prev, members, state.snapshot())
        with open(path, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())

    def _dump_status(self) -> int:
        """pysyncobj's serializeChecker: SUCCESS/FAILED are reported once, then idle."""
        if self._dump_args is not None:
            args, self._dump_args = self._dump_args, None
            self._dump_thread = threading.Thread(target=self._dump_in_background, args=args,
                                                 name=f"raft-dump-{self.address}", daemon=True)
            self._dump_thread.start()
        st = self._dump_state
        if st in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
            self._dump_state = SERIALIZER_STATE.NOT_SERIALIZING
        return st

    def _deserialize(self, filename: str) -> tuple[JournalEntry, JournalEntry, list[TCPNode]]:
        try:
            raw = self.journal.retry(_read_synced, filename)
            last, prev, members, st = decode_dump(raw, filename)
            state = CatalogState.restore(st, filename)
        except BaseException as e:
            self.fatal = e  # pysyncobj would log and go on without the state: stop instead
            raise
        with self.lock:
            self.state = state
        # Loading a big dump takes a while: do not count it against the leader (no pre-vote in
        # pysyncobj; a needless election would depose a healthy leader).
        self._SyncObj__raftElectionDeadline = time.monotonic() + self.conf.raftMaxTimeout
        return last, prev, [TCPNode(m) for m in members]

    # -- thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"raft-{self.address}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        if self._dump_thread is not None:
            self._dump_thread.join()

    def post(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the tick thread (it may touch pysyncobj's internals)."""
        self._tasks.append(fn)
        self._wake.notify()

    def submit(self, payload: bytes, callback: Callback) -> None:
        self._apply(payload, callback=callback)

    def submit_membership(self, op: str, address: str, callback: Callback) -> None:
        self._applyCommand(plain_dumps([op, address]), callback, pso._COMMAND_TYPE.MEMBERSHIP)

    def _flush(self) -> None:
        if self.fatal is None:
            assert self.transport is not None  # made by SyncObj.__init__ (_make_transport)
            self.transport.flush(self.journal.sync)

    def _run(self) -> None:
        errors = 0
        try:
            while not self._stopping and self.fatal is None:
                try:
                    self.doTick(TICK_WAIT)
                    if self.fatal is not None:
                        break
                    self._flush()
                    while self._tasks:
                        self._tasks.popleft()()
                    self._publish()
                except (JournalError, CatalogCorruptionError) as e:
                    self.fatal = e
                except Exception:  # a peer's bad message: log, go on (the state machine never raises)
                    errors += 1
                    if errors < 20 or errors % 1000 == 0:
                        log.exception("event=raft_tick_error count=%d", errors)
        finally:
            if self.fatal is not None:
                log.error("event=raft_replica_stopped address=%s reason=%r", self.address, str(self.fatal))
            while self._tasks:  # let waiters see the replica is gone
                try:
                    self._tasks.popleft()()
                except Exception:  # noqa: BLE001 - shutting down: each task reports through its own callback
                    pass
            try:
                self._doDestroy()
            except Exception:
                log.exception("event=raft_destroy_error")

    def _publish(self) -> None:
        leader = self._getLeader()
        role = "leader" if self._isLeader() else "follower"
        quorum = self.hasQuorum
        old = self.view
        since = old.no_quorum_since if not quorum and not old.has_quorum else time.monotonic()
        v = View(role, leader.address if leader is not None else None, self.raftCurrentTerm, quorum,
                 since, self.raftCommitIndex, self.raftLastApplied)
        if v != old:
            self.view = v

    def status(self) -> dict[str, Any]:
        """Cluster status as this replica sees it (tick thread only)."""
        st = self.getStatus()
        members = [{"id": self.address, "address": self.address, "alive": True, "self": True}]
        for n in sorted(self.otherNodes, key=lambda n: n.address):
            members.append({"id": n.address, "address": n.address, "alive": self.isNodeConnected(n),
                            "self": False})
        roles = {0: "follower", 1: "candidate", 2: "leader"}
        leader = st["leader"]
        return {"self": self.address, "role": roles.get(st["state"], "unknown"),
                "leader": leader.address if leader is not None else None, "term": st["raft_term"],
                "has_quorum": st["has_quorum"], "commit_index": st["commit_idx"],
                "last_applied": st["last_applied"], "log_entries": st["log_len"],
                "journal_syncs": self.journal.syncs, "members": members}


class _FlushingPoller:
    """Flushes the outbox before blocking in poll, so nothing queued waits out a tick."""

    def __init__(self, inner: Poller, flush: Callable[[], None]):
        self._inner, self._flush = inner, flush

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:
        self._inner.subscribe(descr, callback, eventMask)

    def unsubscribe(self, descr: int) -> None:
        self._inner.unsubscribe(descr)

    def poll(self, timeout: float) -> None:
        self._flush()
        self._inner.poll(timeout)
