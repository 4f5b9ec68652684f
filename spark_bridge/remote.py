"""The node endpoints the bridge calls (node/http/routes/bridge.py, docs/openapi.yaml), over
``node.client.Client``: one short-lived client per caller, since a Client is not thread-safe.

Every call here is safe to repeat, so each is retried (``catalog.retry``) while the node
cannot be reached or answers 502/503/504: snapshots, descriptions, tails and change feeds
are reads; a plan carries a fresh request id, so a repeat shares the first attempt's lease
instead of taking a second; a renewal sets an expiry (and renewals racing each other, 409
``conflict``, are retried too); an upsert replaces rows by key. An expired lease is told by
its code, ``lease_expired``, never by the message.
"""
from __future__ import annotations

import uuid
from urllib.parse import quote

import pyarrow as pa

from catalog.retry import Retry, call
from node.client.client import Client
from node.client.endpoints import ARROW_STREAM, Request
from node.errors import ApiError
from spark_bridge.errors import BridgeError, LeaseExpiredError
from spark_bridge.options import Options

UNAVAILABLE = {502, 503, 504}  # the node (or a proxy before it) is down, starting or failing over
READ = Retry(attempts=4, base=0.2, cap=5.0)
WRITE = Retry(attempts=5, base=0.2, cap=5.0)
RENEW = Retry(attempts=9, base=0.02, cap=1.0)  # tasks of one job renew one lease at the same moments


def _unavailable(e: Exception) -> bool:
    return isinstance(e, ConnectionError) or (isinstance(e, ApiError) and e.status in UNAVAILABLE)


def _unavailable_or_racing(e: Exception) -> bool:
    return _unavailable(e) or (isinstance(e, ApiError) and e.code == "conflict")


class Remote:
    def __init__(self, opts: Options):
        self.opts = opts
        self.client = Client(opts.endpoint, opts.token, timeout=opts.timeout_s)
        self._t = quote(opts.table, safe="")

    def close(self) -> None:
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, req: Request, policy: Retry, retryable=_unavailable):
        """``req``, retried as ``policy`` allows; every failure ends as a BridgeError (an error
        answer's ApiError is its cause)."""
        def once():
            status, data, _ = self.client.request(req.method, req.path, req.body, req.content_type, req.accept)
            return req.result(status, data)

        try:
            return call(once, retryable, policy)
        except ConnectionError as e:
            raise BridgeError(f"cannot reach the Terrascale node {self.opts.endpoint}: {e}") from e
        except ApiError as e:
            raise BridgeError(f"{req.method} {req.path}: the node answered {e.status} {e.code}: {e.message}") from e

    def snapshot(self, as_of: int | None) -> dict:
        q = "" if as_of is None else f"?as_of={as_of}"
        return self._call(Request("GET", f"/v1/tables/{self._t}/snapshot{q}"), READ)

    def plan(self, as_of: int, where, bbox, sealed_only: bool, lease_s: float) -> dict:
        doc = {"as_of": as_of, "sealed_only": sealed_only, "lease_s": lease_s, "request_id": uuid.uuid4().hex}
        doc.update({k: v for k, v in (("where", where), ("bbox", bbox)) if v is not None})
        return self._call(Request.of("POST", f"/v1/tables/{self._t}/plan", doc), READ)

    def tail(self, partition: int, as_of: int, where, bbox, sealed: list[int]) -> pa.Table:
        doc = {"partition": partition, "as_of": as_of, "sealed": sealed}
        doc.update({k: v for k, v in (("where", where), ("bbox", bbox)) if v is not None})
        return self._call(Request.of("POST", f"/v1/tables/{self._t}/tail", doc, answer="arrow"), READ)

    def changes(self, after: int, upto: int) -> pa.Table:
        doc = {"after": after, "upto": upto}
        return self._call(Request.of("POST", f"/v1/tables/{self._t}/changes", doc, answer="arrow"), READ)

    def renew(self, lease: str, ttl_s: float) -> None:
        """Extend the read lease to ``ttl_s`` from now, or raise LeaseExpiredError: once it has
        expired (or was released) the collector may have taken its segments."""
        req = Request.of("POST", f"/v1/leases/{quote(lease, safe='')}/renew", {"ttl_s": ttl_s})
        try:
            self._call(req, RENEW, _unavailable_or_racing)
        except BridgeError as e:
            if isinstance(e.__cause__, ApiError) and e.__cause__.code == "lease_expired":
                raise LeaseExpiredError(
                    f"the read lease {lease} expired (or was released) before this task renewed it, so the "
                    f"segments of the snapshot may have been garbage-collected; load the DataFrame again "
                    f"(a DataFrame keeps its snapshot and lease; option lease_s sets how long the lease "
                    f"outlives the last read)") from None
            raise

    def describe(self) -> dict:
        return self._call(Request("GET", f"/v1/tables/{self._t}"), READ)

    def upsert(self, batch: pa.RecordBatch) -> dict:
        """One atomic, durable upsert. Repeating it is harmless (rows replace themselves by
        key), so it is retried when the node cannot be reached."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        body = sink.getvalue().to_pybytes()
        return self._call(Request("POST", f"/v1/tables/{self._t}/rows", body, ARROW_STREAM), WRITE)
