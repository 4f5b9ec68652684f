"""The tables this node has open: each table id's partitions, opened (replayed) once, and
the schema history its rows are decoded with."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rowstore.errors import FencedError
from rowstore.index.key_manifest import Claim
from rowstore.schema import SchemaVersion
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.db.partition import Partition

log = logging.getLogger("rowstore.database")
# async (table definition) -> {pid: epoch} of the partitions this node serves (RFC 0010)
Owns = Callable[[TableDef], Awaitable[dict[int, int]]]


class Table:
    """One table id's partitions (a dropped and re-created name is another Table)."""

    def __init__(self, store: SegmentStore, d: TableDef, owned: dict[int, int] | None = None):
        self.table_id, self.name = d.table_id, d.name
        # the partitions this node serves (RFC 0010: a cluster places them across nodes) and
        # the placement epoch of each (0: no placement); the others exist as objects but are
        # never opened, written, checkpointed or collected here
        self.epochs = dict.fromkeys(range(d.partitions), 0) if owned is None else dict(owned)
        self.owned = set(self.epochs)
        assert d.schema is not None  # the registry opens a table by its newest definition with a schema
        self.kind: str = d.schema.pk.kind
        self.indexed = [c for c in d.schema.columns if c.id in d.indexes]
        self.parts = [Partition(store, d.table_id, p, self.kind, self.indexed) for p in range(d.partitions)]

    def forget_columns(self, schema: SchemaVersion) -> None:
        """Stop indexing columns the schema no longer has."""
        for p in self.served():
            p.columns.forget_missing(schema)

    def served(self) -> list[Partition]:
        return [p for p in self.parts if p.pid in self.owned]

    def serve(self, part: Partition, epoch: int) -> None:
        """``part`` (opened) is served here from now on, at ``epoch``."""
        self.parts[part.pid] = part
        self.owned.add(part.pid)
        self.epochs[part.pid] = epoch

    def unserve(self, pid: int) -> Partition:
        """Stop serving ``pid``: a fresh, unopened object takes its place (returns the old one)."""
        old = self.parts[pid]
        self.owned.discard(pid)
        self.epochs.pop(pid, None)
        self.parts[pid] = Partition(old.store, self.table_id, pid, self.kind, self.indexed)
        return old


class TableRegistry:
    def __init__(self, definitions: TableCatalog, store: SegmentStore, observe: Callable[[int], None]):
        """``observe``: the clock's observe(ts): this node commits above every partition it opens."""
        self.definitions, self.store, self.observe = definitions, store, observe
        self._owns: Owns | None = None  # the partitions served here (None: all, epoch 0)
        self._tables: dict[str, Table] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._defs: dict[str, TableDef] = {}  # table id -> newest definition with a schema
        # table id -> (history, version lookup)
        self._schemas: dict[str, tuple[tuple[int, ...], Callable[[int], SchemaVersion]]] = {}

    async def open(self, owns: Owns | None = None) -> None:
        """Open (replay) every table the catalog lists. In a cluster ``await owns(table_def)``
        names the partitions this node serves (RFC 0010): only those are opened and replayed —
        the others' write-ahead lives on other nodes' block devices — now and whenever a table
        is opened later."""
        self._owns = owns
        for d in await self.definitions.list():
            if owns is None or await owns(d):
                await self.table(d)

    def opened(self) -> list[Table]:
        return list(self._tables.values())

    def partitions(self) -> list[Partition]:
        return [p for t in self._tables.values() for p in t.served()]

    def get(self, table_id: str) -> Table | None:
        return self._tables.get(table_id)

    def definition(self, table_id: str) -> TableDef | None:
        """The newest definition of an opened table id (None: not opened on this node)."""
        return self._defs.get(table_id)

    def names(self) -> dict[str, str]:
        return {tid: d.name for tid, d in self._defs.items()}

    async def table(self, d: TableDef) -> Table:
        """The open table of ``d``'s table id, opening (replaying) it the first time."""
        t = self._tables.get(d.table_id)
        if t is not None:
            return t
        async with self._opening.setdefault(d.table_id, asyncio.Lock()):
            t = self._tables.get(d.table_id)
            if t is None:
                latest = await self.latest_def(d)
                t = Table(self.store, latest, None if self._owns is None else await self._owns(latest))
                assert latest.schema is not None  # Table() checked it
                schemas = await self.schemas_of(latest)
                for p in t.served():
                    try:
                        n = await p.open(schemas, latest.schema, Claim(self.store.node, t.epochs[p.pid]))
                    except FencedError as e:  # a newer server claimed it since the placement was read
                        log.warning("event=partition_not_served table=%s partition=%d reason=%r", d.name, p.pid, e)
                        t.unserve(p.pid)
                        continue
                    self.observe(p.newest_ts)
                    if n:
                        log.info("event=partition_replayed table=%s partition=%d rows=%d", d.name, p.pid, n)
                self._tables[d.table_id] = t
        return t

    def forget(self, table_id: str) -> None:
        """A dropped table being reclaimed: stop maintaining its partitions."""
        self._tables.pop(table_id, None)
        self._defs.pop(table_id, None)
        self._schemas.pop(table_id, None)

    def altered(self, d: TableDef) -> None:
        """A new schema version of ``d``'s table: new lookups, and no index on dropped columns."""
        self._schemas.pop(d.table_id, None)
        t = self._tables.get(d.table_id)
        if t is not None:
            assert d.schema is not None  # an altered table is not dropped
            t.forget_columns(d.schema)
            self._defs[d.table_id] = d

    async def latest_def(self, d: TableDef) -> TableDef:
        """The newest definition of ``d``'s table id that has a schema."""
        cur = self._defs.get(d.table_id)
        if cur is not None and cur.ts >= d.ts:
            return cur
        newest = await self.definitions.newest_with_schema(d)
        self._defs[d.table_id] = newest
        return newest

    async def schemas_of(self, d: TableDef) -> Callable[[int], SchemaVersion]:
        """version id -> SchemaVersion for every version ``d``'s table id has had so far."""
        latest = await self.latest_def(d)
        got = self._schemas.get(d.table_id)
        if got is None or got[0] != latest.history:
            got = (latest.history, await self.definitions.schemas(latest))
            self._schemas[d.table_id] = got
        return got[1]
