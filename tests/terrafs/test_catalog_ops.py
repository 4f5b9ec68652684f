"""A transaction whose reply is lost (a timeout, a leader change) is resolved by request id."""
from catalog.abc import Check, Put
from catalog.errors import CatalogTimeoutError
from catalog.memory import MemoryCatalog
from terrafs.catalog_ops import commit


class LossyCatalog(MemoryCatalog):
    """Applies the transaction, then 'loses' the reply the first ``lose`` times."""

    def __init__(self, lose: int, apply_first: bool):
        super().__init__()
        self.lose, self.apply_first, self.calls = lose, apply_first, 0

    async def txn(self, checks=(), ops=(), *, request_id=None):
        self.calls += 1
        if self.lose > 0:
            self.lose -= 1
            if self.apply_first:
                await super().txn(checks, ops, request_id=request_id)
            raise CatalogTimeoutError("reply lost")
        return await super().txn(checks, ops, request_id=request_id)


async def test_committed_but_reply_lost_is_not_applied_twice():
    c = LossyCatalog(lose=1, apply_first=True)
    c.lose = 0
    await c.txn(ops=[Put("n", b"0")])
    c.lose = 1
    r = await commit(c, [Check("n", 1)], [Put("n", b"1")])
    assert r.committed and r.revision == 2 and await c.revision() == 2


async def test_lost_before_apply_is_retried_once():
    c = LossyCatalog(lose=1, apply_first=False)
    r = await commit(c, [Check("k", 0)], [Put("k", b"v")])
    assert r.committed and await c.revision() == 1 and (await c.get("k")).value == b"v"


async def test_a_timed_out_transaction_is_never_reported_as_not_applied():
    """Applied, its reply lost; then the catalog is unavailable (no quorum) when the outcome is
    asked for: the caller gets "outcome unknown" (CatalogTimeoutError), never the bare
    "unavailable" that says the transaction was not applied (and may be undone by its caller)."""
    import pytest
    from catalog.errors import CatalogUnavailableError

    c = LossyCatalog(lose=1, apply_first=True)

    async def no_quorum(rid):
        raise CatalogUnavailableError("no quorum; not applied")
    c.outcome = no_quorum
    with pytest.raises(CatalogTimeoutError, match="outcome unknown"):
        await commit(c, [Check("k", 0)], [Put("k", b"v")])
    assert (await c.get("k")).value == b"v"  # it did apply
