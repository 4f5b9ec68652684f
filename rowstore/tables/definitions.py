"""Table definitions with schema history in the catalog (docs/rfcs/0003-time-travel.md).

Keys per table name:

* ``tbl/<name>/head`` — the commit ts of the newest version (a compare-and-set
  point, so concurrent changes to one table serialize);
* ``tbl/<name>/v/<ts:016x>`` — the definition as of that ts: table id,
  partitions, indexed column ids, the :class:`SchemaVersion`, or a drop marker.

A read as of T takes the newest version with ts <= T. Dropping writes a
marker version, so the table's past stays readable until the horizon; a
re-created table gets a new table id and its own schema versions.
"""
from __future__ import annotations

import dataclasses
import json
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from catalog.abc import Catalog, Check, Entry, Put
from rowstore.errors import ConflictError, SchemaError, TableExistsError, TableNotFoundError
from rowstore.hlc import HybridClock
from rowstore.schema import Column, SchemaVersion, _check_name, parse_schema
from rowstore.types import CLUSTERABLE
from terrafs.catalog_ops import commit
from terrafs.entropy import SYSTEM, Entropy

MAX_PARTITIONS = 256


@dataclass(frozen=True)
class Retention:
    """A table's retention (docs/rfcs/0016-time-series-aggregates.md §5): at read timestamp T,
    a row whose ``column`` (a not-null timestamp or date) is older than T's wall time minus
    ``keep_us`` is invisible. Part of the versioned definition, so a read as of T applies the
    setting of T."""

    column: int  # column id
    keep_us: int

    def to_json(self) -> dict[str, int]:
        return {"column": self.column, "keep_us": self.keep_us}

    @classmethod
    def from_json(cls, d: dict[str, int] | None) -> "Retention | None":
        return None if d is None else cls(int(d["column"]), int(d["keep_us"]))


@dataclass(frozen=True)
class TableDef:
    name: str
    table_id: str
    partitions: int
    indexes: tuple[int, ...]  # column ids
    schema: SchemaVersion | None  # None: dropped
    ts: int
    history: tuple[int, ...] = ()  # every schema version id this table id has had, oldest first
    cluster_by: int | None = None  # column id whose order the garbage collector writes rows in (RFC 0009)
    retention: Retention | None = None  # rows older than this are invisible (RFC 0016 §5)

    @property
    def cluster_column(self) -> Column | None:
        """The ``cluster_by`` column (None: the primary key orders copies)."""
        return self.schema.by_id(self.cluster_by) if self.schema and self.cluster_by is not None else None

    @property
    def dropped(self) -> bool:
        return self.schema is None

    def index_names(self) -> list[str]:
        return [c.name for c in self.schema.columns if c.id in self.indexes] if self.schema else []

    def to_bytes(self) -> bytes:
        return json.dumps({"table_id": self.table_id, "partitions": self.partitions,
                           "indexes": list(self.indexes), "history": list(self.history),
                           "cluster_by": self.cluster_by,
                           "retention": self.retention.to_json() if self.retention else None,
                           "schema": self.schema.to_json() if self.schema else None}).encode()

    @classmethod
    def from_entry(cls, name: str, ts: int, raw: bytes) -> "TableDef":
        d = json.loads(raw)
        schema = SchemaVersion.from_json(d["schema"]) if d["schema"] else None
        return cls(name, d["table_id"], d["partitions"], tuple(d["indexes"]), schema, ts,
                   tuple(d.get("history", ())), d.get("cluster_by"), Retention.from_json(d.get("retention")))


def _vkey(name: str, ts: int) -> str:
    return f"tbl/{name}/v/{ts:016x}"


