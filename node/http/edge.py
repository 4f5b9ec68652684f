"""The HTTP edge's error translation: every failure a handler raises becomes one answer of
the documented shape ``{"error": {"code", "message"}}`` (docs/openapi.yaml), here and only
here; nothing else reaches a client, never a traceback. The node's log gets the traceback of
every kind of 500 (``CrashLog``)."""
from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable

from aiohttp import web

from catalog.errors import (CatalogError, CatalogTimeoutError, CatalogUnavailableError,
                            InvalidTransactionError)
from node.cluster.router import Misdirected
from node.errors import ApiError
from node.http.answers import json_answer
from rowstore.errors import (ConflictError, FutureTimestampError, HistoryPurgedError, InvalidKeyError,
                             ReadLeaseExpiredError, QueryError,
                             RowstoreError, RowValidationError, SchemaError, TableExistsError, TableNotFoundError,
                             UnavailableError)
from terrafs.errors import ClosedError, DeviceError, MirrorError, TerrafsError, TransientStorageError, no_space

log = logging.getLogger("terrascale.node")

# engine error -> (status, code); the first matching class wins (subclasses before bases)
_ERRORS = [
    (InvalidKeyError, 400, "bad_request"), (QueryError, 400, "invalid_query"),
    (RowValidationError, 400, "invalid_rows"),
    (SchemaError, 400, "invalid_schema"), (InvalidTransactionError, 400, "invalid_request"),
    (TableNotFoundError, 404, "table_not_found"), (TableExistsError, 409, "table_exists"),
    (ReadLeaseExpiredError, 409, "lease_expired"), (ConflictError, 409, "conflict"),
    (FutureTimestampError, 409, "future_timestamp"),
    (HistoryPurgedError, 410, "history_purged"), (UnavailableError, 503, "unavailable"),
    (CatalogTimeoutError, 503, "unavailable"), (CatalogUnavailableError, 503, "unavailable"),
]
_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
               415: "unsupported_media_type"}


def error(status: int, code: str, message: str) -> web.Response:
    return json_answer({"error": {"code": code, "message": message}}, status=status)


def _where(e: BaseException) -> str:
    """file:line of the innermost frame: where a failure happened, to tell repeats apart."""
    tb = traceback.extract_tb(e.__traceback__)
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"


class CrashLog:
    """Every 500: its full traceback once per kind of failure (exception type and innermost
    frame) per ``every_s``; the repeats in between are counted and the count is logged with
    the next traceback, so a failing hot path logs a few lines a minute, not one per request."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (logged at, repeats since)

    def failed(self, request: web.Request, e: BaseException, event: str) -> None:
        kind = (type(e).__name__, _where(e))
        now = self.clock()
        at, repeats = self._last.get(kind, (float("-inf"), 0))
        if now - at < self.every_s:
            self._last[kind] = (at, repeats + 1)
            return
        if len(self._last) > 1024:  # many kinds: forget the old ones rather than grow
            self._last.clear()
        self._last[kind] = (now, 0)
        log.error("event=%s path=%s error=%r at=%s repeats_unlogged=%d", event, request.path, e, kind[1], repeats,
                  exc_info=(type(e), e, e.__traceback__))


CRASHES = CrashLog()


def one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:1000]


def answer(request: web.Request, exc: Exception) -> web.Response:
    """The error answer for ``exc`` raised while serving ``request`` (a redirect re-raised)."""
    full = no_space(exc)
    if full is not None:  # the block device is full: nothing of the request was acknowledged
        log.warning("event=no_space path=%s error=%r", request.path, full)
        return error(507, "insufficient_storage", f"{one_line(full)}; writes resume by themselves once space is "
                     "freed (offload, GC) or added; reads go on")
    try:
        raise exc
    except ApiError as e:  # a handler's answer, or another node's (RemoteError) as it gave it
        return error(e.status, e.code, e.message)
    except Misdirected as e:  # sent here by a node with an older map: it retries
        return error(421, "misdirected", str(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error(e.status, _HTTP_CODES.get(e.status, "http_error"), e.reason)
    except (RowstoreError, CatalogError) as e:
        for cls, status, code in _ERRORS:
            if isinstance(e, cls):
                return error(status, code, one_line(e))
        CRASHES.failed(request, e, "request_failed")
        return error(500, "storage_error" if isinstance(e, RowstoreError) else "catalog_error", one_line(e))
    except (MirrorError, ClosedError) as e:  # this node stopped leading the partition (or shuts down) mid-request
        return error(503, "unavailable", one_line(e))
    except DeviceError as e:  # the block device failed a write (EIO): nothing acknowledged; others lead soon
        log.warning("event=device_failed path=%s error=%r", request.path, e)
        return error(503, "unavailable", f"{one_line(e)}; the write was not acknowledged and may or may not be "
                     "applied (upserts are safe to retry); a replicated partition's other replicas take over, and "
                     "this node writes again by itself once its device works")
    except TransientStorageError as e:  # a store that does not answer now (it names itself): retry later
        log.warning("event=store_unavailable path=%s error=%r", request.path, e)
        return error(503, "unavailable", f"a store does not answer now; retry later: {one_line(e)}")
    except TerrafsError as e:
        CRASHES.failed(request, e, "request_failed")
        return error(500, "storage_error", one_line(e))
    except (ConnectionError, OSError, asyncio.TimeoutError) as e:
        log.warning("event=request_failed path=%s error=%r", request.path, e)
        return error(503, "unavailable", one_line(e))
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback to the client
        CRASHES.failed(request, e, "request_crashed")
        return error(500, "internal", type(e).__name__)
