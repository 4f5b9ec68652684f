"""Versioned table schemas with stable column ids.

A column's id never changes and is never reused: a rename keeps it, a drop
retires it, and re-adding a column of the same name gets a new id (so old
rows never show up under the new column — the Persist seed's example). Every
change makes a new :class:`SchemaVersion`; rows name the version they were
written with (docs/format/segment.md §1).
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from dataclasses import field as dc_field

import pyarrow as pa

from rowstore.errors import SchemaError
from rowstore.types import KEY_KINDS, LOGICAL_KEY, MAX_KEY_COLUMNS, PRIMARY_KEY_KINDS, ColumnType

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
MAX_COLUMNS = 1024


@dataclass(frozen=True, slots=True)
class Column:
    id: int
    name: str
    type: ColumnType
    nullable: bool = True

    def field(self) -> pa.Field:
        return _field(self)


@functools.lru_cache(maxsize=4096)
def _field(c: Column) -> pa.Field:
    """A column's Arrow field, built once (every point write asks for its columns')."""
    meta = {LOGICAL_KEY: str(c.type).encode(), b"terrascale.column_id": str(c.id).encode()}
    return pa.field(c.name, c.type.arrow(), nullable=c.nullable, metadata=meta)


@dataclass(frozen=True, slots=True)
class PrimaryKey:
    """A table's primary key (docs/format/keys.md): its columns in key order and how many of
    them, leading, the partition hash covers. Its ``kind`` names the encoding: one column of
    int64, string or uuid keeps its single-column encoding; any other key is a tuple."""

    columns: tuple[Column, ...]
    partition_columns: int = 1

    @property
    def kind(self) -> str:
        if len(self.columns) == 1 and self.columns[0].type.kind in PRIMARY_KEY_KINDS:
            return self.columns[0].type.kind.value
        return "tuple"

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.columns)

    @property
    def partition_names(self) -> list[str]:
        return self.names[: self.partition_columns]


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    version: int
    columns: tuple[Column, ...]
    primary_key: tuple[int, ...]  # column ids, in key order (an int is read as a key of one column)
    next_column_id: int
    partition_key: int = 1  # how many leading key columns the partition hash covers
    _ids: dict[int, Column] = dc_field(init=False, repr=False, compare=False, hash=False)  # id -> Column
    _names: dict[str, Column] = dc_field(init=False, repr=False, compare=False, hash=False)  # name -> Column
    _pk: PrimaryKey = dc_field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.primary_key, int):
            object.__setattr__(self, "primary_key", (self.primary_key,))
        object.__setattr__(self, "_ids", {c.id: c for c in self.columns})
        object.__setattr__(self, "_names", {c.name: c for c in self.columns})
        names = [c.name for c in self.columns]
        if len(set(n.lower() for n in names)) != len(names):
            raise SchemaError("column names must be unique (case-insensitively)")
        if len(self.columns) > MAX_COLUMNS:
            raise SchemaError(f"at most {MAX_COLUMNS} columns")
        object.__setattr__(self, "_pk", PrimaryKey(self._key_columns(), self.partition_key))

    def _key_columns(self) -> tuple[Column, ...]:
        ids = self.primary_key
        if not ids or len(ids) > MAX_KEY_COLUMNS or len(set(ids)) != len(ids):
            raise SchemaError(f"the primary key is 1 to {MAX_KEY_COLUMNS} distinct columns")
        cols = []
        for cid in ids:
            c = self.by_id(cid)
            if c is None:
                raise SchemaError("the primary key columns must be among the columns")
            if c.type.kind not in KEY_KINDS:
                raise SchemaError(f"primary key column {c.name!r} cannot be of type {c.type} (key columns are "
                                  "integers, string, binary, uuid, timestamp, date or bool)")
            if c.nullable:
                raise SchemaError(f"primary key column {c.name!r} cannot be nullable")
            cols.append(c)
        if isinstance(self.partition_key, bool) or not 1 <= self.partition_key <= len(cols):
            raise SchemaError(f"the partition key is 1 to {len(cols)} leading primary key columns")
        return tuple(cols)

    def by_id(self, cid: int) -> Column | None:
        return self._ids.get(cid)

    def by_name(self, name: str) -> Column | None:
        return self._names.get(name) if isinstance(name, str) else None

    @property
    def pk(self) -> PrimaryKey:
        return self._pk

    def arrow(self) -> pa.Schema:
        return pa.schema([c.field() for c in self.columns])

    # -- evolution (each returns the next version) -------------------------------------

    def add_column(self, name: str, type_text: str) -> "SchemaVersion":
        _check_name(name)
        if self.by_name(name):
            raise SchemaError(f"column {name!r} already exists")
        col = Column(self.next_column_id, name, ColumnType.parse(type_text), True)
        return replace(self, version=self.version + 1, columns=self.columns + (col,),
                       next_column_id=self.next_column_id + 1)

    def drop_column(self, name: str) -> "SchemaVersion":
        col = self._existing(name)
        if col.id in self.primary_key:
            raise SchemaError(f"cannot drop the primary key column {name!r}")
        return replace(self, version=self.version + 1,
                       columns=tuple(c for c in self.columns if c.id != col.id))

    def rename_column(self, old: str, new: str) -> "SchemaVersion":
        col = self._existing(old)
        _check_name(new)
        if self.by_name(new):
            raise SchemaError(f"column {new!r} already exists")
        return replace(self, version=self.version + 1, columns=tuple(
            replace(c, name=new) if c.id == col.id else c for c in self.columns))

    def _existing(self, name: str) -> Column:
        col = self.by_name(name)
        if col is None:
            raise SchemaError(f"no column {name!r}")
        return col

    # -- persistence ---------------------------------------------------------------------

    def to_json(self) -> str:
        doc: dict[str, object] = {"version": self.version, "primary_key": _ids_json(self.primary_key),
                                  "next_column_id": self.next_column_id,
                                  "columns": [{"id": c.id, "name": c.name, "type": str(c.type),
                                               "nullable": c.nullable} for c in self.columns]}
        if self.partition_key != 1:
            doc["partition_key"] = self.partition_key
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> "SchemaVersion":
        d = json.loads(text)
        cols = tuple(Column(c["id"], c["name"], ColumnType.parse(c["type"]), c["nullable"])
                     for c in d["columns"])
        pk = d["primary_key"]
        return cls(d["version"], cols, tuple(pk) if isinstance(pk, list) else (pk,), d["next_column_id"],
                   d.get("partition_key", 1))


def _ids_json(ids: tuple[int, ...]) -> int | list[int]:
    """A key of one column as its id (as schemas were written before composite keys)."""
    return ids[0] if len(ids) == 1 else list(ids)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SchemaError(f"invalid column name {name!r}: letters, digits, _; not starting with a digit")


_KEY_CLAUSE = re.compile(r"^primary\s+key\s*\((.*)\)$", re.I | re.S)


def parse_schema(text: str, version: int = 1, partition_key: int = 1) -> SchemaVersion:
    """Parse the CLI form ``'id int64 primary key, ts timestamp, loc point, name string'``, or
    with a key of several columns ``'sensor string, ts timestamp, v float64, primary key
    (sensor, ts)'``; key columns are not null."""
    specs: list[tuple[str, str, bool, bool]] = []  # (name, type, marked primary key, not null)
    clause: list[str] | None = None
    for part in (p.strip() for p in _split(text)):
        m = _KEY_CLAUSE.match(part)
        if m:
            if clause is not None:
                raise SchemaError("one 'primary key (...)' clause")
            clause = [n.strip() for n in m.group(1).split(",")]
            continue
        words = part.split()
        if len(words) < 2:
            raise SchemaError(f"column {part!r}: expected 'NAME TYPE [primary key] [not null]'")
        name, rest = words[0], " ".join(words[1:])
        is_pk = bool(re.search(r"\bprimary\s+key\b", rest, re.I))
        not_null = bool(re.search(r"\bnot\s+null\b", rest, re.I))
        _check_name(name)
        specs.append((name, re.sub(r"\b(primary\s+key|not\s+null)\b", "", rest, flags=re.I).strip(), is_pk, not_null))
    marked = [s[0] for s in specs if s[2]]
    if clause is not None and marked:
        raise SchemaError("name the primary key once: a column's 'primary key' or a 'primary key (...)' clause")
    keys = clause if clause is not None else marked
    if not keys:
        raise SchemaError("a primary key is needed ('id int64 primary key', or 'primary key (sensor, ts)')")
    if len(marked) > 1:
        raise SchemaError("several columns marked 'primary key': name a key of several columns with "
                          "'primary key (a, b)'")
    ids = {name: i + 1 for i, (name, *_rest) in enumerate(specs)}
    missing = [k for k in keys if k not in ids]
    if missing:
        raise SchemaError(f"primary key column {missing[0]!r} is not one of the columns")
    cols = tuple(Column(ids[n], n, ColumnType.parse(t), not (n in keys or nn)) for n, t, _, nn in specs)
    return SchemaVersion(version, cols, tuple(ids[k] for k in keys), len(cols) + 1, partition_key)


def _split(text: str) -> list[str]:
    """Split on commas outside ``<...>`` and ``(...)``."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "<("
        depth -= ch in ">)"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out
