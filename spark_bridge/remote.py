"""The node endpoints the bridge calls (node/http/routes/bridge.py, docs/openapi.yaml), over
``node.client.Client``: one short-lived client per caller, since a Client is not thread-safe."""
from __future__ import annotations

import json
import time
from urllib.parse import quote

import pyarrow as pa

from node.client.client import Client
from node.client.endpoints import ARROW_STREAM, read_arrow
from node.errors import ApiError
from spark_bridge.errors import BridgeError
from spark_bridge.options import Options

_RETRY_STATUSES = {502, 503, 504}


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

    def _call(self, method: str, path: str, doc=None, arrow: bool = False, body: bytes | None = None,
              content_type: str | None = None, retries: int = 0):
        """One request; ``retries`` more attempts (with backoff) when the node cannot be reached
        or is not ready — only for requests that are safe to repeat."""
        if doc is not None:
            body, content_type = json.dumps(doc).encode(), "application/json"
        for attempt in range(retries + 1):
            try:
                status, data, headers = self.client.request(method, path, body, content_type,
                                                            ARROW_STREAM if arrow else None)
            except ConnectionError as e:
                if attempt < retries:
                    time.sleep(min(0.2 * 2 ** attempt, 5))
                    continue
                raise BridgeError(f"cannot reach the Terrascale node {self.opts.endpoint}: {e}") from e
            if status in _RETRY_STATUSES and attempt < retries:
                time.sleep(min(0.2 * 2 ** attempt, 5))
                continue
            if status >= 400:
                _raise_api(status, data, f"{method} {path}")
            return (read_arrow(data), headers) if arrow else json.loads(data)
        raise AssertionError("unreachable")

    def snapshot(self, as_of: int | None) -> dict:
        q = "" if as_of is None else f"?as_of={as_of}"
        return self._call("GET", f"/v1/tables/{self._t}/snapshot{q}", retries=3)

    def plan(self, as_of: int, where, bbox, sealed_only: bool, lease_s: float) -> dict:
        doc = {"as_of": as_of, "sealed_only": sealed_only, "lease_s": lease_s}
        doc.update({k: v for k, v in (("where", where), ("bbox", bbox)) if v is not None})
        return self._call("POST", f"/v1/tables/{self._t}/plan", doc, retries=3)

    def tail(self, partition: int, as_of: int, where, bbox, sealed: list[int]) -> pa.Table:
        doc = {"partition": partition, "as_of": as_of, "sealed": sealed}
        doc.update({k: v for k, v in (("where", where), ("bbox", bbox)) if v is not None})
        return self._call("POST", f"/v1/tables/{self._t}/tail", doc, arrow=True, retries=3)[0]

    def changes(self, after: int, upto: int) -> pa.Table:
        return self._call("POST", f"/v1/tables/{self._t}/changes", {"after": after, "upto": upto}, arrow=True,
                          retries=3)[0]

    def renew(self, lease: str, ttl_s: float) -> None:
        self._call("POST", f"/v1/leases/{quote(lease, safe='')}/renew", {"ttl_s": ttl_s}, retries=2)

    def describe(self) -> dict:
        return self._call("GET", f"/v1/tables/{self._t}", retries=3)

    def upsert(self, batch: pa.RecordBatch) -> dict:
        """One atomic, durable upsert. Repeating it is harmless (rows replace themselves by
        key), so it is retried when the node cannot be reached."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        return self._call("POST", f"/v1/tables/{self._t}/rows", body=sink.getvalue().to_pybytes(),
                          content_type=ARROW_STREAM, retries=4)


def _raise_api(status: int, data: bytes, what: str):
    try:
        err = json.loads(data)["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", data[:200].decode(errors="replace")
    raise BridgeError(f"{what}: the node answered {status} {code}: {message}") from ApiError(status, code, message)
