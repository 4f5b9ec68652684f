"""Catalog transactions with retry-safe outcomes.

Every transaction carries a fresh request id. If the call times out (a Raft
leader change, say), the outcome is asked for by id instead of guessing, so
a transaction that did commit is never applied twice nor reported failed.
"""
from __future__ import annotations

import asyncio
from typing import Sequence

from catalog.abc import Catalog, Check, Op, TxnResult
from catalog.errors import CatalogTimeoutError, CatalogUnavailableError

_OUTCOME_POLLS = 50


async def commit(catalog: Catalog, checks: Sequence[Check], ops: Sequence[Op]) -> TxnResult:
    """Run one transaction; on a timeout, learn its outcome by request id."""
    rid = catalog.request_id()
    try:
        return await catalog.txn(checks, ops, request_id=rid)
    except CatalogTimeoutError:
        pass
    delay = 0.01
    for _ in range(_OUTCOME_POLLS):
        try:
            got = await catalog.outcome(rid)
            if got is not None:
                return got
            # Unknown: retrying with the same id is safe (applied at most once).
            return await catalog.txn(checks, ops, request_id=rid)
        except CatalogTimeoutError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        except CatalogUnavailableError as e:  # unavailable now, not "not applied": the timed-out
            raise CatalogTimeoutError(f"transaction {rid}: outcome unknown ({e})") from e  # attempt may have
    raise CatalogTimeoutError(f"transaction {rid}: outcome still unknown")
