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
from rowstore.types import LOGICAL_KEY, PRIMARY_KEY_KINDS, ColumnType

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
class SchemaVersion:
    version: int
    columns: tuple[Column, ...]
    primary_key: int  # column id
    next_column_id: int
    _ids: dict[int, Column] = dc_field(init=False, repr=False, compare=False, hash=False)  # id -> Column
    _names: dict[str, Column] = dc_field(init=False, repr=False, compare=False, hash=False)  # name -> Column

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ids", {c.id: c for c in self.columns})
        object.__setattr__(self, "_names", {c.name: c for c in self.columns})
        names = [c.name for c in self.columns]
        if len(set(n.lower() for n in names)) != len(names):
            raise SchemaError("column names must be unique (case-insensitively)")
        if len(self.columns) > MAX_COLUMNS:
            raise SchemaError(f"at most {MAX_COLUMNS} columns")
        pk = self.by_id(self.primary_key)
        if pk is None:
            raise SchemaError("the primary key column must be one of the columns")
        if pk.type.kind not in PRIMARY_KEY_KINDS:
            raise SchemaError(f"primary key {pk.name!r} must be int64, string or uuid, not {pk.type}")
        if pk.nullable:
            raise SchemaError(f"primary key {pk.name!r} cannot be nullable")

    def by_id(self, cid: int) -> Column | None:
        return self._ids.get(cid)

    def by_name(self, name: str) -> Column | None:
        return self._names.get(name) if isinstance(name, str) else None

    @property
    def key(self) -> Column:
        return self._ids[self.primary_key]  # __post_init__ checked it is one of the columns

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
        if col.id == self.primary_key:
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
        return json.dumps({"version": self.version, "primary_key": self.primary_key,
                           "next_column_id": self.next_column_id,
                           "columns": [{"id": c.id, "name": c.name, "type": str(c.type),
                                        "nullable": c.nullable} for c in self.columns]})

    @classmethod
    def from_json(cls, text: str) -> "SchemaVersion":
        d = json.loads(text)
        cols = tuple(Column(c["id"], c["name"], ColumnType.parse(c["type"]), c["nullable"])
                     for c in d["columns"])
        return cls(d["version"], cols, d["primary_key"], d["next_column_id"])


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SchemaError(f"invalid column name {name!r}: letters, digits, _; not starting with a digit")


def parse_schema(text: str, version: int = 1) -> SchemaVersion:
    """Parse the CLI form ``'id int64 primary key, ts timestamp, loc point, name string'``."""
    cols, pk = [], None
    for i, part in enumerate(p.strip() for p in _split(text)):
        words = part.split()
        if len(words) < 2:
            raise SchemaError(f"column {part!r}: expected 'NAME TYPE [primary key] [not null]'")
        name, rest = words[0], " ".join(words[1:])
        is_pk = bool(re.search(r"\bprimary\s+key\b", rest, re.I))
        not_null = bool(re.search(r"\bnot\s+null\b", rest, re.I))
        type_text = re.sub(r"\b(primary\s+key|not\s+null)\b", "", rest, flags=re.I).strip()
        _check_name(name)
        cols.append(Column(i + 1, name, ColumnType.parse(type_text), not (is_pk or not_null)))
        if is_pk:
            if pk is not None:
                raise SchemaError("exactly one primary key column")
            pk = i + 1
    if pk is None:
        raise SchemaError("one column must be the primary key ('id int64 primary key')")
    return SchemaVersion(version, tuple(cols), pk, len(cols) + 1)


def _split(text: str) -> list[str]:
    """Split on commas outside ``<...>``."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out
