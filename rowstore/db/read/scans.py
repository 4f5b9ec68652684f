"""Ordered scans, mixed into :class:`rowstore.db.read.reader.Reader` (docs/rfcs/0013): one page
of rows in key order from one partition or merged from several, read in rounds of the key
index that grow until the page is full — never a whole range at once; ``ScanPage`` and
``merge_pages`` are also how pages of several nodes are merged."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rowstore.db.read.context import ReadContext, check_columns, check_limit, where_of
from rowstore.db.partition import Partition
from rowstore.db.registry import Table
from rowstore.errors import UnavailableError
from rowstore.reads.predicates import BBox, Term, batch_mask, parse_bbox
from rowstore.schema import SchemaVersion
from rowstore.segments.fetch import fetch
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableDef
from rowstore.tables.key_check import Key, check_prefix
from rowstore.tables.keys import KeyRange, key_range, partition_of_key

_MAX_ROUND = 1 << 20  # index entries a scan's round reads per source, at most


class Scans:
    """Pages of rows in key order (state: the reader's ``store``)."""

    store: SegmentStore  # the reader's (rowstore.db.read.reader.Reader)

    if TYPE_CHECKING:  # the reader's method used here
        async def context(self, name: str, as_of: int | None, trusted: bool = False,
                          leased: bool = True) -> ReadContext: ...

    async def scan(self, name: str, prefix: object = None, start: object = None, end: object = None,
                   after: int | bytes | None = None, where: list[Any] | None = None,
                   bbox: dict[str, Any] | None = None, columns: list[str] | None = None, limit: int = 10_000,
                   as_of: int | None = None, partitions: list[int] | None = None,
                   trusted: bool = False) -> ScanPage:
        """One page of an ordered scan (docs/rfcs/0013): the rows visible at T whose key starts
        with ``prefix`` and lies in ``[start, end)`` (each a leading run of the key's components),
        after the encoded key ``after`` (a cursor's), matching ``where``/``bbox``, in key order,
        at most ``limit``. ``partitions``: only those (a scan across nodes asks each node for
        its own); otherwise every partition served here — or only the one a prefix naming the
        whole partition key picks."""
        c = await self.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        pk = c.d.schema.pk
        terms, box = c.terms(where), parse_bbox(c.d.schema, bbox)
        check_columns(c.d.schema, columns)
        check_limit(limit)
        pre = check_prefix(prefix, pk, "prefix")
        rng = key_range(pk, pre, check_prefix(start, pk, "start") or None, check_prefix(end, pk, "end") or None)
        if after is not None:
            rng = rng.after(after)  # type: ignore[arg-type]  # a cursor's key is of the table's kind
        pids = partitions if partitions is not None else self.scan_partitions(c.d, pre, c.table)
        if any(p not in c.table.owned for p in pids):
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(pids) - c.table.owned)} are not "
                                   "served by this node")
        if rng.empty() or limit == 0 or not pids:
            return merge_pages([], limit, c.d.schema, columns, c.T)
        if len(pids) == 1:
            t, k, more = await self._scan_partition(c, c.table.parts[pids[0]], rng, terms, box, limit)
            page = ScanPage(t, k, c.T, more)
        else:
            page = await self._merged(c, pids, rng, terms, box, limit)
        return ScanPage(page.rows.select(columns) if columns is not None else page.rows, page.keys, c.T, page.more)

    async def _merged(self, c: ReadContext, pids: list[int], rng: KeyRange[int] | KeyRange[bytes],
                      terms: list[Term], box: BBox | None, limit: int) -> ScanPage:
        """A page of several partitions merged in key order, each read in rounds of a share of
        the page: rows below the smallest last key of the partitions not exhausted are final
        (none of those partitions holds a smaller key it has not read), so each row is read
        about once — not every partition's whole page to keep one partition's share of it."""
        schema = c.d.schema
        assert schema is not None  # a described table
        per = max(2 * limit // len(pids), 64)
        bufs: dict[int, tuple[pa.Table, np.ndarray]] = {}
        ranges: dict[int, KeyRange[int] | KeyRange[bytes]] = dict.fromkeys(pids, rng)
        done: set[int] = set()
        out: list[ScanPage] = []
        n = 0
        while n < limit:
            for p in pids:
                if p not in done and (p not in bufs or not len(bufs[p][1])):
                    t, k, more = await self._scan_partition(c, c.table.parts[p], ranges[p], terms, box, per)
                    bufs[p] = (t, k)
                    if more and len(k):
                        last: Any = int(k[-1]) if k.dtype == np.uint64 else bytes(k[-1])  # the range's key type
                        ranges[p] = ranges[p].after(last)
                    else:
                        done.add(p)
            live = [p for p in pids if len(bufs[p][1])]
            if not live:
                break
            open_ = [bufs[p][1][-1] for p in pids if p not in done]
            cut = min(open_) if open_ else None
            final: list[ScanPage] = []
            for p in live:
                t, k = bufs[p]
                j = len(k) if cut is None else int(np.searchsorted(k, cut, "right"))
                final.append(ScanPage(t.slice(0, j), k[:j], c.T, False))
                bufs[p] = (t.slice(j), k[j:])
            page = merge_pages(final, limit - n, schema, None, c.T)
            out.append(page)
            n += page.rows.num_rows
            if page.more:  # the merged rows ran past the page: rows are left
                break
        left = n >= limit and (len(done) < len(pids) or any(len(bufs[p][1]) for p in pids))
        merged = merge_pages(out, limit, schema, None, c.T) if len(out) > 1 else out[0] if out else \
            merge_pages([], limit, schema, None, c.T)
        return ScanPage(merged.rows, merged.keys, c.T, left or merged.more)

    def scan_partitions(self, d: TableDef, prefix: Sequence[Key], table: Table | None = None) -> list[int]:
        """The partitions a scan reads: the one its prefix picks when the prefix covers the
        partition key, else all (of those served here, given ``table``)."""
        assert d.schema is not None  # a described table
        pk = d.schema.pk
        if len(prefix) >= pk.partition_columns:
            return [partition_of_key(pk, prefix, d.partitions)]
        return sorted(table.owned) if table is not None else list(range(d.partitions))

    async def _scan_partition(self, c: ReadContext, part: Partition, rng: KeyRange[int] | KeyRange[bytes],
                              terms: list[Term], box: BBox | None, limit: int) -> tuple[pa.Table, np.ndarray, bool]:
        """Up to ``limit`` matching rows of one partition in key order, their encoded keys, and
        whether it may hold more: rounds of the key index (``scan_chunk``), growing, until the
        page is full or the range ends — never the whole range at once."""
        schema = c.d.schema
        assert schema is not None  # a described table
        batches: list[pa.RecordBatch] = []
        keys: list[np.ndarray] = []
        n, entries = 0, max(2 * limit, 1024)
        rest: KeyRange[int] | KeyRange[bytes] | None = rng
        while rest is not None and n < limit:
            vis, nxt = await part.index.scan_chunk(rest, c.T, entries)
            if nxt is not None and not len(vis) and (nxt.lo, nxt.lo_inc) == (rest.lo, rest.lo_inc):
                entries *= 4  # one key's versions fill a round: read further
                continue
            rest, entries = nxt, min(2 * entries, _MAX_ROUND)
            if not len(vis):
                continue
            batch, ks = await self._in_key_order(c, part, vis.rowids), vis.keys
            if terms or box is not None:
                m = np.asarray(batch_mask(batch, terms, box), bool)
                batch, ks = batch.filter(pa.array(m)), ks[m]
            take = min(limit - n, batch.num_rows)
            batches.append(batch.slice(0, take))
            keys.append(ks[:take])
            n += take
            if take < batch.num_rows:
                return pa.Table.from_batches(batches), np.concatenate(keys), True
        table = pa.Table.from_batches(batches, schema=schema.arrow())
        return table, np.concatenate(keys) if keys else _no_keys(part.kind), rest is not None

    async def _in_key_order(self, c: ReadContext, part: Partition, rowids: np.ndarray) -> pa.RecordBatch:
        """The rows of ``rowids`` (in key order) in that order: fetched in rowid order, put back
        unless the rowids rise already (a source's readings are appended in time order)."""
        assert c.d.schema is not None  # a described table
        if len(rowids) < 2 or bool((rowids[1:] > rowids[:-1]).all()):
            return (await fetch(self.store, rowids, c.schemas, c.d.schema, where_of(c, part))).batch
        order = np.argsort(rowids, kind="stable")
        rows = await fetch(self.store, rowids[order], c.schemas, c.d.schema, where_of(c, part))
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        return rows.batch.take(pa.array(inv))


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: its rows (key order, the asked columns), their encoded keys, the
    snapshot, and whether rows may follow the last one (a full page: continue after it)."""

    rows: pa.Table
    keys: np.ndarray
    T: int
    more: bool

    @property
    def last(self) -> int | bytes | None:
        """The encoded key of the page's last row (where the next page starts after)."""
        if not len(self.keys):
            return None
        k = self.keys[-1]
        return int(k) if self.keys.dtype == np.uint64 else bytes(k)


def _no_keys(kind: str) -> np.ndarray:
    return np.zeros(0, np.uint64 if kind == "int64" else "S1")


def merge_pages(pages: list[ScanPage], limit: int, schema: SchemaVersion, columns: list[str] | None,
                T: int) -> ScanPage:
    """Pages of several partitions (or nodes) at one T merged in key order, cut to ``limit``:
    rows may follow when any page was full or rows were cut."""
    full = [p for p in pages if p.rows.num_rows]
    more = any(p.more for p in pages)
    if not full:
        empty = schema.arrow().empty_table()
        return ScanPage(empty.select(columns) if columns is not None else empty, _no_keys(schema.pk.kind), T, more)
    t = pa.concat_tables([p.rows for p in full], promote_options="default")
    keys = np.concatenate([p.keys for p in full])
    more = more or t.num_rows > limit
    if len(full) > 1:
        order = np.argsort(keys, kind="stable")[:limit]
        t, keys = t.take(pa.array(order)), keys[order]
    return ScanPage(t.slice(0, limit), keys[:limit], T, more)
