"""`terrascale scan` prints the rows of a scan; `terrascale export TABLE FILE` writes one scan
at one snapshot to Parquet (zstd), CSV or Arrow IPC by the file's extension — consistent and
restartable (docs/rfcs/0013).

The scan's pages (``POST /v1/tables/{t}/scan``, cursors pinned to the first page's T) are
saved one by one in a work directory beside the file (``FILE.export/``): each page an Arrow
IPC file, written then renamed, then the state (the table, the request, the next cursor,
the pages and rows so far) written then renamed — and appended to the file being written,
``FILE.tmp``, while the next page is fetched. Interrupted — Ctrl-C, ``kill -9``, the node
restarting — ``--resume`` reads the state, writes ``FILE.tmp`` again from the saved pages and
continues from the cursor: a page saved but not yet in the state is fetched again and
written over itself (the same rows: the same cursor at the same T). After the last page,
``FILE.tmp`` is synced and renamed to ``FILE`` and the work directory removed: the finished
file holds exactly the rows of an uninterrupted run, in key order.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from node.client.client import Client
from node.client.endpoints import ScanResult
from node.client.output import emit_arrow_table
from node.errors import ApiError, UsageError
from rowstore.errors import QueryError
from rowstore.reads.text_forms import parse_bbox_text, parse_where_text

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "arrow", ".arrows": "arrow",
            ".ipc": "arrow"}
_RETRIES = 5  # a page asked again when its node restarts or a leader moves (the cursor is the same)


def export(c: Client, args: argparse.Namespace) -> int:
    out = Path(args.file)
    fmt = _FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise UsageError(f"{out}: the extension names the format: .parquet, .csv or .arrow")
    work = out.with_name(out.name + ".export")
    request = _request(args, typed_key(c, args.name, args.prefix))
    state = _resume(work, args.name, request) if args.resume else _begin(out, work, args.name, request)
    sink = _Sink(fmt, out.with_name(out.name + ".tmp"))
    for t in _pages(work, state["pages"]):  # a resumed export: the file again from the saved pages
        sink.write(t)
    bar = _bar(args, state)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="export-fetch")
    try:
        more = state["next"] is not None or state["pages"] == 0
        fut = pool.submit(_page, c, args.name, request, state["next"], args.as_of) if more else None
        while fut is not None:
            page = fut.result()
            # the next page is fetched while this one is saved and written (one request at a time)
            fut = pool.submit(_page, c, args.name, request, page.next, args.as_of) if page.next else None
            _save(work, state, page)
            sink.write(page.rows)
            if bar is not None:
                bar.update(page.rows.num_rows)
    finally:
        pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
    rows = sink.finish(out)
    shutil.rmtree(work)
    print(f"exported {rows} rows of {args.name!r} as of {state['as_of']} to {out}", file=sys.stderr)
    return 0


def scan(c: Client, args: argparse.Namespace, where: Any, bbox: Any) -> int:
    """`terrascale scan`: the rows of a scan, printed — page by page at the first one's T."""
    columns = [x.strip() for x in args.columns.split(",") if x.strip()] if args.columns else None
    prefix, start, end = (typed_key(c, args.name, k) for k in (args.prefix, args.start, args.end))
    page = c.scan_page(args.name, prefix, start, end, where, bbox, columns, min(args.limit or 10_000, 10_000),
                       args.as_of)
    tables = [page.rows]
    while page.next is not None and (args.limit is None or sum(t.num_rows for t in tables) < args.limit):
        page = c.scan_page(args.name, after=page.next)
        tables.append(page.rows)
    t = pa.concat_tables(tables)
    emit_arrow_table(t.slice(0, args.limit) if args.limit is not None else t, args.output, page.as_of)
    return 0


def typed_key(c: Client, table: str, parts: list[str] | None) -> list[Any] | None:
    """Key components typed on the command line (``--prefix 5``) as JSON values of their
    columns' types: an integer column's ``5`` goes as 5 (a JSON body's key is typed; the
    string "5" is not an integer), a float's as a number, a boolean's as true/false; text,
    times and the rest stay text (the JSON forms of those columns)."""
    if not parts:
        return parts
    d = c.describe(table)
    types = {col["name"]: col["type"] for col in d["columns"]}
    pk = d["primary_key"] if isinstance(d["primary_key"], list) else [d["primary_key"]]
    out: list[Any] = []
    for name, v in zip(pk, parts):
        t = types[name]
        try:
            out.append(int(v) if t.startswith(("int", "uint")) else float(v) if t.startswith("float") else
                       {"true": True, "false": False}[v.lower()] if t == "bool" else v)
        except (ValueError, KeyError):
            raise UsageError(f"key column {name!r} is {t}: {v!r} is not one") from None
    return out + list(parts[len(pk):])  # more components than the key has: the node says so


