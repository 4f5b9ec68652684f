"""The data source's options (docs/spark.md lists them), parsed once with one-line errors.

Spark hands every option over as a string in a case-insensitive map. ``where`` and ``bbox``
take the CLI's syntax (``terrascale query --where 'col op value' --bbox COL:XMIN,YMIN,XMAX,YMAX``);
since an option cannot repeat, several ``where`` terms are joined with ``and``.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from rowstore.errors import QueryError
from rowstore.reads.text_forms import parse_bbox_text, parse_where_text
from spark_bridge.errors import OptionError

MAX_LEASE_S = 86_400.0


@dataclass(frozen=True)
class Options:
    endpoint: str
    table: str
    token: str | None = None
    as_of: int | None = None
    sealed_only: bool = False
    columns: tuple[str, ...] | None = None  # read only these, in this order
    where: list | None = None  # [[col, op, value], ...] as the HTTP API takes them
    bbox: dict | None = None
    key_file: str | None = None
    objects: str | None = None  # the object store URI executors use instead of the plan's
    lease_s: float = 600.0
    timeout_s: float = 300.0
    batch_rows: int = 65_536
    change_feed: bool = False
    after: int = 0
    starting_ts: str | int = "earliest"
    reader: str = "auto"  # auto | jvm | python: which reader serves batch reads (docs/spark.md, "Readers")
    split_mib: float = 64.0  # the JVM reader splits larger offloaded segments over several tasks

    @classmethod
    def parse(cls, raw) -> "Options":
        o = {str(k).lower(): v for k, v in dict(raw).items()}
        known = {"endpoint", "table", "token", "as_of", "sealed_only", "columns", "where", "bbox", "key_file",
                 "objects", "lease_s", "timeout_s", "batch_rows", "change_feed", "after", "starting_ts", "reader",
                 "split_mib", "path"}
        unknown = sorted(set(o) - known)
        if unknown:
            raise OptionError(f"unknown option(s) {', '.join(unknown)}; "
                              f"the options are: {', '.join(sorted(known - {'path'}))}")
        endpoint = o.get("endpoint") or os.environ.get("TERRASCALE_ENDPOINT")
        if not endpoint or not re.match(r"^https?://[^/\s]+/?$", endpoint):
            raise OptionError(f"option endpoint: expected http(s)://HOST:PORT of a Terrascale node, not {endpoint!r}")
        table = o.get("table") or o.get("path")
        if not table:
            raise OptionError("option table: name the table to read or write (.option('table', NAME))")
        return cls(
            endpoint=endpoint.rstrip("/"), table=table, token=o.get("token") or os.environ.get("TERRASCALE_TOKEN"),
            as_of=_int(o, "as_of"), sealed_only=_bool(o, "sealed_only", False), columns=_columns(o.get("columns")),
            where=parse_where(o["where"]) if o.get("where") else None,
            bbox=parse_bbox(o["bbox"]) if o.get("bbox") else None,
            key_file=o.get("key_file") or None, objects=o.get("objects") or None,
            lease_s=_seconds(o, "lease_s", 600.0, MAX_LEASE_S), timeout_s=_seconds(o, "timeout_s", 300.0, 86_400.0),
            batch_rows=_int(o, "batch_rows", 65_536, minimum=1), change_feed=_bool(o, "change_feed", False),
            after=_int(o, "after", 0), starting_ts=_starting(o.get("starting_ts", "earliest")),
            reader=_reader(o.get("reader") or "auto"),
            split_mib=_seconds(o, "split_mib", 64.0, float(1 << 20), "MiB"),
        )


def parse_where(text: str) -> list:
    """The ``where`` option: the CLI's terms joined with ``and`` (``rowstore.reads.text_forms``)."""
    try:
        return parse_where_text(text)
    except QueryError as e:
        raise OptionError(f"option where: {e}") from None


def parse_bbox(text: str) -> dict:
    """The ``bbox`` option: ``COL:XMIN,YMIN,XMAX,YMAX`` (``rowstore.reads.text_forms``)."""
    try:
        return parse_bbox_text(text)
    except QueryError as e:
        raise OptionError(f"option bbox: {e}") from None


def _bool(o: dict, key: str, default: bool) -> bool:
    v = o.get(key)
    if v is None or v == "":
        return default
    if str(v).lower() in ("true", "1", "yes"):
        return True
    if str(v).lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {key}: true or false, not {v!r}")


def _int(o: dict, key: str, default: int | None = None, minimum: int = 0) -> int | None:
    v = o.get(key)
    if v is None or v == "":
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        n = None
    if n is None or n < minimum:
        what = ("a commit timestamp (a non-negative integer)" if key in ("as_of", "after")
                else f"an integer >= {minimum}")
        raise OptionError(f"option {key}: expected {what}, not {v!r}")
    return n


def _seconds(o: dict, key: str, default: float, most: float, unit: str = "seconds") -> float:
    v = o.get(key)
    if v is None or v == "":
        return default
    try:
        s = float(v)
    except ValueError:
        s = math.nan
    if not 0 < s <= most:
        raise OptionError(f"option {key}: {unit} in (0, {most:g}], not {v!r}")
    return s


def _columns(v) -> tuple[str, ...] | None:
    if v is None or v == "":
        return None
    names = tuple(x.strip() for x in str(v).split(","))
    if not all(names) or len({n.lower() for n in names}) != len(names):
        raise OptionError(f"option columns: distinct column names separated by commas, not {v!r}")
    return names


def _reader(v) -> str:
    s = str(v).strip().lower()
    if s not in ("auto", "jvm", "python"):
        raise OptionError(f"option reader: auto, jvm or python, not {v!r}")
    return s


def _starting(v) -> str | int:
    s = str(v).strip().lower()
    if s in ("earliest", "latest"):
        return s
    if s.isdigit():
        return int(s)
    raise OptionError(f"option starting_ts: earliest, latest or a commit timestamp, not {v!r}")
