"""`terrascale aggregate` and `terrascale histogram`: command-line arguments to requests, and
their answers printed like every other command's (``--output`` table, csv, json, arrow)."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar, overload

import pyarrow as pa

from node.client.client import Client
from node.client.endpoints import Where
from node.client.output import emit, emit_arrow_table
from node.errors import NodeError

FNS = ("count", "sum", "min", "max", "mean", "count_distinct", "median", "approx_count_distinct")
_WITH = {"quantile": "q", "first": "by", "last": "by"}  # FN:COLUMN:ARG
N = TypeVar("N", int, float)


class ArgumentError(NodeError, ValueError):
    """A command-line argument that is not well formed (the CLI's usage error)."""


def aggregates_of(specs: list[str] | None) -> list[dict[str, Any]]:
    """``--agg count`` (rows), ``--agg FN:COLUMN``, ``--agg quantile:COLUMN:Q`` and
    ``--agg last:COLUMN:BY`` (or first) -> the request's ``aggregates``."""
    out: list[dict[str, Any]] = []
    for s in specs or ["count"]:
        fn, _, rest = s.partition(":")
        col, _, arg = rest.partition(":")
        if fn in _WITH and col and arg:
            out.append({"fn": fn, "column": col, _WITH[fn]: _number(arg, s) if fn == "quantile" else arg})
            continue
        if fn not in FNS or (not col and fn != "count") or arg:
            raise ArgumentError(f"--agg {s!r}: expected count, FN:COLUMN (FN one of {', '.join(FNS)}), "
                                "quantile:COLUMN:Q, first:COLUMN:BY or last:COLUMN:BY")
        out.append({"fn": fn, "column": col} if col else {"fn": fn})
    return out


def buckets_of(specs: list[str] | None) -> list[dict[str, Any]]:
    """``--bucket COLUMN:WIDTH[:ORIGIN]`` (``ts:5m``, ``v:10``) -> bucketed ``group_by`` entries."""
    out: list[dict[str, Any]] = []
    for s in specs or []:
        col, _, rest = s.partition(":")
        width, _, origin = rest.partition(":")
        if not col or not width:
            raise ArgumentError(f"--bucket {s!r}: expected COLUMN:WIDTH[:ORIGIN], e.g. ts:5m or v:10")
        w: Any = width if width[-1:].isalpha() else _number(width, s)
        out.append({"bucket": col, "width": w} | ({"origin": origin} if origin else {}))
    return out


def _number(text: str, what: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise ArgumentError(f"{what!r}: {text!r} is not a number") from None


@overload
def numbers(text: str, n: int, what: str) -> list[float]: ...


@overload
def numbers(text: str, n: int, what: str, kind: Callable[[str], N]) -> list[N]: ...


def numbers(text: str, n: int, what: str, kind: Callable[[str], Any] = float) -> list[Any]:
    parts = [p.strip() for p in text.split(",")]
    try:
        vals = [kind(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) != n:
        raise ArgumentError(f"{what} {text!r}: expected {n} comma-separated numbers")
    return vals


def aggregate(c: Client, args: argparse.Namespace, where: Where | None, bbox: Any) -> int:
    plain: list[str | dict[str, Any]] = [g.strip() for g in (args.group_by or "").split(",") if g.strip()]
    group_by = (plain + buckets_of(args.bucket)) or None
    aggs = aggregates_of(args.agg)
    if args.output in ("arrow", "table", "csv"):  # typed columns: the Arrow answer
        t = c.aggregate(args.name, aggs, group_by=group_by, where=where, bbox=bbox, as_of=args.as_of, arrow=True)
        emit_arrow_table(t, args.output)
    else:
        emit(c.aggregate(args.name, aggs, group_by=group_by, where=where, bbox=bbox, as_of=args.as_of),
             args.output)
    return 0


def histogram(c: Client, args: argparse.Namespace, where: Where | None) -> int:
    xmin, ymin, xmax, ymax = numbers(args.bbox, 4, "--bbox")
    cells = numbers(args.cells, 2, "--cells", int)
    doc = c.histogram(args.name, args.column, {"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax}, cells,
                      where=where, as_of=args.as_of)
    if args.output == "json":
        emit(doc, "json")
        return 0
    counts = doc["counts"]
    t = pa.table({"row": pa.array(range(len(counts)), pa.int64()),
                  **{f"x{i}": pa.array([r[i] for r in counts], pa.int64()) for i in range(cells[0])}})
    emit_arrow_table(t, args.output, doc["as_of"])
    return 0