def _request(args: argparse.Namespace, prefix: list[Any] | None) -> dict[str, Any]:
    """The scan the export pages through (what ``--resume`` must be given again)."""
    req: dict[str, Any] = {"limit": args.page_rows}
    try:
        if prefix:
            req["prefix"] = list(prefix)
        if args.where:
            req["where"] = [t for w in args.where for t in parse_where_text(w)]
        if args.bbox:
            req["bbox"] = parse_bbox_text(args.bbox)
    except QueryError as e:
        raise UsageError(f"--where/--bbox: {e}") from None
    if args.columns:
        req["columns"] = [c.strip() for c in args.columns.split(",") if c.strip()]
    return req


def _begin(out: Path, work: Path, table: str, request: dict[str, Any]) -> dict[str, Any]:
    if work.exists():
        raise UsageError(f"{work} holds an interrupted export: continue it with --resume, or remove it")
    if out.exists():
        raise UsageError(f"{out} exists: export to a new file")
    work.mkdir(parents=True)
    state = {"table": table, "request": request, "as_of": None, "next": None, "pages": 0, "rows": 0}
    _write_state(work, state)
    return state


def _resume(work: Path, table: str, request: dict[str, Any]) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((work / "state.json").read_text())
    except FileNotFoundError:
        raise UsageError(f"no interrupted export at {work} to resume") from None
    if state.get("table") != table or state.get("request") != request:
        raise UsageError(f"{work} is an export of {state.get('table')!r} with {state.get('request')}: "
                         "resume it with the same table and options")
    return state


def _page(c: Client, table: str, request: dict[str, Any], after: str | None, as_of: int | None) -> ScanResult:
    """The next page (the first: the request, at ``as_of`` or now); asked again while the
    node it talks to restarts or its partitions change leader."""
    for attempt in range(_RETRIES):
        try:
            if after is not None:
                page: ScanResult = c.scan_page(table, after=after)
            else:
                page = c.scan_page(table, request.get("prefix"), None, None, request.get("where"), request.get("bbox"),
                                   request.get("columns"), request["limit"], as_of)
            return page
        except ConnectionError:
            if attempt == _RETRIES - 1:
                raise
        except ApiError as e:
            if e.status != 503 or attempt == _RETRIES - 1:
                raise
        time.sleep(min(0.5 * 2**attempt, 5.0))
    raise AssertionError("unreachable")


def _save(work: Path, state: dict[str, Any], page: ScanResult) -> None:
    n = state["pages"] + 1
    path = work / f"page-{n:06d}.arrow"
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, page.rows.schema) as w:
        w.write_table(page.rows)
    os.replace(tmp, path)
    state.update(as_of=page.as_of, next=page.next, pages=n, rows=state["rows"] + page.rows.num_rows)
    _write_state(work, state)


def _write_state(work: Path, state: dict[str, Any]) -> None:
    tmp = work / "state.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, work / "state.json")


def _pages(work: Path, count: int) -> Iterator[pa.Table]:
    for n in range(1, count + 1):
        with pa.memory_map(str(work / f"page-{n:06d}.arrow")) as f:
            yield pa.ipc.open_file(f).read_all()


class _Sink:
    """The file being written, beside its final name (``FILE.tmp``), opened with the first
    page's schema; ``finish`` syncs it and renames it into place."""

    def __init__(self, fmt: str, tmp: Path):
        self.fmt, self.tmp, self.rows = fmt, tmp, 0
        self.writer: Any = None

    def write(self, t: pa.Table) -> None:
        if self.writer is None:
            self.writer = _writer(self.fmt, self.tmp, t.schema)
        self.writer.write_table(t)
        self.rows += t.num_rows

    def finish(self, out: Path) -> int:
        assert self.writer is not None  # a scan answers at least one page
        self.writer.close()
        with open(self.tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, out)
        return self.rows


def _writer(fmt: str, path: Path, schema: pa.Schema) -> Any:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetWriter(str(path), schema, compression="zstd")
    if fmt == "csv":
        import pyarrow.csv as pcsv

        return pcsv.CSVWriter(str(path), schema)
    return pa.ipc.new_file(str(path), schema)


def _bar(args: argparse.Namespace, state: dict[str, Any]) -> Any:
    if args.no_progress or not sys.stderr.isatty() and not os.environ.get("TERRASCALE_PROGRESS"):
        return None
    from tqdm import tqdm

    return tqdm(initial=state["rows"], unit=" rows", unit_scale=True, desc=f"export {args.name}", file=sys.stderr)
