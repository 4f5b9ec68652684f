"""pysyncobj's network, hardened (RFC 0005, problems 1, 2, 6, 8).

* Plain-data pickles only: ``install_plain_pickle`` replaces ``pysyncobj.pickle``'s
  codec by protocol-5 pickles read with an ``Unpickler`` that refuses every
  global, so no callable can be named and nothing runs while decoding.
* Frames are capped (``MAX_FRAME`` on the wire, ``MAX_MESSAGE`` decompressed);
  a first message that is not a member's address drops the connection (no
  utility commands, no read-only peers); the server binds the configured address.
* Outgoing messages wait in an outbox until ``flush``: acknowledgements leave
  only after the journal is fdatasync'd, and adjacent append-entries to one
  peer are merged into one message.
* Hostile connections (docs/raft.md, "Hostile connections"): an incoming connection that has not named a
  member within ``ConnLimits.handshake_timeout`` is closed (pysyncobj checks its
  timeout only when bytes arrive, so a silent one stayed forever); at most
  ``ConnLimits.max_pending`` of them are open, more are closed at accept. EMFILE,
  ENFILE, ENOBUFS, ENOMEM and ECONNABORTED on accept are temporary: the listener
  pauses with a backoff and resumes (pysyncobj closed it for good and never
  rebound); any other listener failure is logged and the port is bound again.
  Out of descriptors (a failed accept, a replica file write retried), the
  unauthenticated connections older than ``SHED_AFTER`` are closed first.
  ``HardenedTransport.refused`` counts what was refused, by reason.

Everything here that overrides pysyncobj's private (name-mangled) methods is
written against pysyncobj 0.3.x and stays in this module.
"""
from __future__ import annotations

import collections
import errno
import functools
import io
import logging
import os
import pickle
import socket
import struct
import time
import zlib
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, NoReturn, Sequence, cast

import pysyncobj.pickle as pso_pickle
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_server import SERVER_STATE, TcpServer
from pysyncobj.transport import TCPTransport

if TYPE_CHECKING:
    from pysyncobj import SyncObj
    from pysyncobj.node import Node
    from typing_extensions import Buffer

    from catalog.raft.journal import JournalEntry

log = logging.getLogger("catalog.raft")

MAX_FRAME = 1 << 20          # bytes on the wire for one message
MAX_MESSAGE = 4 << 20        # bytes after decompression
BATCH_BYTES = 1 << 16        # entry bytes per merged append-entries (= appendEntriesBatchSizeBytes)
# accept() failing with these is a passing shortage (or the peer gave up): never fatal
TEMPORARY_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                    errno.EPROTO, errno.EPERM, errno.EINTR}
BACKOFF_MIN, BACKOFF_MAX = 0.05, 1.0   # seconds the listener pauses after a failed accept
REBIND_EVERY = 0.5
SHED_AFTER = 1.0  # out of descriptors: unauthenticated connections older than this are closed
Message = dict[str, Any]  # a pysyncobj message between members (plain data)


@dataclass(frozen=True)
class ConnLimits:
    """Incoming connections that have not authenticated yet (config: ``node.handshake_timeout``,
    ``node.max_pending_connections``)."""

    handshake_timeout: float = 10.0
    max_pending: int = 256


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"refused global {module}.{name} (plain data only)")


def plain_loads(data: Buffer | str) -> object:
    """Unpickle dict/list/tuple/set/str/bytes/int/float/bool/None and nothing else."""
    if isinstance(data, str):
        data = data.encode()
    return _PlainUnpickler(io.BytesIO(data)).load()


def plain_dumps(obj: object, protocol: int | None = None) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _plain_load(f: IO[bytes]) -> object:
    return _PlainUnpickler(f).load()


def _plain_dump(obj: object, f: IO[bytes], protocol: int | None = None) -> None:
    pickle.dump(obj, f, protocol=5)


def install_plain_pickle() -> None:
    """Process-wide: every pysyncobj (un)pickle goes through the plain-data codec."""
    pso_pickle.loads, pso_pickle.dumps = plain_loads, plain_dumps
    pso_pickle.load, pso_pickle.dump = _plain_load, _plain_dump


