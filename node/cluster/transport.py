"""The replication messages' wire form (docs/format/replication.md) and the leader's HTTP
transport: a leader's appends sent to a follower's ``/v1/internal/repl/append``. The follower's
endpoints are :mod:`node.http.routes.replication`."""
from __future__ import annotations

import asyncio
import json
import struct

from node.cluster.members import Cluster
from node.errors import ApiError
from rowstore.errors import FencedError
from rowstore.replication.follower import Piece
from rowstore.replication.leader import Transport
from rowstore.replication.position import Position

_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20
PROMISED = "X-Terrascale-Promised"  # a fenced answer: the epoch the replica promised


def encode(header: dict, data: list[bytes]) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_LEN.pack(len(head)), head, *data])


def decode(body: bytes) -> tuple[dict, list[Piece]]:
    """The header and its pieces, checked against the body (400 on any mismatch)."""
    if len(body) < 4:
        raise ApiError(400, "bad_request", "a replication message starts with its header's length")
    (n,) = _LEN.unpack_from(body)
    if n > MAX_HEADER or 4 + n > len(body):
        raise ApiError(400, "bad_request", "the header length runs past the body")
    try:
        h = json.loads(body[4 : 4 + n])
        if not isinstance(h, dict) or not isinstance(h.get("table"), str):
            raise ValueError("not an object with a table id")
        for k in ("pid", "epoch", "base"):
            if isinstance(h.get(k), bool) or not isinstance(h.get(k), int) or not 0 <= h[k] < 2**31:
                raise ValueError(f"{k} is not a small integer")
        start = Position.of(h.get("start"))
        h.setdefault("clock", 0)  # the leader's present (absent from an older leader)
        if isinstance(h["clock"], bool) or not isinstance(h["clock"], int) or not 0 <= h["clock"] < 2**63:
            raise ValueError("clock is not a timestamp")
        pieces, at = [], 4 + n
        for p in h.get("pieces", []):
            segid, seq, off, ln = p
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p) or segid >= 2**32:
                raise ValueError(f"bad piece {p!r}"[:100])
            if at + ln > len(body):
                raise ValueError("a piece runs past the body")
            pieces.append(Piece(segid, seq, off, memoryview(body)[at : at + ln]))
            at += ln
        if at != len(body):
            raise ValueError("bytes after the last piece")
    except (ValueError, TypeError, KeyError) as e:
        raise ApiError(400, "bad_request", f"not a replication message: {e}"[:300]) from None
    h["start"] = start
    return h, pieces


class HttpTransport(Transport):
    """A leader's appends over the internal HTTP endpoint, with a per-call deadline."""

    def __init__(self, cluster: Cluster, timeout_s: float):
        self.cluster, self.timeout_s = cluster, timeout_s

    async def append(self, node: str, header: dict, data: list[bytes]) -> dict:
        body = encode(header, data)
        status, headers, payload = await asyncio.wait_for(
            self.cluster.call(node, "POST", "/v1/internal/repl/append", body=body,
                              headers={"Content-Type": "application/octet-stream"}), self.timeout_s)
        try:
            doc = json.loads(payload)
        except ValueError:
            doc = {}
        if status == 409 and doc.get("error", {}).get("code") == "fenced":
            raise FencedError(doc["error"]["message"], int(headers.get(PROMISED, "0") or 0))
        if status != 200:
            raise ConnectionError(f"node {node} answered {status} to an append: {payload[:200]!r}")
        return doc
