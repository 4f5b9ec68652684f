"""What both Python clients keep of a subscription across reconnects
(docs/rfcs/0015-subscriptions.md §5), apart from how its frames travel (``Client``:
server-sent events over ``http.client``; ``AsyncClient``: a WebSocket over aiohttp).

A subscription hands on a change only once a ``{"closed": T}`` frame covers it, so that a
reconnect from the last closed T — after a dropped connection, a node restart, or the node
ending the subscription (a slow subscriber, a schema change) — yields every change exactly
once. Items are the node's: ``{"op", "commit_ts", "row"}`` for a change, ``{"closed": T}``
once every change at or below T has been yielded."""
from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote, urlencode

from catalog.retry import Retry
from node.errors import ApiError, NodeError

# the node ended the subscription for one of these: resume from the last closed T
RESUMABLE = frozenset({"slow_subscriber", "stopping", "unavailable", "schema_changed", "moved"})
# answers to a (re)connect that are worth another attempt: the node starts, stops, or is full
RETRY_STATUS = frozenset({429, 502, 503, 504})
BACKOFF = Retry(attempts=None, base=0.2, cap=5.0)
EVENT_STREAM = "text/event-stream"


class Resumed(NodeError):
    """Raised inside a client's read loop when the node ended the subscription in a way its
    subscriber resumes from (``RESUMABLE``); never seen by callers."""


class Resume:
    """A subscription's filter, its last closed T, and the changes no closed frame covers yet."""

    def __init__(self, table: str, where: Any = None, bbox: Any = None, prefix: Any = None, columns: Any = None,
                 from_ts: int | None = None, retry_for: float = 300.0):
        self.table, self.closed, self.retry_for = table, from_ts, retry_for
        self.params = {k: json.dumps(v) for k, v in (("where", [list(t) for t in where] if where else None),
                                                     ("bbox", bbox), ("prefix", prefix),
                                                     ("columns", list(columns) if columns else None))
                       if v is not None}
        self._pending: list[dict[str, Any]] = []
        self._data: list[bytes] = []  # the data lines of the event being read
        self._failures = 0
        self._since = time.monotonic()  # the last frame (or the start): retries stop retry_for after it

    def path(self) -> str:
        """The subscribe path, from the last closed T (the caller's ``from_ts`` before any)."""
        q = dict(self.params, **({"from": str(self.closed)} if self.closed is not None else {}))
        return f"/v1/tables/{quote(self.table, safe='')}/subscribe" + (f"?{urlencode(q)}" if q else "")

    def line(self, raw: bytes) -> list[dict[str, Any]]:
        """One line of the event stream: the items an event it ends releases."""
        raw = raw.rstrip(b"\r\n")
        if raw.startswith(b"data:"):
            self._data.append(raw[5:].removeprefix(b" "))
        elif not raw and self._data:
            text, self._data = b"\n".join(self._data), []
            return self.frame(text)
        return []  # id: and event: lines say nothing the data does not

    def frame(self, text: str | bytes) -> list[dict[str, Any]]:
        """One frame: the items it releases (changes a closed frame now covers, then the closed)."""
        doc = json.loads(text)
        self._failures, self._since = 0, time.monotonic()
        if isinstance(doc, list):
            self._pending.extend(doc)
            return []
        if "closed" in doc:
            out, self._pending = self._pending + [doc], []
            self.closed = doc["closed"]
            return out
        err = doc["error"]
        self._pending = []
        if err["code"] in RESUMABLE:
            raise Resumed(err["code"])
        raise ApiError(404 if err["code"] == "table_dropped" else 500, err["code"], err["message"])

    def broken(self, error: Exception) -> float:
        """The connection broke or was refused (``error``): the seconds to wait before the next
        attempt — or ``error`` raised when it is not worth one, or retries ran ``retry_for``."""
        self._pending, self._data = [], []  # what no closed frame covered comes again after the reconnect
        if isinstance(error, ApiError) and error.status not in RETRY_STATUS:
            raise error
        if time.monotonic() - self._since > self.retry_for:
            raise error
        self._failures += 1
        return 0.0 if isinstance(error, Resumed) and self._failures == 1 else BACKOFF.delay(self._failures)
