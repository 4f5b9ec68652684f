"""Read leases: while one is unexpired, the garbage collector must not delete its segments
(``lease/<id>``: expiry in ms since the epoch and the segment ids)."""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

from catalog.abc import Catalog, Check, Delete, Put
from rowstore.errors import ConflictError, ReadLeaseExpiredError
from terrafs.catalog_ops import commit
from terrafs.entropy import SYSTEM, Entropy

LEASE_PREFIX = "lease/"


class Leases:
    def __init__(self, catalog: Catalog, now_ms: Callable[[], int] | None = None, entropy: Entropy = SYSTEM):
        """``entropy``: where a lease without a request id draws its name."""
        self.catalog, self.entropy = catalog, entropy
        self.now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)  # the wall clock (injectable)

    async def acquire(self, segids: list[int], ttl_s: float, request_id: str | None = None) -> str:
        """A new lease on ``segids`` for ``ttl_s``. With a ``request_id`` (the client's, one per
        read plan), every acquire of that id takes the same lease: a repeat — a client retrying
        a plan whose answer it lost — extends it to ``ttl_s`` from now and adds its segments,
        so a retried plan leaves no second lease behind."""
        if request_id is None:
            lease = self.entropy.token(8)
            key = LEASE_PREFIX + lease
            await commit(self.catalog, [Check(key, 0)], [Put(key, self._body(segids, ttl_s))])
            return lease
        lease = hashlib.blake2b(request_id.encode(), digest_size=8, person=b"terrascale-lease").hexdigest()
        key = LEASE_PREFIX + lease
        for _ in range(16):
            e = await self.catalog.get(key)
            if e is None:
                check, body = Check(key, 0), self._body(segids, ttl_s)
            else:
                d = json.loads(e.value)
                d["segids"] = sorted(set(d["segids"]) | set(segids))
                d["expires_ms"] = max(d["expires_ms"], int(self.now_ms() + ttl_s * 1000))
                check, body = Check(key, e.version), json.dumps(d).encode()
            if (await commit(self.catalog, [check], [Put(key, body)])).committed:
                return lease
        raise ConflictError(f"lease {lease} changed concurrently")

    def _body(self, segids: list[int], ttl_s: float) -> bytes:
        return json.dumps({"expires_ms": int(self.now_ms() + ttl_s * 1000), "segids": segids}).encode()

    async def renew(self, lease: str, ttl_s: float) -> None:
        """Extend an unexpired lease to ``ttl_s`` from now. An expired one is refused: from
        its expiry on, the collector may have taken its segments. Renewals racing each
        other (readers of one plan) all succeed."""
        for _ in range(16):
            e = await self.catalog.get(LEASE_PREFIX + lease)
            if e is None:
                raise ReadLeaseExpiredError(f"lease {lease} expired or released")
            d = json.loads(e.value)
            now_ms = self.now_ms()
            if d["expires_ms"] <= now_ms:
                raise ReadLeaseExpiredError(f"lease {lease} expired")
            d["expires_ms"] = max(d["expires_ms"], int(now_ms + ttl_s * 1000))
            res = await commit(self.catalog, [Check(e.key, e.version)], [Put(e.key, json.dumps(d).encode())])
            if res.committed:
                return
        raise ConflictError(f"lease {lease} changed concurrently")

    async def release(self, lease: str) -> None:
        await commit(self.catalog, [], [Delete(LEASE_PREFIX + lease)])

    async def leased_segments(self) -> set[int]:
        """Segments an unexpired lease protects (for the garbage collector)."""
        now, out = self.now_ms(), set()
        for e in await self.catalog.scan(LEASE_PREFIX):
            d = json.loads(e.value)
            if d["expires_ms"] > now:
                out.update(d["segids"])
        return out