class CappedConnection(TcpConnection):  # type: ignore[misc]  # pysyncobj is untyped: its classes are Any
    """A TcpConnection that refuses oversized frames and anything but plain data."""

    _TcpConnection__readBuffer: bytes
    recvLastTimestamp: int
    recvRandKey: bytes | None

    def _TcpConnection__processRead(self) -> bool:
        if len(self._TcpConnection__readBuffer) > MAX_FRAME + 4:
            return False  # parse what we have first; the rest stays in the socket
        return bool(TcpConnection._TcpConnection__processRead(self))

    def _TcpConnection__processParseMessage(self) -> object:
        buf = self._TcpConnection__readBuffer
        if len(buf) < 4:
            return None
        (n,) = struct.unpack("i", buf[:4])
        if n < 0 or n > MAX_FRAME:
            log.warning("event=raft_frame_refused bytes=%d max=%d", n, MAX_FRAME)
            self.disconnect()
            return None
        if len(buf) - 4 < n:
            return None
        data = buf[4:4 + n]
        try:
            if self.encryptor:
                ts = self.encryptor.extract_timestamp(data)
                if ts < self.recvLastTimestamp:
                    raise ValueError("timestamp went backwards")
                self.recvLastTimestamp = ts
                data = self.encryptor.decrypt(data)
            z = zlib.decompressobj()
            raw = z.decompress(data, MAX_MESSAGE)
            if z.unconsumed_tail:
                raise ValueError(f"message larger than {MAX_MESSAGE} bytes")
            message = plain_loads(raw)
            if self.recvRandKey:
                # a pair as pysyncobj sends it; anything else fails to unpack: refused below
                rand, message = cast("tuple[object, object]", message)
                if rand != self.recvRandKey:
                    raise ValueError("wrong session key")
        except Exception as e:  # noqa: BLE001 - unauthenticated, damaged or not plain data: drop the peer
            log.warning("event=raft_message_refused reason=%r", str(e)[:200])
            self.disconnect()
            return None
        self._TcpConnection__readBuffer = buf[4 + n:]
        return message


