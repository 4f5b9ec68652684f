"""The ``terrascale table`` commands (docs/REFERENCE.md §6): create, list, describe, alter —
columns and the retention — and drop. Apart from the CLI's entry point, which only wires them."""
from __future__ import annotations

import argparse
from typing import Any

from node.client.client import Client
from node.client.output import emit, print_csv, print_table
from node.errors import UsageError


def add_table_parser(sub: Any, out: argparse.ArgumentParser) -> None:
    table = sub.add_parser("table", help="create, list, describe, alter, drop tables").add_subparsers(
        dest="table_cmd", required=True)
    c = table.add_parser("create", parents=[out], help="create a table")
    c.add_argument("name")
    c.add_argument("--schema", required=True, help="'id int64 primary key, ts timestamp, loc point, name string', "
                                                    "or a key of several columns: 'sensor string, ts timestamp, "
                                                    "v float64, primary key (sensor, ts)'")
    c.add_argument("--partition-key", help="the leading key columns whose hash picks the partition, "
                                           "comma-separated (default: the first key column)")
    c.add_argument("--index", default="", help="columns to index, comma-separated")
    c.add_argument("--partitions", type=int, help="number of partitions (default: the node's)")
    c.add_argument("--cluster-by", help="column whose order the garbage collector rewrites rows in "
                                        "(point, box, timestamp, date or number; default: the primary key)")
    c.add_argument("--replicas", type=int, help="copies of each partition, on as many nodes; a write is "
                                                "acknowledged once a majority holds it (default: [tables] replicas)")
    c.add_argument("--retention", metavar="COLUMN=KEEP", help="rows whose timestamp or date COLUMN is older than "
                                                             "KEEP (e.g. ts=30d) are no longer visible")
    lst = table.add_parser("list", parents=[out], help="list tables")
    lst.add_argument("--as-of", type=int)
    d = table.add_parser("describe", parents=[out], help="a table's schema (as of T)")
    d.add_argument("name")
    d.add_argument("--as-of", type=int)
    dr = table.add_parser("drop", parents=[out], help="drop a table")
    dr.add_argument("name")
    a = table.add_parser("alter", parents=[out], help="add-column 'c float64' | drop-column C | rename-column OLD NEW "
                                                      "| retention COLUMN KEEP (e.g. ts 30d) | retention off")
    a.add_argument("name")
    a.add_argument("change", choices=("add-column", "drop-column", "rename-column", "retention"))
    a.add_argument("args", nargs="+")


def _schema_columns(text: str) -> tuple[list[dict[str, Any]], str | list[str]]:
    from rowstore.schema import parse_schema

    sv = parse_schema(text)
    cols = [{"name": c.name, "type": str(c.type), "nullable": c.nullable} for c in sv.columns]
    names = sv.pk.names
    return cols, names[0] if len(names) == 1 else names


def table_cmd(c: Client, args: argparse.Namespace) -> int:
    fmt = args.output
    if args.table_cmd == "create":
        cols, pk = _schema_columns(args.schema)
        idx = [i.strip() for i in args.index.split(",") if i.strip()]
        part = [p.strip() for p in args.partition_key.split(",")] if args.partition_key else None
        d = c.create_table(args.name, cols, pk, idx, args.partitions, args.cluster_by, args.replicas, part,
                           _retention(args.retention.split("=", 1)) if args.retention else None)
        _describe_out(d, fmt)
    elif args.table_cmd == "list":
        doc = c.list_tables(args.as_of)
        if fmt in ("table", "csv"):
            rows = [{"name": t["name"], "primary_key": t["primary_key"], "columns": len(t["columns"]),
                     "indexes": ",".join(t["indexes"]), "partitions": t["partitions"]} for t in doc["tables"]]
            (print_table if fmt == "table" else print_csv)(rows, ["name", "primary_key", "columns", "indexes",
                                                                    "partitions"])
        else:
            emit(doc, fmt, "tables")
    elif args.table_cmd == "describe":
        _describe_out(c.describe(args.name, args.as_of), fmt)
    elif args.table_cmd == "drop":
        emit(c.drop_table(args.name), fmt)
    elif args.table_cmd == "alter":
        _describe_out(_alter(c, args), fmt)
    return 0


def _alter(c: Client, args: argparse.Namespace) -> Any:
    """The table's description (JSON) after the change ``args`` names."""
    a = args.args
    if args.change == "add-column":
        words = " ".join(a).split(None, 1)
        if len(words) != 2:
            raise UsageError("add-column takes 'NAME TYPE', e.g. 'c float64'")
        return c.add_column(args.name, words[0], words[1])
    if args.change == "retention":
        return c.set_retention(args.name, None if a == ["off"] else _retention(a))
    if args.change == "drop-column":
        if len(a) != 1:
            raise UsageError("drop-column takes one column name")
        return c.drop_column(args.name, a[0])
    if len(a) != 2:
        raise UsageError("rename-column takes OLD NEW")
    return c.rename_column(args.name, a[0], a[1])


def _retention(parts: list[str]) -> dict[str, str]:
    if len(parts) != 2 or not all(parts):
        raise UsageError("a retention is a column and a duration, e.g. ts=30d (alter: 'retention ts 30d')")
    return {"column": parts[0], "keep": parts[1]}


def _describe_out(d: dict[str, Any], fmt: str) -> None:
    if fmt in ("table", "csv"):
        if fmt == "table":
            print(f"table {d['name']}  (primary key {d['primary_key']}, {d['partitions']} partitions, "
                  f"cluster by {d.get('cluster_by', d['primary_key'])}, "
                  f"schema version {d['schema_version']}, ts {d['ts']})")
            if d.get("retention"):
                r = d["retention"]
                print(f"retention: rows with {r['column']} older than {r['keep_s']:g} s are not visible")
        rows = [{"column": col["name"], "type": col["type"], "nullable": col["nullable"],
                 "indexed": col["name"] in d["indexes"]} for col in d["columns"]]
        (print_table if fmt == "table" else print_csv)(rows, ["column", "type", "nullable", "indexed"])
        if fmt == "table" and d.get("placement"):
            print()
            print_table([{"partition": p["partition"], "leader": p["leader"], "replicas": ",".join(p["replicas"]),
                           "epoch": p["epoch"], "watermark": "" if p.get("watermark") is None else p["watermark"]}
                          for p in d["placement"]], ["partition", "leader", "replicas", "epoch", "watermark"])
    else:
        emit(d, fmt)
