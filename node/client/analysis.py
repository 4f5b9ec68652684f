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

FNS = ("count", "sum", "min", "max", "mean", "count_distinct")
N = TypeVar("N", int, float)


class ArgumentError(NodeError, ValueError):
    """A command-line argument that is not well formed (the CLI's usage error)."""


def aggregates_of(specs: list[str] | None) -> list[dict[str, str]]:
    """``--agg count`` (rows), ``--agg FN:COLUMN`` -> the request's ``aggregates``."""
    out = []
    for s in specs or ["count"]:
        fn, _, col = s.partition(":")
        if fn not in FNS or (not col and fn != "count"):
            raise ArgumentError(f"--agg {s!r}: expected count or FN:COLUMN, FN one of {', '.join(FNS)}")
        out.append({"fn": fn, "column": col} if col else {"fn": fn})
    return out


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
    group_by = [g.strip() for g in args.group_by.split(",") if g.strip()] if args.group_by else None
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
