"""What every read of a table at one snapshot shares — point gets, scans, queries and
aggregates alike: its ``ReadContext``, the checks of a request's columns and limit, and what a
corruption found reading a partition names. Apart from :mod:`rowstore.db.read.reader` so that
the parts the ``Reader`` is made of (``points.py``, ``scans.py``) import it, not the reader."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rowstore.errors import QueryError
from rowstore.reads.predicates import Term, parse_where
from rowstore.schema import SchemaVersion
from rowstore.tables.definitions import TableDef
from rowstore.db.partition import Partition
from rowstore.db.registry import Table


@dataclass(frozen=True)
class ReadContext:
    """What every read of one table at one snapshot needs."""

    T: int
    d: TableDef
    table: Table
    schemas: Callable[[int], SchemaVersion]  # version id -> SchemaVersion
    kept: tuple[Term, ...] = ()  # the table's retention at T: added to every read's terms

    def terms(self, where: object) -> list[Term]:
        """A request's ``where`` parsed against the schema at T, with the retention's term."""
        assert self.d.schema is not None  # describe() refuses a dropped table
        return parse_where(self.d.schema, where) + list(self.kept)


def where_of(c: ReadContext, part: Partition) -> str:
    """What a corruption found reading ``part`` names."""
    return f"table {c.d.name!r} partition {part.pid}"


def check_columns(schema: SchemaVersion, columns: list[str] | None) -> None:
    if columns is None:
        return
    if not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) for c in columns):
        raise QueryError("columns must be a list of column names")
    for c in columns:
        if schema.by_name(c) is None:
            raise QueryError(f"no column {c!r}")


def check_limit(limit: int | None) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise QueryError(f"limit must be a non-negative integer, not {limit!r}")
