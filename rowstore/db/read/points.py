"""Point reads, mixed into :class:`rowstore.db.read.reader.Reader`: one key (``get``) or many
keys each by the scalar path (``get_dicts``) — one index walk and one row read per key, the
table as a point read needs it kept between reads of the present, and nothing awaited when
everything is in memory."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rowstore.codec.point_decoder import PointDecoder
from rowstore.db.read.context import check_columns
from rowstore.db.partition import Partition
from rowstore.db.registry import TableRegistry
from rowstore.db.tasks import BackgroundTasks
from rowstore.errors import UnavailableError
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.reads.retention import oldest_kept
from rowstore.tables.key_check import INT64_MAX, INT64_MIN, check_key_tuple
from rowstore.tables.keys import encode_one, key_and_partition, partition_one
from rowstore.timeline import Timeline

_COLD_READS = 16  # a multi-get's reads of keys not in memory, in flight at once


@dataclass(frozen=True)
class _PointTable:
    """A table as a point read needs it (plain attributes: read on every get)."""

    gen: int  # the table catalog's generation it was built in
    d: TableDef
    kind: str
    parts: list[Partition]
    nparts: int
    decode: PointDecoder
    owned: set[int]  # the table's partitions served here (the registry's set: it changes in place)


class PointReads:
    """Reads of rows by key, one at a time (state: the reader's ``store``, ``definitions``,
    ``tables``, ``timeline``, ``tasks``, ``leases_of`` and ``_points``)."""

    # the reader's state read and set here (rowstore.db.read.reader.Reader)
    store: SegmentStore
    definitions: TableCatalog
    tables: TableRegistry
    timeline: Timeline
    tasks: BackgroundTasks
    leases_of: Callable[[str, Iterable[int], int], Awaitable[None] | None]
    _points: dict[str, _PointTable]  # name -> what a point read at the present needs

    if TYPE_CHECKING:  # the reader's methods used here
        async def snapshot(self, as_of: int | None = None, trusted: bool = False) -> int: ...

        @staticmethod
        def _present(T: int) -> int: ...

    async def get(self, name: str, key: object, as_of: int | None = None) -> dict[str, Any] | None:
        """The row with primary key ``key`` as of T (columns and names of T), or None.

        The scalar path: no arrays, one index walk, one row read, one struct unpack; with
        everything it needs in memory, no coroutine is awaited."""
        pt = self._points.get(name) if as_of is None else None
        if pt is not None and pt.gen == self.definitions.generation and self.timeline.floor <= self.timeline.visible:
            T = self._present(self.timeline.visible)
            if pt.d.ts > T:  # the newest definition is not visible yet
                T, pt = await self._point_table(name, as_of)
        else:
            T, pt = await self._point_table(name, as_of)
        k, pid = _point_key(pt, key)
        if pid not in pt.owned:
            raise UnavailableError(f"table {name!r}: partition {pid} is not served by this node")
        if (wait := self.leases_of(pt.d.table_id, (pid,), T)) is not None:
            await wait
        part = pt.parts[pid]
        rowid = part.index.get_cached(k, T)
        if rowid is None:
            rowid = await part.index.get(k, T)
        if part.index.consolidation_due:
            self.tasks.spawn(part.index.merge_memtable())
        if rowid == 0:
            return None
        schema = pt.d.schema
        assert schema is not None  # describe() refuses a dropped table
        row = self.store.row_cached(rowid, schema, pt.decode) or await self.store.row(
            rowid, schema, pt.decode, f"table {name!r} partition {pid}")
        return None if pt.d.retention is not None and _aged(row, pt.d, T) else row

    async def get_dicts(self, name: str, keys: Sequence[object], as_of: int | None = None,
                        columns: list[str] | None = None) -> tuple[int, list[dict[str, Any] | None]]:
        """The rows of many keys at one T, in the order asked (None: no row), by the scalar path
        of :meth:`get` for each: random keys land in as many segments as keys, where a point
        read's cached blocks and generated decoder beat a vectorized gather per segment. Every
        key is checked before any is read (one bad key: nothing is read)."""
        T, pt = await self._point_table(name, as_of)
        assert pt.d.schema is not None  # _point_table() checked it
        check_columns(pt.d.schema, columns)
        located = [_point_key(pt, k) for k in keys]
        missing = sorted({pid for _, pid in located} - pt.owned)
        if missing:
            raise UnavailableError(f"table {name!r}: partitions {missing} are not served by this node")
        if (wait := self.leases_of(pt.d.table_id, {pid for _, pid in located}, T)) is not None:
            await wait
        schema = pt.d.schema
        out: list[dict[str, Any] | None] = [None] * len(located)
        cold: list[int] = []  # keys whose index page or row's block (or pages) is not in memory
        for i, (k, pid) in enumerate(located):
            rowid = pt.parts[pid].index.get_cached(k, T)
            # a columnar row from its decoded pages, a row-wise one from its block (as ``get``)
            hit = self.store.row_cached(rowid, schema, pt.decode) if rowid else None
            if rowid is None or (rowid and hit is None):
                cold.append(i)
            elif hit is not None and not (pt.d.retention is not None and _aged(hit, pt.d, T)):
                out[i] = _project(hit, columns)

        async def read(i: int, gate: asyncio.Semaphore) -> None:
            async with gate:
                k, pid = located[i]
                rowid = await pt.parts[pid].index.get(k, T)
                if rowid:
                    row = await self.store.row(rowid, schema, pt.decode, f"table {name!r} partition {pid}")
                    if not (pt.d.retention is not None and _aged(row, pt.d, T)):
                        out[i] = _project(row, columns)
        if cold:  # their reads overlap: each waits on an object or the disk cache, off the loop
            gate = asyncio.Semaphore(_COLD_READS)
            async with asyncio.TaskGroup() as tg:
                for i in cold:
                    tg.create_task(read(i, gate))
        return T, out

    async def _point_table(self, name: str, as_of: int | None) -> tuple[int, _PointTable]:
        """The read timestamp and the table as point reads need it; kept for reads at the
        present while the catalog's generation stands and the definition is the newest."""
        gen = self.definitions.generation
        T = await self.snapshot(as_of)
        d = await self.definitions.describe(name, T)
        table = self.tables.get(d.table_id) or await self.tables.table(d)
        assert d.schema is not None  # describe() refuses a dropped table
        pt = _PointTable(gen, d, table.kind, table.parts, len(table.parts),
                         PointDecoder(await self.tables.schemas_of(d), d.schema), table.owned)
        if as_of is None and await self.definitions.describe(name) is d:
            self._points[name] = pt
        return T, pt


def _aged(row: dict[str, Any], d: TableDef, T: int) -> bool:
    """Whether the table's retention hides ``row`` at T."""
    oldest = oldest_kept(d, T)
    return oldest is not None and row[oldest[0]] < oldest[1]


def _project(row: dict[str, Any], columns: list[str] | None) -> dict[str, Any]:
    return row if columns is None else {c: row[c] for c in columns}


def _point_key(pt: _PointTable, key: object) -> tuple[int | bytes, int]:
    """One user key, checked against its columns' types, as the index's scalar, and its partition."""
    assert pt.d.schema is not None  # _point_table() checked it
    pk = pt.d.schema.pk
    if pk.kind == "int64" and type(key) is int and INT64_MIN <= key <= INT64_MAX:  # the common case, first
        k: int | bytes = encode_one(key, "int64")
        return k, partition_one(k, pt.nparts)
    return key_and_partition(pk, check_key_tuple(key, pk), pt.nparts)
