"""Peer-to-peer id allocation from a catalog table of free ranges.

The seed's inode algorithm (docs/format/terrafs.md §4): each row is a free
range ``[lo, hi)``; to allocate, pick a row at random, take its lowest id and
replace the row in one transaction (which also carries the caller's own
writes, e.g. the new file's row). Freeing merges the id back into its
neighbours. Ranges are disjoint, so a version check on the picked row is
enough to make concurrent allocators never hand out the same id. The table
starts as ``stripes`` adjacent ranges so random picks rarely collide.
Used for inodes (``fs``) and segment ids (``rowstore``).
"""
from __future__ import annotations

import asyncio
import json
import random
from typing import Callable, Sequence

from catalog.abc import Catalog, Check, Delete, Entry, Op, Put
from terrafs.catalog_ops import commit
from terrafs.errors import CatalogConflictError, TerrafsError

Extra = Callable[[int], tuple[Sequence[Check], Sequence[Op]]]
_MAX_ATTEMPTS = 200


class IdsExhaustedError(TerrafsError):
    """Raised when no free id is left in the range table."""


class DoubleFreeError(TerrafsError):
    """Raised when freeing an id that is already free."""


class RangeAllocator:
    def __init__(self, catalog: Catalog, prefix: str, lo: int, hi: int, stripes: int = 64,
                 rng: random.Random | None = None):
        """``rng``: the picks and backoff delays (default: unseeded)."""
        self.catalog, self.prefix, self.lo, self.hi, self.stripes = catalog, prefix, lo, hi, stripes
        self._rng = rng or random.Random()

    def _key(self, lo: int) -> str:
        return f"{self.prefix}/free/{lo:08x}"

    @staticmethod
    def _val(lo: int, hi: int) -> bytes:
        return json.dumps({"lo": lo, "hi": hi}).encode()

    @staticmethod
    def _range(e: Entry) -> tuple[int, int]:
        d = json.loads(e.value)
        return d["lo"], d["hi"]

    async def init(self) -> None:
        """Create the table once (whoever commits first wins; others see it done)."""
        marker = f"{self.prefix}/init"
        if await self.catalog.get(marker) is not None:
            return
        step = max((self.hi - self.lo) // self.stripes, 1)
        bounds = list(range(self.lo, self.hi, step)) + [self.hi]
        ops: list[Op] = [Put(marker, b"1")]
        ops += [Put(self._key(a), self._val(a, b)) for a, b in zip(bounds, bounds[1:]) if a < b]
        await commit(self.catalog, [Check(marker, 0)], ops)

    async def _pick(self) -> Entry | None:
        r = self._rng.randrange(self.lo, self.hi)
        got = await self.catalog.scan(f"{self.prefix}/free/", start=self._key(r), limit=1)
        if not got:
            got = await self.catalog.scan(f"{self.prefix}/free/", limit=1)
        return got[0] if got else None

    async def reserve(self) -> tuple[int, list[Check], list[Op]]:
        """Pick a free id without taking it: the checks/ops that take it, for a caller's txn.

        The ops only commit if the picked range row is unchanged, so combining
        several reservations (an inode and a segid, say) in one txn is safe.
        """
        row = await self._pick()
        if row is None:
            raise IdsExhaustedError(f"no free ids left in {self.prefix}")
        lo, hi = self._range(row)
        ops: list[Op] = [Delete(row.key)]
        if lo + 1 < hi:
            ops.append(Put(self._key(lo + 1), self._val(lo + 1, hi)))
        return lo, [Check(row.key, row.version)], ops

    async def allocate(self, extra: Extra | None = None) -> int:
        """Take a free id; ``extra(id)`` adds checks/ops committed in the same txn."""
        for attempt in range(_MAX_ATTEMPTS):
            lo, checks, ops = await self.reserve()
            row_key = checks[0].key
            ec, eo = extra(lo) if extra else ((), ())
            res = await commit(self.catalog, checks + list(ec), ops + list(eo))
            if res.committed:
                return lo
            if row_key not in res.conflicts:  # the range row was as picked: the caller's own checks failed
                raise CatalogConflictError(f"allocation of {self.prefix} id {lo}: "
                                           f"caller's checks failed on {res.conflicts}")
            # another allocation took the row first — and with it, often, what the caller's
            # checks guard for this id (its file row): try another pick
            await asyncio.sleep(self._rng.random() * min(0.001 * 2**attempt, 0.05))
        raise CatalogConflictError(f"could not allocate from {self.prefix} after {_MAX_ATTEMPTS} tries")

    async def release(self, ident: int) -> tuple[list[Check], list[Op]]:
        """The checks/ops that return ``ident`` to the table (for a caller's txn)."""
        prev_l = await self.catalog.scan(f"{self.prefix}/free/", end=self._key(ident + 1),
                                         limit=1, reverse=True)
        nxt = await self.catalog.get(self._key(ident + 1))
        return self._merge(ident, prev_l[0] if prev_l else None, nxt)

    async def free(self, ident: int, checks: Sequence[Check] = (), ops: Sequence[Op] = ()) -> int:
        """Return ``ident`` to the table, merged with its neighbours, with the caller's ops;
        the revision that committed them."""
        for attempt in range(_MAX_ATTEMPTS):
            c, o = await self.release(ident)
            res = await commit(self.catalog, c + list(checks), o + list(ops))
            if res.committed:
                return res.revision
            mine = {ch.key for ch in c}
            if any(k not in mine for k in res.conflicts):
                raise CatalogConflictError(f"free of {self.prefix} id {ident}: caller's checks "
                                           f"failed on {res.conflicts}")
            await asyncio.sleep(self._rng.random() * min(0.001 * 2**attempt, 0.05))
        raise CatalogConflictError(f"could not free {self.prefix} id {ident}")

    def _merge(self, ident: int, prev: Entry | None, nxt: Entry | None) -> tuple[list[Check], list[Op]]:
        checks = [Check(self._key(ident + 1), nxt.version if nxt else 0)]
        ops: list[Op] = []
        lo, hi = ident, ident + 1
        if prev is not None:
            plo, phi = self._range(prev)
            if plo <= ident < phi:
                raise DoubleFreeError(f"{self.prefix} id {ident} is already free")
            checks.append(Check(prev.key, prev.version))
            if phi == ident:
                lo = plo
        if nxt is not None:
            hi = self._range(nxt)[1]
            ops.append(Delete(nxt.key))
        if lo == ident:
            checks.append(Check(self._key(ident), 0))
        ops.append(Put(self._key(lo), self._val(lo, hi)))
        return checks, ops

    async def free_ranges(self) -> list[tuple[int, int]]:
        return [self._range(e) for e in await self.catalog.scan(f"{self.prefix}/free/")]
