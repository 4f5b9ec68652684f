"""A table's retention as reads apply it (docs/rfcs/0016-time-series-aggregates.md §5): the
setting checked against the schema, and the term it adds to every read at T — ``[column, ">=",
cut(T)]`` with ``cut(T) = wall(T) − keep`` — so the index, the zone maps and the exact masks
treat it as any user's term, and a read as of T answers the same whenever it runs."""
from __future__ import annotations

import datetime as dt
from typing import Any

from rowstore.errors import SchemaError
from rowstore.hlc import ms_of
from rowstore.reads.buckets import duration_us
from rowstore.reads.predicates import Term
from rowstore.schema import SchemaVersion
from rowstore.tables.definitions import Retention, TableDef
from rowstore.types import Kind

DAY_US = 86_400_000_000
MAX_KEEP_US = 100 * 366 * DAY_US  # a century: beyond it a timestamp's range is near


def parse_retention(schema: SchemaVersion, doc: Any) -> Retention | None:
    """``{"column": c, "keep": "30d"}`` (None: no retention), checked: a not-null timestamp or
    date column and a duration above zero."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"column", "keep"}:
        raise SchemaError('"retention" is {"column": a timestamp or date column, "keep": a duration like 30d} or null')
    col = schema.by_name(doc["column"]) if isinstance(doc["column"], str) else None
    if col is None:
        raise SchemaError(f"retention: no column {str(doc['column'])[:80]!r}")
    if col.type.kind not in (Kind.TIMESTAMP, Kind.DATE):
        raise SchemaError(f"retention: column {col.name!r} is {col.type}, not a timestamp or date")
    if col.nullable:
        raise SchemaError(f"retention: column {col.name!r} is nullable (a reading without a time never ages); "
                          "declare it not null or make it a key column")
    keep = duration_us(doc["keep"])
    if keep is None or keep <= 0 or keep > MAX_KEEP_US:
        raise SchemaError(f'retention: "keep" must be a duration above zero like 12h or 30d, at most 36600d, '
                          f"not {str(doc['keep'])[:40]!r}")
    return Retention(col.id, keep)


def retention_json(d: TableDef) -> dict[str, Any] | None:
    """The retention as the API shows it: the column's current name and ``keep`` in seconds."""
    r, schema = d.retention, d.schema
    if r is None or schema is None:
        return None
    col = schema.by_id(r.column)
    return {"column": col.name if col else None, "keep_s": r.keep_us / 1e6}


def cutoff_us(r: Retention, T: int) -> int:
    """The oldest value a read at ``T`` still sees, in µs since the epoch."""
    return ms_of(T) * 1000 - r.keep_us


def kept_terms(d: TableDef, T: int) -> list[Term]:
    """The term the table's retention adds to a read at ``T`` (none without a retention)."""
    r, schema = d.retention, d.schema
    if r is None or schema is None:
        return []
    col = schema.by_id(r.column)
    assert col is not None  # alter refuses to drop the retention's column
    cut = cutoff_us(r, T)
    if col.type.kind == Kind.DATE:  # a day is kept while any of it is within: d + 1 day > cut
        return [Term(col, ">=", cut // DAY_US)]
    return [Term(col, ">=", cut)]


def oldest_kept(d: TableDef, T: int) -> tuple[str, dt.datetime | dt.date] | None:
    """For a point read's row (a dict of Python values): the retention column's name at T and
    the oldest value a read at ``T`` still sees (a row below it is not there)."""
    terms = kept_terms(d, T)
    if not terms:
        return None
    t = terms[0]
    assert isinstance(t.value, int)  # a timestamp's µs or a date's days
    if t.column.type.kind == Kind.DATE:
        return t.column.name, dt.date(1970, 1, 1) + dt.timedelta(days=t.value)
    return t.column.name, dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=t.value)