class TableCatalog:
    def __init__(self, catalog: Catalog, clock: HybridClock, entropy: Entropy = SYSTEM):
        self.catalog, self.clock, self.entropy = catalog, clock, entropy  # table ids drawn from entropy
        self._versions: dict[tuple[str, int], SchemaVersion] = {}  # (table id, version) -> schema
        self._hist: dict[str, list[TableDef]] = {}  # name -> versions, oldest first
        self.generation = 0  # bumped whenever cached versions are forgotten (any table changed)

    async def describe(self, name: str, as_of: int | None = None) -> TableDef:
        """The definition at ``as_of`` (default: now); TableNotFoundError if absent or dropped."""
        d = await self._at(name, as_of)
        if (d is None or d.dropped) and name in self._hist:
            # cached: another node may have (re)created it since, and creation is not announced
            fresh = await self._read_versions(name)
            if fresh != self._hist.get(name):
                self.forget(name)
                self._hist[name] = fresh
                d = await self._at(name, as_of)
        if d is None or d.dropped:
            raise TableNotFoundError(f"no table {name!r}" + (f" as of {as_of}" if as_of else ""))
        return d

    async def _at(self, name: str, as_of: int | None) -> TableDef | None:
        hist = await self.history(name)
        if as_of is not None:
            hist = hist[: bisect_right([d.ts for d in hist], as_of)] if hist and hist[-1].ts > as_of else hist
        return hist[-1] if hist else None

    async def history(self, name: str) -> list[TableDef]:
        """Every version of the name, oldest first. Cached: every change on this node goes
        through :meth:`_write`, which refreshes it (with several nodes, changes made elsewhere
        are picked up by :meth:`forget` — the cluster issue wires a catalog watch to it)."""
        hist = self._hist.get(name)
        if hist is None:
            hist = self._hist[name] = await self._read_versions(name)
        return hist

    async def _read_versions(self, name: str) -> list[TableDef]:
        return [TableDef.from_entry(name, int(e.key.rsplit("/", 1)[1], 16), e.value)
                for e in await self.catalog.scan(f"tbl/{name}/v/")]

    async def newest_with_schema(self, d: TableDef) -> TableDef:
        """The newest definition of ``d``'s table id that has a schema, read from the catalog
        (a dropped table's rows are still decoded with its last schema)."""
        newest = d
        for td in await self._read_versions(d.name):
            if td.table_id == d.table_id and td.schema is not None and td.ts >= newest.ts:
                newest = td
        return newest

    def forget(self, name: str | None = None) -> None:
        self.generation += 1
        if name is None:
            self._hist.clear()
        else:
            self._hist.pop(name, None)

    async def list(self, as_of: int | None = None) -> list[TableDef]:
        names = sorted({e.key.split("/")[1] for e in await self.catalog.scan("tbl/") if e.key.endswith("/head")})
        out = []
        for n in names:
            d = await self._at(n, as_of)
            if d is not None and not d.dropped:
                out.append(d)
        return out

    async def create(self, name: str, schema: str | SchemaVersion, indexes: Sequence[str] = (),
                     partitions: int = 8, cluster_by: str | None = None,
                     retention: Callable[[SchemaVersion], Retention | None] | None = None) -> TableDef:
        """``retention``: the table's retention from its schema (checked there), or None."""
        _check_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise SchemaError(f"partitions must be 1..{MAX_PARTITIONS}")
        sv = parse_schema(schema) if isinstance(schema, str) else schema
        idx = _index_ids(sv, indexes)
        cluster = _cluster_id(sv, cluster_by)
        head = await self.catalog.get(f"tbl/{name}/head")
        cur = await self._at(name, None)
        if cur is not None and not cur.dropped:
            raise TableExistsError(f"table {name!r} exists")
        keep = retention(sv) if retention is not None else None
        d = TableDef(name, self.entropy.uuid_hex(), partitions, idx, sv, 0, (sv.version,), cluster, keep)
        return await self._write(name, d, head)

    async def set_retention(self, name: str, retention: Callable[[SchemaVersion], Retention | None]) -> TableDef:
        """A new definition version with the retention ``retention(current schema)`` (None: none)."""
        head = await self.catalog.get(f"tbl/{name}/head")
        cur = await self.describe(name)
        assert cur.schema is not None  # describe() never returns a dropped table
        return await self._write(name, dataclasses.replace(cur, retention=retention(cur.schema)), head)

    async def alter(self, name: str, change: Callable[[SchemaVersion], SchemaVersion]) -> TableDef:
        """A new schema version from ``change(current)`` (add/drop/rename column)."""
        head = await self.catalog.get(f"tbl/{name}/head")
        cur = await self.describe(name)
        assert cur.schema is not None  # describe() never returns a dropped table
        sv = change(cur.schema)
        idx = tuple(i for i in cur.indexes if sv.by_id(i) is not None)  # a dropped column leaves its index
        cluster = cur.cluster_by if cur.cluster_by is not None and sv.by_id(cur.cluster_by) is not None else None
        if cur.retention is not None and sv.by_id(cur.retention.column) is None:
            col = cur.schema.by_id(cur.retention.column)
            raise SchemaError(f"column {col.name if col else cur.retention.column!r} holds table {name!r}'s "
                              "retention: remove the retention first")
        d = TableDef(name, cur.table_id, cur.partitions, idx, sv, 0, cur.history + (sv.version,), cluster,
                     cur.retention)
        return await self._write(name, d, head)

    async def drop(self, name: str) -> TableDef:
        head = await self.catalog.get(f"tbl/{name}/head")
        cur = await self.describe(name)
        d = TableDef(name, cur.table_id, cur.partitions, (), None, 0, cur.history, cur.cluster_by, cur.retention)
        return await self._write(name, d, head)

    async def _write(self, name: str, d: TableDef, head: Entry | None) -> TableDef:
        ts = await self.clock.now()
        d = dataclasses.replace(d, ts=ts)
        res = await commit(self.catalog, [Check(f"tbl/{name}/head", head.version if head else 0)],
                           [Put(f"tbl/{name}/head", str(ts).encode()), Put(_vkey(name, ts), d.to_bytes())])
        self.forget(name)
        if not res.committed:
            raise ConflictError(f"table {name!r} changed concurrently; retry")
        return d

    async def schemas(self, d: TableDef) -> Callable[[int], SchemaVersion]:
        """version id -> SchemaVersion for rows of table ``d`` (every version it ever had)."""
        missing = [v for v in d.history if (d.table_id, v) not in self._versions]
        if missing:
            for e in await self.catalog.scan(f"tbl/{d.name}/v/"):
                td = TableDef.from_entry(d.name, 0, e.value)
                if td.table_id == d.table_id and td.schema is not None:
                    self._versions[(d.table_id, td.schema.version)] = td.schema

        def lookup(v: int) -> SchemaVersion:
            try:
                return self._versions[(d.table_id, v)]
            except KeyError:
                raise SchemaError(f"table {d.name!r} has no schema version {v}") from None

        return lookup


def _index_ids(sv: SchemaVersion, names: Iterable[str]) -> tuple[int, ...]:
    ids = []
    for n in names:
        c = sv.by_name(n)
        if c is None:
            raise SchemaError(f"cannot index unknown column {n!r}")
        ids.append(c.id)
    return tuple(dict.fromkeys(ids))


def _cluster_id(sv: SchemaVersion, name: str | None) -> int | None:
    """The column id of ``cluster_by`` (None: the primary key); a clear error if unusable."""
    if name is None or sv.pk.names == [name]:
        return None
    col = next((c for c in sv.columns if c.name == name), None)
    if col is None:
        raise SchemaError(f"cluster_by: no column {name!r}")
    if col.type.kind not in CLUSTERABLE:
        raise SchemaError(f"cluster_by: column {name!r} of type {col.type} cannot order rows "
                          f"(use a point, box, timestamp, date or number column)")
    return col.id
