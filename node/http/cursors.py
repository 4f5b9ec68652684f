"""Scan cursors (docs/rfcs/0013-measurement-keys.md §4): a scan's request, its snapshot T and
the last key it answered, as an opaque token any node can continue from.

Token: base64url of ``version (1 byte) | payload (JSON) | HMAC-SHA256(key, version|payload)[:16]``.
The key is the cluster's, kept in the catalog (``CURSOR_KEY``: 32 random bytes, written once by
the first node that needs it, by compare-and-set), so a cursor made on one node is accepted by
every other — and one that was altered, truncated or made up is refused (400
``invalid_cursor``), never read as another scan."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from typing import Any

from catalog.abc import Catalog, Check, Put
from node.errors import ApiError
from terrafs.catalog_ops import commit

CURSOR_KEY = "cursor/key"  # catalog key of the cluster's cursor key
VERSION = 1
MAC_BYTES = 16
MAX_CURSOR = 64 << 10  # a cursor carries its scan's where/bbox: bounded like a request body


@dataclass(frozen=True)
class Cursor:
    """Where a scan stands: its table (by id: a table dropped and made again is another), its
    snapshot, its request, and the last key it answered (an int for int64 keys, else bytes)."""

    table_id: str
    T: int
    request: dict[str, Any]  # prefix, start, end, where, bbox, columns, limit
    last: int | bytes

    def payload(self) -> bytes:
        last: dict[str, Any] = {"i": self.last} if isinstance(self.last, int) else {"b": self.last.hex()}
        return json.dumps({"t": self.table_id, "T": self.T, "q": self.request, "k": last},
                          separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def of(cls, payload: bytes) -> Cursor:
        doc = json.loads(payload)
        k = doc["k"]
        last: int | bytes = int(k["i"]) if "i" in k else bytes.fromhex(k["b"])
        if not isinstance(doc["t"], str) or not isinstance(doc["T"], int) or not isinstance(doc["q"], dict):
            raise ValueError("fields of the wrong type")
        return cls(doc["t"], doc["T"], doc["q"], last)


class CursorKeys:
    """The cluster's cursor key, read (or made) once per process."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._key: bytes | None = None

    async def key(self) -> bytes:
        if self._key is None:
            e = await self.catalog.get(CURSOR_KEY)
            if e is None:
                await commit(self.catalog, [Check(CURSOR_KEY, 0)], [Put(CURSOR_KEY, os.urandom(32))])
                e = await self.catalog.get(CURSOR_KEY)  # ours, or another node's made first
            assert e is not None  # written above (or by another node first)
            self._key = e.value
        return self._key

    async def seal(self, c: Cursor) -> str:
        body = bytes([VERSION]) + c.payload()
        mac = hmac.new(await self.key(), body, hashlib.sha256).digest()[:MAC_BYTES]
        return base64.urlsafe_b64encode(body + mac).decode().rstrip("=")

    async def open(self, token: object) -> Cursor:
        """The cursor ``token`` stands for, or 400 ``invalid_cursor``."""
        if not isinstance(token, str) or not token or len(token) > MAX_CURSOR:
            raise _bad("a cursor is the string a scan answered as \"next\"")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise _bad("the cursor is not base64url") from None
        body, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if len(raw) <= MAC_BYTES + 1 or body[0] != VERSION:
            raise _bad("the cursor is cut short or of an unknown version")
        want = hmac.new(await self.key(), body, hashlib.sha256).digest()[:MAC_BYTES]
        if not hmac.compare_digest(mac, want):
            raise _bad("the cursor was not made by this cluster, or was changed")
        try:
            return Cursor.of(body[1:])
        except (ValueError, KeyError, TypeError):
            raise _bad("the cursor's content is malformed") from None


def _bad(why: str) -> ApiError:
    return ApiError(400, "invalid_cursor", why)
