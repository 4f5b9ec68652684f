"""`terrascale` command line (docs/REFERENCE.md §2). Exit 0 success, 1 failure, 2 usage.

argparse (standard library) gives exit status 2 and a usage line on bad
arguments, as the reference promises; every failure below it is one
line on stderr, never a traceback. Commands other than ``node run`` and
``fsck`` talk to a node over HTTP through ``node.client.Client``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from catalog.errors import CatalogError
from node import config as config_mod
from node.client.client import Client
from node.client.export import typed_key
from node.client.output import cell, emit, emit_arrow_table, print_table
from node.client.tables import add_table_parser, table_cmd
from node.client.watch import add_watch_parser, watch
from node.errors import ConfigError, NodeError, UsageError
from rowstore.errors import QueryError, RowstoreError
from rowstore.reads.text_forms import parse_bbox_text, parse_where_text
from terrafs.errors import TerrafsError

OUTPUTS = ("table", "json", "csv", "arrow")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="terrascale", description="Terrascale storage engine")
    p.add_argument("--endpoint", default=os.environ.get("TERRASCALE_ENDPOINT", "http://127.0.0.1:7400"),
                   help="node URL (env TERRASCALE_ENDPOINT)")
    p.add_argument("--token", default=os.environ.get("TERRASCALE_TOKEN"), help="bearer token (env TERRASCALE_TOKEN)")
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--output", "-o", choices=OUTPUTS, default="table", help="output format")
    sub = p.add_subparsers(dest="cmd", required=True)

    node = sub.add_parser("node", help="run a node daemon").add_subparsers(dest="node_cmd", required=True)
    run = node.add_parser("run", help="run a node in the foreground")
    run.add_argument("--config", help="TOML config file (docs/REFERENCE.md §5)")
    run.add_argument("--data-dir", default="./data", help="embedded defaults under this directory")
    run.add_argument("--listen", help="HOST:PORT (overrides the config)")

    add_table_parser(sub, out)

    ing = sub.add_parser("ingest", help="bulk load a file (restartable: upserts by key)")
    ing.add_argument("name")
    ing.add_argument("file")
    ing.add_argument("--format", choices=("parquet", "csv", "arrow", "ndjson"), help="default: from the extension")
    ing.add_argument("--batch-rows", type=int, default=10_000)
    ing.add_argument("--no-progress", action="store_true", help="no progress bar")

    g = sub.add_parser("get", parents=[out], help="one row by primary key")
    g.add_argument("name")
    g.add_argument("key", nargs="+", help="the key; a key of several columns: its components in key order")
    g.add_argument("--as-of", type=int)
    dl = sub.add_parser("delete", parents=[out], help="delete one row by primary key (its components in order), "
                                                      "or every row matching --where/--bbox/--prefix at one T")
    dl.add_argument("name")
    dl.add_argument("key", nargs="*")
    dl.add_argument("--where", action="append", default=[], help="'col op value', op in = != < <= > >=")
    dl.add_argument("--bbox", help="COL:XMIN,YMIN,XMAX,YMAX")
    dl.add_argument("--prefix", action="append", help="a leading key component (repeat for more)")
    sc = sub.add_parser("scan", parents=[out], help="rows in key order: a key prefix, a range [start, end)")
    ex = sub.add_parser("export", help="one scan at one snapshot to .parquet, .csv or .arrow; restartable")
    for sp in (sc, ex):
        sp.add_argument("name")
        sp.add_argument("--prefix", action="append", help="a leading key component (repeat for more)")
        sp.add_argument("--where", action="append", default=[], help="'col op value', op in = != < <= > >=")
        sp.add_argument("--bbox", help="COL:XMIN,YMIN,XMAX,YMAX")
        sp.add_argument("--columns", help="a,b,c")
        sp.add_argument("--as-of", type=int)
    sc.add_argument("--start", action="append", help="the first key's leading component (repeat for more)")
    sc.add_argument("--end", action="append", help="the key before which the scan ends (components, repeat)")
    sc.add_argument("--limit", type=int, help="at most this many rows")
    ex.add_argument("file")
    ex.add_argument("--resume", action="store_true", help="continue an interrupted export of FILE")
    ex.add_argument("--no-progress", action="store_true", help="no progress bar")
    ex.add_argument("--page-rows", type=int, default=100_000, help="rows per scan page (and per saved page)")

    q = sub.add_parser("query", parents=[out], help="filtered read")
    q.add_argument("name")
    q.add_argument("--where", action="append", default=[], help="'col op value', op in = != < <= > >=")
    q.add_argument("--bbox", help="COL:XMIN,YMIN,XMAX,YMAX")
    q.add_argument("--as-of", type=int)
    q.add_argument("--columns", help="a,b,c")
    q.add_argument("--limit", type=int)

    ag = sub.add_parser("aggregate", parents=[out], help="grouped count/sum/min/max/mean/count_distinct/quantiles/"
                                                         "first/last, by columns and buckets")
    ag.add_argument("name")
    ag.add_argument("--agg", action="append", default=[], help="count | FN:COLUMN | quantile:COLUMN:Q | "
                    "last:COLUMN:BY | first:COLUMN:BY (repeat); FN one of count sum min max mean count_distinct "
                    "median approx_count_distinct")
    ag.add_argument("--group-by", help="a,b")
    ag.add_argument("--bucket", action="append", default=[], help="COLUMN:WIDTH[:ORIGIN] (repeat): group by "
                    "buckets, e.g. ts:5m or v:10, after the --group-by columns")
    hi = sub.add_parser("histogram", parents=[out], help="counts per cell of a grid over a bounding box")
    hi.add_argument("name")
    hi.add_argument("column", help="a point or box column")
    hi.add_argument("--bbox", required=True, help="XMIN,YMIN,XMAX,YMAX")
    hi.add_argument("--cells", required=True, help="NX,NY")
    for sp in (ag, hi):
        sp.add_argument("--where", action="append", default=[], help="'col op value', op in = != < <= > >=")
        sp.add_argument("--as-of", type=int)
    ag.add_argument("--bbox", help="COL:XMIN,YMIN,XMAX,YMAX")

    add_watch_parser(sub)
    adm = sub.add_parser("admin", help="operator actions").add_subparsers(dest="admin_cmd", required=True)
    for name in ("status", "seal", "offload", "checkpoint"):
        adm.add_parser(name, parents=[out])
    gcp = adm.add_parser("gc", parents=[out], help="one garbage-collection pass now")
    gcp.add_argument("--table", help="only this table")
    gcp.add_argument("--dry-run", action="store_true", help="list the victims and their garbage ratios only")
    cl = adm.add_parser("cluster", parents=[out], help="members, leader and term; add/remove a Raft member")
    cl.add_argument("change", nargs="?", choices=("add", "remove"))
    cl.add_argument("raft_address", nargs="?", help="host:port of the member's Raft port")
    cl.add_argument("--force", action="store_true",
                    help="remove: at once, without moving the partitions it holds the only copy of "
                         "(unreadable until it is added back)")
    segs = adm.add_parser("segments", parents=[out])
    segs.add_argument("--table")

    fsck = sub.add_parser("fsck", help="offline: verify every checksum and invariant of a node's data")
    fsck.add_argument("data_dir", nargs="?", help="a data directory with the embedded layout")
    fsck.add_argument("--config", help="check the stores this config names (trkv:// or raft:// catalog)")
    fsck.add_argument("--repair", action="store_true",
                      help="after listing them, delete files and objects no catalog row names (orphans)")
    return p


def _setup_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")


# -- offline commands -----------------------------------------------------------------------------


def _node_run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import faulthandler

    from node.daemon.lifecycle import run

    _setup_logging()
    faulthandler.enable()  # a crash in native code (a fatal signal) prints every thread's stack to the log
    cfg = config_mod.load(args.config) if args.config else config_mod.defaults(args.data_dir)
    if args.listen:
        cfg = replace(cfg, listen=config_mod.parse_listen("--listen", args.listen))
    asyncio.run(run(cfg))
    return 0


def _fsck(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from node.client.fsck import fsck

    _setup_logging()
    if bool(args.data_dir) == bool(args.config):
        parser.error("fsck takes DATA_DIR or --config FILE")
    if args.data_dir and not os.path.isdir(args.data_dir):
        raise ConfigError(f"DATA_DIR: {args.data_dir} is not a directory")
    cfg = config_mod.load(args.config) if args.config else config_mod.defaults(args.data_dir)
    problems = asyncio.run(fsck(cfg, repair=args.repair, emit=lambda line: print(line, flush=True)))
    damaged = [p for p in problems if p.damage]
    print(f"fsck: {len(damaged)} problem(s), {len(problems) - len(damaged)} notice(s)", file=sys.stderr)
    return 1 if damaged else 0


# -- online commands ------------------------------------------------------------------------------


def _parse_where(expr: str) -> list[list[str]]:
    """One ``--where`` (``rowstore.reads.text_forms``: the Spark bridge's syntax too)."""
    try:
        return parse_where_text(expr)
    except QueryError as e:
        raise UsageError(f"--where {expr!r}: {e}") from None


def _parse_bbox(text: str) -> dict[str, Any]:
    try:
        return parse_bbox_text(text)
    except QueryError as e:
        raise UsageError(f"--bbox: {e}") from None


def _query(c: Client, args: argparse.Namespace) -> int:
    where = [t for w in args.where for t in _parse_where(w)] or None
    bbox = _parse_bbox(args.bbox) if args.bbox else None
    columns = [x.strip() for x in args.columns.split(",") if x.strip()] if args.columns else None
    status, body, headers = c.request(
        "POST", f"/v1/tables/{_q(args.name)}/query",
        json.dumps({k: v for k, v in (("where", where), ("bbox", bbox), ("as_of", args.as_of),
                                      ("columns", columns), ("limit", args.limit)) if v is not None}).encode(),
        "application/json", "application/vnd.apache.arrow.stream")
    from node.client.endpoints import api_error, read_arrow

    if status >= 400:
        raise api_error(status, body)
    emit_arrow_table(read_arrow(body), args.output, int(headers.get("x-terrascale-as-of", 0)) or None)
    return 0


def _analysis(c: Client, args: argparse.Namespace) -> int:
    from node.client import analysis

    where = [t for w in args.where for t in _parse_where(w)] or None
    try:
        if args.cmd == "histogram":
            return analysis.histogram(c, args, where)
        return analysis.aggregate(c, args, where, _parse_bbox(args.bbox) if args.bbox else None)
    except analysis.ArgumentError as e:
        raise UsageError(str(e)) from None


def _q(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _key(parts: list[str]) -> object:
    return parts[0] if len(parts) == 1 else parts


def _get(c: Client, args: argparse.Namespace) -> int:
    if args.cmd == "delete":
        where = [t for w in args.where for t in _parse_where(w)] or None
        bbox = _parse_bbox(args.bbox) if args.bbox else None
        if (where or bbox or args.prefix) and args.key:
            raise UsageError("delete takes a key, or --where/--bbox/--prefix, not both")
        if args.key:
            emit(c.delete(args.name, [_key(args.key)]), args.output)
        elif where or bbox or args.prefix:
            emit(c.delete_where(args.name, where, bbox, typed_key(c, args.name, args.prefix)), args.output)
        else:
            raise UsageError("delete takes a key, or --where/--bbox/--prefix")
        return 0
    args.key = _key(args.key)
    row = c.get(args.name, args.key, args.as_of)
    if row is None:
        print(f"terrascale: error: row_not_found: no row with key {args.key!r} in {args.name!r}", file=sys.stderr)
        return 1
    if args.output == "table":
        width = max(len(k) for k in row)
        for k, v in row.items():
            print(f"{k.ljust(width)}  {cell(v)}")
    else:
        emit({"rows": [row]}, args.output, "rows") if args.output != "json" else print(json.dumps(row))
    return 0


def _admin(c: Client, args: argparse.Namespace) -> int:
    cmd, fmt = args.admin_cmd, args.output
    if cmd == "status":
        emit(c.status(), fmt)
    elif cmd == "segments":
        doc = c.segments(args.table)
        emit(doc, fmt, "segments")
    elif cmd == "gc":
        doc = c.gc(args.table, args.dry_run)
        if args.dry_run and fmt == "table":
            if doc["victims"]:
                print_table(doc["victims"])
            else:
                print("no victims")
        else:
            emit(doc, fmt)
    elif cmd == "cluster":
        if args.change and not args.raft_address:
            print(f"terrascale: error: admin cluster {args.change} needs the member's Raft address (host:port)",
                  file=sys.stderr)
            return 2
        if args.force and args.change != "remove":
            print("terrascale: error: --force goes with admin cluster remove", file=sys.stderr)
            return 2
        if args.change == "remove":
            doc = c.remove_member(args.raft_address, force=args.force)
        else:
            doc = c.add_member(args.raft_address) if args.change else c.cluster()
        if fmt == "table":
            print(f"leader {doc['leader']}  term {doc['term']}  catalog {doc.get('catalog')}")
            print_table(doc["members"])
            for t, parts in doc["partitions"].items():
                led: dict[str, list[str]] = {}
                for p, who in parts.items():
                    led.setdefault(who, []).append(p)
                print(f"table {t}: {len(parts)} partitions on {', '.join(sorted(led))} ("
                      + "; ".join(f"{who} leads {','.join(ps)}" for who, ps in sorted(led.items())) + ")")
        else:
            emit(doc, fmt, "members")
    else:
        emit(c.admin(cmd), fmt)
    return 0


def _online(args: argparse.Namespace) -> int:
    try:
        c = Client(args.endpoint, args.token)
    except ValueError as e:
        raise UsageError(f"--endpoint: {e}") from None
    with c:
        if args.cmd == "table":
            return table_cmd(c, args)
        if args.cmd in ("get", "delete"):
            return _get(c, args)
        if args.cmd == "scan":
            from node.client.export import scan

            return scan(c, args, [t for w in args.where for t in _parse_where(w)] or None,
                        _parse_bbox(args.bbox) if args.bbox else None)
        if args.cmd == "export":
            from node.client.export import export

            return export(c, args)
        if args.cmd == "query":
            return _query(c, args)
        if args.cmd in ("aggregate", "histogram"):
            return _analysis(c, args)
        if args.cmd == "watch":
            return watch(c, args, [t for w in args.where for t in _parse_where(w)] or None,
                         _parse_bbox(args.bbox) if args.bbox else None)
        if args.cmd == "admin":
            return _admin(c, args)
        if args.cmd == "ingest":
            from node.client.ingest import ingest

            return ingest(c, args)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from node.errors import ApiError

    try:
        if args.cmd == "node":
            return _node_run(args)
        if args.cmd == "fsck":
            return _fsck(args, parser)
        return _online(args)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"terrascale: error: {e}", file=sys.stderr)
        return 2
    except ApiError as e:
        print(f"terrascale: error: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # stdout closed early (| head)
        return 0
    except ConnectionError as e:
        print(f"terrascale: error: {e}", file=sys.stderr)
        return 1
    except (NodeError, TerrafsError, CatalogError, RowstoreError) as e:
        print(f"terrascale: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("terrascale: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
