"""How the command line prints the API's answers: aligned tables, CSV, JSON or an Arrow IPC
stream on stdout (``--output``)."""
from __future__ import annotations

import csv
import json
import sys
from typing import Any

import pyarrow as pa


def emit(doc: Any, fmt: str, rows_key: str | None = None) -> None:
    """Print an API answer: a list of rows under ``rows_key`` as a table/CSV/JSON/Arrow, or a document."""
    rows = doc.get(rows_key) if rows_key and isinstance(doc, dict) else None
    if fmt == "json":
        print(json.dumps(doc, indent=None if rows is not None else 2))
        return
    if rows is None:
        rows = [doc] if fmt in ("csv", "arrow") else None
    if rows is None:
        _print_doc(doc)
    elif fmt == "arrow":
        from node.client.endpoints import arrow_body

        sys.stdout.buffer.write(arrow_body(pa.Table.from_pylist([_flat(r) for r in rows])))
        sys.stdout.flush()
    elif fmt == "csv":
        print_csv(rows)
    else:
        print_table(rows)


def emit_arrow_table(t: pa.Table, fmt: str, as_of: int | None = None) -> None:
    if fmt == "arrow":
        from node.client.endpoints import arrow_body

        sys.stdout.buffer.write(arrow_body(t))
        sys.stdout.flush()
        return
    from node.wire import table_to_rows

    rows = table_to_rows(t)
    if fmt == "json":
        print(json.dumps({"rows": rows, "as_of": as_of}))
    elif fmt == "csv":
        print_csv(rows, t.column_names)
    else:
        print_table(rows, t.column_names)
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{f', as of {as_of}' if as_of else ''})",
              file=sys.stderr)


def _flat(r: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()}


def cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def print_table(rows: list[dict[str, Any]], cols: list[str] | None = None) -> None:
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def print_csv(rows: list[dict[str, Any]], cols: list[str] | None = None) -> None:
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    w = csv.writer(sys.stdout)
    w.writerow(cols)
    for r in rows:
        w.writerow([cell(r.get(c)) for c in cols])


def _print_doc(doc: dict[str, Any], indent: int = 0) -> None:
    pad = "  " * indent
    for k, v in doc.items():
        if isinstance(v, dict) and v and all(not isinstance(x, (dict, list)) for x in v.values()):
            print(f"{pad}{k}: " + ", ".join(f"{a}={b}" for a, b in v.items()))
        elif isinstance(v, dict) and v:
            print(f"{pad}{k}:")
            _print_doc(v, indent + 1)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            print(f"{pad}{k}:")
            for x in v:
                print(f"{pad}  - " + ", ".join(f"{a}={cell(b)}" for a, b in x.items()))
        else:
            print(f"{pad}{k}: {cell(v) if not isinstance(v, list) else ', '.join(map(cell, v))}")
