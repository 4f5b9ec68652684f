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
"""
from __future__ import annotations

import functools
import io
import logging
import os
import pickle
import socket
import struct
import zlib

import pysyncobj.pickle as pso_pickle
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.transport import TCPTransport

log = logging.getLogger("catalog.raft")

MAX_FRAME = 1 << 20          # bytes on the wire for one message
MAX_MESSAGE = 4 << 20        # bytes after decompression
BATCH_BYTES = 1 << 16        # entry bytes per merged append-entries (= appendEntriesBatchSizeBytes)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name} (plain data only)")


def plain_loads(data) -> object:
    """Unpickle dict/list/tuple/set/str/bytes/int/float/bool/None and nothing else."""
    if isinstance(data, str):
        data = data.encode()
    return _PlainUnpickler(io.BytesIO(data)).load()


def plain_dumps(obj, protocol=None) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _plain_load(f):
    return _PlainUnpickler(f).load()


def _plain_dump(obj, f, protocol=None):
    pickle.dump(obj, f, protocol=5)


def install_plain_pickle() -> None:
    """Process-wide: every pysyncobj (un)pickle goes through the plain-data codec."""
    pso_pickle.loads, pso_pickle.dumps = plain_loads, plain_dumps
    pso_pickle.load, pso_pickle.dump = _plain_load, _plain_dump


class CappedConnection(TcpConnection):
    """A TcpConnection that refuses oversized frames and anything but plain data."""

    def _TcpConnection__processRead(self):
        if len(self._TcpConnection__readBuffer) > MAX_FRAME + 4:
            return False  # parse what we have first; the rest stays in the socket
        return TcpConnection._TcpConnection__processRead(self)

    def _TcpConnection__processParseMessage(self):
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
                rand, message = message
                if rand != self.recvRandKey:
                    raise ValueError("wrong session key")
        except Exception as e:  # noqa: BLE001 - unauthenticated, damaged or not plain data: drop the peer
            log.warning("event=raft_message_refused reason=%r", str(e)[:200])
            self.disconnect()
            return None
        self._TcpConnection__readBuffer = buf[4 + n:]
        return message


class _Server(TcpServer):
    def _TcpServer__onNewConnection(self, descr, event):
        from pysyncobj.poller import POLL_EVENT_TYPE

        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, _ = self._TcpServer__socket.accept()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(0)
                conn = CappedConnection(poller=self._TcpServer__poller, socket=sock,
                                        timeout=self._TcpServer__connectionTimeout,
                                        sendBufferSize=self._TcpServer__sendBufferSize,
                                        recvBufferSize=self._TcpServer__recvBufferSize,
                                        keepalive=self._TcpServer__keepalive)
                self._TcpServer__onNewConnectionCallback(conn)
            except OSError as e:
                if e.errno not in (socket.errno.EAGAIN, socket.errno.EWOULDBLOCK):
                    self.unbind()
                    return
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()


class HardenedTransport(TCPTransport):
    """TCPTransport with the configured bind address, strict handshake and an outbox."""

    def __init__(self, syncObj, selfNode, otherNodes):
        self._outbox: list = []
        super().__init__(syncObj, selfNode, otherNodes)

    def _createServer(self):
        conf = self._syncObj.conf
        if not conf.bindAddress:
            raise RuntimeError("raft: bindAddress must be set (never 0.0.0.0)")
        host, port = conf.bindAddress.rsplit(":", 1)
        host = globalDnsResolver().resolve(host.strip("[]"))
        self._server = _Server(self._syncObj._poller, host, port,
                               onNewConnection=self._onNewIncomingConnection,
                               sendBufferSize=conf.sendBufferSize, recvBufferSize=conf.recvBufferSize,
                               connectionTimeout=conf.connectionTimeout)

    def addNode(self, node):
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

    def _onIncomingMessageReceived(self, conn, message):
        if self._syncObj.encryptor and not conn.sendRandKey:
            if not isinstance(message, bytes) or len(message) != 32:
                return self._refuse(conn, "bad session key")
            conn.sendRandKey = message
            conn.recvRandKey = os.urandom(32)
            conn.send(conn.recvRandKey)
            return
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
        if node is None:  # utility commands and read-only peers are not served
            return self._refuse(conn, "first message is not a member address")
        self._unknownConnections.discard(conn)
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onMessageReceived(self, node, message):
        if isinstance(message, dict) and _plain_ae(message) and message.get("prevLogIdx") is not None:
            message = skip_known_entries(self._syncObj.journal, message)
        super()._onMessageReceived(node, message)

    def _refuse(self, conn, why: str) -> None:
        log.warning("event=raft_peer_refused reason=%r", why)
        conn.disconnect()
        self._unknownConnections.discard(conn)

    # -- outbox --------------------------------------------------------------------------------

    def send(self, node, message):
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        self._outbox.append((node, message))
        return True

    def flush(self, sync) -> None:
        """Send the outbox; ``sync()`` (journal fdatasync) runs before any acknowledgement."""
        out, self._outbox = self._outbox, []
        if any(m.get("type") == "next_node_idx" for _, m in out):
            sync()
        per: dict = {}
        for node, m in out:
            per.setdefault(node, []).append(m)
        for node, msgs in per.items():
            conn = self._connections.get(node)
            for m in coalesce(msgs):
                if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
                    break
                conn.send(m)
        sync()  # the leader counts its own entries only after this (next tick)


def _plain_ae(m) -> bool:
    return m.get("type") == "append_entries" and "entries" in m and "transmission" not in m


def _last_idx(m) -> int:
    return m["entries"][-1][1] if m["entries"] else m["prevLogIdx"]


def coalesce(msgs: list) -> list:
    """Fewer messages, same effect, for one peer (order otherwise kept).

    * apply_command_response moves to the front: a follower learns where its
      command sits before it could apply it (never later than before).
    * adjacent append-entries of one term, each continuing the previous, merge
      while their entries stay under BATCH_BYTES.
    * adjacent plain successful acks keep only the last (highest) one.
    """
    front = [m for m in msgs if m.get("type") == "apply_command_response"]
    out: list = []
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


def skip_known_entries(journal, m: dict) -> dict:
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