class _Server(TcpServer):  # type: ignore[misc]  # pysyncobj is untyped: its classes are Any
    """pysyncobj's server, but a failed accept never closes the listener for good."""

    def __init__(self, *a: object, on_accept_error: Callable[[OSError, float], None], **kw: object) -> None:
        super().__init__(*a, **kw)
        self._on_accept_error = on_accept_error
        self.paused_until: float | None = None
        self._backoff = BACKOFF_MIN

    @property
    def bound(self) -> bool:
        return bool(self._TcpServer__state == SERVER_STATE.BINDED)

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:
        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, _ = self._TcpServer__socket.accept()
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                if e.errno == errno.ECONNABORTED:  # the peer left before we took it: next one
                    return
                if e.errno in TEMPORARY_ACCEPT:
                    self._pause(e)
                else:
                    log.error("event=raft_accept_failed errno=%s reason=%r (listener rebound)",
                              errno.errorcode.get(e.errno, e.errno) if e.errno is not None else None, str(e))
                    self._on_accept_error(e, 0.0)
                    self.unbind()
                return
            self._backoff = BACKOFF_MIN
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(0)
                conn = CappedConnection(poller=self._TcpServer__poller, socket=sock,
                                        timeout=self._TcpServer__connectionTimeout,
                                        sendBufferSize=self._TcpServer__sendBufferSize,
                                        recvBufferSize=self._TcpServer__recvBufferSize,
                                        keepalive=self._TcpServer__keepalive)
            except OSError:
                sock.close()  # reset by the peer meanwhile
                return
            self._TcpServer__onNewConnectionCallback(conn)
        if event & POLL_EVENT_TYPE.ERROR:
            log.error("event=raft_listener_error (listener rebound)")
            self.unbind()

    def _pause(self, e: OSError) -> None:
        """Stop polling the listener for a while (poll would report it ready at once, again).
        Not catalog.retry: nothing is called again here and nothing may sleep — this runs on
        the tick thread that serves every peer; the poller accepts again once resumed."""
        wait = self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        self._on_accept_error(e, wait)
        fd = self._TcpServer__fileno
        if fd is not None and self.paused_until is None:
            self._TcpServer__poller.unsubscribe(fd)
        self.paused_until = time.monotonic() + wait

    def maybe_resume(self, now: float) -> None:
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
            fd = self._TcpServer__fileno
            if fd is not None:
                self._TcpServer__poller.subscribe(fd, self._TcpServer__onNewConnection,
                                                  POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def bind(self) -> None:
        super().bind()
        self._TcpServer__socket.listen(128)  # pysyncobj listens with a backlog of 5

    def unbind(self) -> None:
        self.paused_until = None
        super().unbind()


class HardenedTransport(TCPTransport):  # type: ignore[misc]  # pysyncobj is untyped: its classes are Any
    """TCPTransport with the configured bind address, strict handshake and an outbox."""

    def __init__(self, syncObj: SyncObj, selfNode: Node, otherNodes: Iterable[Node],
                 limits: ConnLimits | None = None) -> None:
        self._outbox: list[tuple[Node, Message]] = []
        self.limits = limits or ConnLimits()
        self.refused: collections.Counter[str] = collections.Counter()  # reason -> connections refused
        # unauthenticated incoming connection -> monotonic accept time
        self._accepted_at: dict[TcpConnection, float] = {}
        self._next_sweep = self._next_bind = 0.0
        self._last_accept_log = 0.0
        super().__init__(syncObj, selfNode, otherNodes)

    def _createServer(self) -> None:
        conf = self._syncObj.conf
        if not conf.bindAddress:
            raise RuntimeError("raft: bindAddress must be set (never 0.0.0.0)")
        host, port = conf.bindAddress.rsplit(":", 1)
        host = globalDnsResolver().resolve(host.strip("[]"))
        self._server = _Server(self._syncObj._poller, host, port,
                               onNewConnection=self._onNewIncomingConnection,
                               sendBufferSize=conf.sendBufferSize, recvBufferSize=conf.recvBufferSize,
                               connectionTimeout=conf.connectionTimeout, on_accept_error=self._accept_error)

    # -- hostile connections -------------------------------------------------------------------

    def _accept_error(self, e: OSError, wait: float) -> None:
        name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else str(e.errno)
        self.refused[f"accept_{name.lower()}"] += 1
        now = time.monotonic()
        self.shed_pending(SHED_AFTER, now)  # members get the descriptors that silent strangers hold
        if now - self._last_accept_log >= 1.0:  # one line a second at most during a flood
            self._last_accept_log = now
            log.warning("event=raft_accept_failed errno=%s backoff_s=%.2f refused_total=%d (listener kept)",
                        name, wait, sum(self.refused.values()))

    def _onNewIncomingConnection(self, conn: TcpConnection) -> None:
        if len(self._unknownConnections) >= self.limits.max_pending:
            self.refused["pending_cap"] += 1
            conn.disconnect()
            return
        super()._onNewIncomingConnection(conn)
        self._accepted_at[conn] = time.monotonic()

    def _onDisconnected(self, conn: TcpConnection) -> None:
        self._accepted_at.pop(conn, None)
        super()._onDisconnected(conn)

    def _onTick(self) -> None:
        now = time.monotonic()
        srv = self._server
        if srv is not None:
            self._guard_tick(srv, now)
        try:
            super()._onTick()  # bind, connect to peers
        except OSError as e:  # no descriptor for an outgoing connection now: next tick
            if now - self._last_accept_log >= 1.0:
                self._last_accept_log = now
                log.warning("event=raft_connect_failed reason=%r", str(e))

    def _guard_tick(self, srv: "_Server", now: float) -> None:
        srv.maybe_resume(now)
        if not srv.bound and now >= self._next_bind:
            self._next_bind = now + REBIND_EVERY
            try:
                srv.bind()
                log.info("event=raft_listener_rebound")
            except OSError as e:
                log.warning("event=raft_rebind_failed reason=%r", str(e))
        if now >= self._next_sweep:
            self._next_sweep = now + 0.1
            self._expire_handshakes(now)

    def shed_pending(self, older_than: float, now: float | None = None) -> int:
        """Close unauthenticated connections open longer than ``older_than`` seconds (a member
        names itself at once): what a shortage of descriptors takes first."""
        now = time.monotonic() if now is None else now
        old = [c for c, t in self._accepted_at.items() if now - t > older_than and c in self._unknownConnections]
        for c in old:
            self.refused["shed"] += 1
            self._accepted_at.pop(c, None)
            self._unknownConnections.discard(c)
            c.disconnect()
        return len(old)

    def _expire_handshakes(self, now: float) -> None:
        late = [c for c, t in self._accepted_at.items()
                if now - t > self.limits.handshake_timeout and c in self._unknownConnections]
        for c in late:
            self.refused["handshake_timeout"] += 1
            self._accepted_at.pop(c, None)
            self._unknownConnections.discard(c)
            c.disconnect()
        for c in [c for c in self._accepted_at if c not in self._unknownConnections]:
            del self._accepted_at[c]  # authenticated (or gone)

    def addNode(self, node: Node) -> None:
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            conf = self._syncObj.conf
            conn = CappedConnection(poller=self._syncObj._poller, timeout=conf.connectionTimeout,
                                    sendBufferSize=conf.sendBufferSize, recvBufferSize=conf.recvBufferSize,
                                    keepalive=conf.tcp_keepalive)
            conn.encryptor = self._syncObj.encryptor
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def _onIncomingMessageReceived(self, conn: TcpConnection, message: object) -> None:
        if self._syncObj.encryptor and not conn.sendRandKey:
            if not isinstance(message, bytes) or len(message) != 32:
                self._refuse(conn, "bad session key")
                return
            conn.sendRandKey = message
            conn.recvRandKey = os.urandom(32)
            conn.send(conn.recvRandKey)
            return
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
        if node is None:  # utility commands and read-only peers are not served
            self._refuse(conn, "first message is not a member address")
            return
        self._unknownConnections.discard(conn)
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onMessageReceived(self, node: Node, message: object) -> None:
        if isinstance(message, dict) and _plain_ae(message) and message.get("prevLogIdx") is not None:
            message = skip_known_entries(self._syncObj.journal, message)
        super()._onMessageReceived(node, message)

    def _refuse(self, conn: TcpConnection, why: str) -> None:
        log.warning("event=raft_peer_refused reason=%r", why)
        self.refused["handshake"] += 1
        conn.disconnect()
        self._unknownConnections.discard(conn)

    # -- outbox --------------------------------------------------------------------------------

    def send(self, node: Node, message: Message) -> bool:
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        self._outbox.append((node, message))
        return True

    def flush(self, sync: Callable[[], None]) -> None:
        """Send the outbox; ``sync()`` (journal fdatasync) runs before any acknowledgement."""
        out, self._outbox = self._outbox, []
        if any(m.get("type") == "next_node_idx" for _, m in out):
            sync()
        per: dict[Node, list[Message]] = {}
        for node, m in out:
            per.setdefault(node, []).append(m)
        for node, msgs in per.items():
            conn = self._connections.get(node)
            for m in coalesce(msgs):
                if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
                    break
                conn.send(m)
        sync()  # the leader counts its own entries only after this (next tick)


def _plain_ae(m: Message) -> bool:
    return m.get("type") == "append_entries" and "entries" in m and "transmission" not in m


def _last_idx(m: Message) -> int:
    idx: int = m["entries"][-1][1] if m["entries"] else m["prevLogIdx"]
    return idx


def coalesce(msgs: list[Message]) -> list[Message]:
    """Fewer messages, same effect, for one peer (order otherwise kept).

    * apply_command_response moves to the front: a follower learns where its
      command sits before it could apply it (never later than before).
    * adjacent append-entries of one term, each continuing the previous, merge
      while their entries stay under BATCH_BYTES.
    * adjacent plain successful acks keep only the last (highest) one.
    """
    front = [m for m in msgs if m.get("type") == "apply_command_response"]
    out: list[Message] = []
    for m in msgs:
        if m.get("type") == "apply_command_response":
            continue
        prev = out[-1] if out else None
        if (prev is not None and _plain_ae(prev) and _plain_ae(m) and prev["term"] == m["term"]
                and m["prevLogIdx"] == _last_idx(prev)
                and sum(len(e[0]) for e in prev["entries"] + m["entries"]) <= BATCH_BYTES):
            merged = dict(m)
            merged["prevLogIdx"], merged["prevLogTerm"] = prev["prevLogIdx"], prev["prevLogTerm"]
            merged["entries"] = list(prev["entries"]) + list(m["entries"])
            out[-1] = merged
            continue
        if (prev is not None and m.get("type") == "next_node_idx" and prev.get("type") == "next_node_idx"
                and m["success"] and prev["success"] and not m["reset"] and not prev["reset"]
                and m["next_node_idx"] >= prev["next_node_idx"]):
            out[-1] = m
            continue
        out.append(m)
    return front + out


def skip_known_entries(journal: Sequence[JournalEntry], m: Message) -> Message:
    """Raft's rule that pysyncobj skips: truncate the follower's log only on a conflict.

    pysyncobj cuts everything after ``prevLogIdx`` whenever the follower's log is
    longer, even when the entries it holds are the very ones being sent (a re-send
    after an out-of-date acknowledgement, frequent with pipelining). That re-writes
    entries already applied, and entries past the message's end that this node
    has acknowledged vanish until they are sent again. Leading entries already
    held with the same term are dropped from the message; when nothing new is
    left, it becomes a heartbeat at the end of what matches. Entries up to a
    held entry of the leader's own term match the leader's log (Log Matching:
    one leader per term), so the follower may answer with its whole log then.
    """
    ents = m["entries"]
    if not ents or len(journal) == 0:
        return m
    first, last = journal[0][1], journal[-1][1]
    k = 0
    for _, idx, term in ents:
        if idx > last or (idx >= first and journal[idx - first][2] != term):
            break
        k += 1  # held (or compacted into the dump, so committed and identical)
    if k == 0:
        return m
    out = dict(m)
    if k < len(ents):
        out["prevLogIdx"], out["prevLogTerm"], out["entries"] = ents[k - 1][1], ents[k - 1][2], ents[k:]
    elif journal[-1][2] == m["term"]:
        out["prevLogIdx"], out["prevLogTerm"], out["entries"] = last, m["term"], []
    elif ents[-1][1] >= first:
        out["prevLogIdx"], out["prevLogTerm"], out["entries"] = ents[-1][1], ents[-1][2], []
    else:
        return m
    return out
