"""`terrascale watch`: a table's changes printed as they commit (docs/rfcs/0015-subscriptions.md)
— one JSON line per change (``--output json``), or one tab-separated line per change with the
op, the commit timestamp and the row's values (``table``). It resumes by itself across dropped
connections and node restarts (``Client.subscribe``); Ctrl-C ends it (exit 0)."""
from __future__ import annotations

import argparse
import json
from typing import Any

from node.client.client import Client
from node.client.output import cell


def add_watch_parser(sub: Any) -> None:
    w = sub.add_parser("watch", help="a table's committed changes as they come (a live query)")
    w.add_argument("name")
    w.add_argument("--where", action="append", default=[], help="'col op value', op in = != < <= > >=")
    w.add_argument("--bbox", help="COL:XMIN,YMIN,XMAX,YMAX")
    w.add_argument("--prefix", action="append", help="a leading key component (repeat for more)")
    w.add_argument("--columns", help="a,b,c (the key columns always)")
    w.add_argument("--from", dest="from_ts", type=int, help="the changes after this commit timestamp (default: now)")
    w.add_argument("--output", "-o", choices=("table", "json"), default="table", help="output format")
    w.add_argument("--limit", type=int, help="stop after this many changes")
    w.add_argument("--progress", action="store_true", help="also print each closed timestamp")


def watch(c: Client, args: argparse.Namespace, where: list[Any] | None, bbox: dict[str, Any] | None) -> int:
    columns = [x.strip() for x in args.columns.split(",") if x.strip()] if args.columns else None
    show = _json_line if args.output == "json" else _Table().line
    seen = 0
    try:
        for item in c.subscribe(args.name, where, bbox, args.prefix, columns, args.from_ts):
            if "closed" in item:
                if args.progress:
                    print(json.dumps(item) if args.output == "json" else f"-- closed {item['closed']}", flush=True)
                continue
            show(item)
            seen += 1
            if args.limit is not None and seen >= args.limit:
                return 0
    except KeyboardInterrupt:
        return 0
    return 0


def _json_line(change: dict[str, Any]) -> None:
    print(json.dumps(change), flush=True)


class _Table:
    """Tab-separated lines: op, commit_ts, then the row's values, under a header printed first
    and again when an upsert's columns differ (a delete's row holds only the key)."""

    def __init__(self) -> None:
        self.columns: list[str] = []

    def line(self, change: dict[str, Any]) -> None:
        row = change["row"]
        if not self.columns or (change["op"] == "upsert" and list(row) != self.columns):
            self.columns = list(row)
            print("\t".join(["op", "commit_ts", *self.columns]), flush=True)
        vals = [cell(row[k]) if k in row else "" for k in self.columns]
        print("\t".join([change["op"], str(change["commit_ts"]), *vals]), flush=True)

