"""Aggregates and grid histograms (docs/rfcs/0012-aggregates.md, docs/REFERENCE.md §3): each
node computes the partial of the partitions it leads at one T; the node that received the
request merges them and answers JSON or, when asked by ``Accept``, an Arrow stream. The
merge runs in a worker thread, like every large encode. An aggregate may name the table
``partitions`` it covers (the Spark reader's per-partition partials) and how ``nan`` orders."""
from __future__ import annotations

import asyncio
import json
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
from aiohttp import web

from node.errors import ApiError
from node.http.api import Api
from node.http.grid_json import counts_json
from node.http.params import (as_of_value, bound, json_body, json_object, off_loop_if_big, partition_list,
                              table_arg, ts_arg, where_terms)
from node.wire import ARROW_STREAM, read_arrow_stream, table_to_rows, write_arrow_stream
from rowstore.db.database import Database
from rowstore.db.read.aggregate import add_stats
from rowstore.reads.aggregates import finish, merge, partial
from rowstore.reads.agg_spec import cname, parse_spec
from rowstore.reads.grids import cell_counts, parse_grid
from rowstore.tables.definitions import TableDef

_AGG = ("group_by", "aggregates", "where", "bbox", "nan")
_HIST = ("column", "bbox", "cells", "where")
INTERNAL = "/v1/internal/aggregate"
_Partial: TypeAlias = pa.Table | np.ndarray  # one share of an aggregate (Arrow rows) or of a histogram (its counts)


def add_aggregate_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_post("/v1/tables/{table}/aggregate", bound(api, aggregate))
    router.add_post("/v1/tables/{table}/histogram", bound(api, histogram))
    router.add_post(INTERNAL, bound(api, share))


async def aggregate(api: Api, request: web.Request) -> web.Response:
    table = request.match_info["table"]
    args, as_of = await _request(request, (*_AGG, "partitions"))
    pids = _partitions(args.pop("partitions"), await api.db.describe(table))
    if args["nan"] is None:  # absent: not sent on to other nodes, which may predate it
        del args["nan"]
    parts: list[pa.Table]  # an aggregate's shares are Arrow rows
    parts, T, stats = await _gathered(api, table, "aggregate", args, as_of, pids)
    schema = (await api.db.describe(table, T, trusted=True)).schema
    assert schema is not None  # a live table's (Database.describe)
    spec = parse_spec(schema, args["group_by"], args["aggregates"], args.get("nan"))
    t = await off_loop_if_big(sum(p.num_rows for p in parts) * 64, lambda: finish(merge(parts, spec), spec))
    if ARROW_STREAM in request.headers.get("Accept", ""):
        return _arrow(t, T, stats)
    text = await off_loop_if_big(t.num_rows * 64, lambda: json.dumps(
        {"as_of": T, "rows": table_to_rows(t), "stats": stats}, allow_nan=False))
    return web.Response(text=text, content_type="application/json", headers={"X-Terrascale-As-Of": str(T)})


async def histogram(api: Api, request: web.Request) -> web.Response:
    table = request.match_info["table"]
    args, as_of = await _request(request, _HIST)
    parts, T, stats = await _gathered(api, table, "histogram", args, as_of)
    counts = parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
    if ARROW_STREAM in request.headers.get("Accept", ""):
        rows = pa.table({"counts": pa.array(list(counts), pa.list_(pa.int64()))})
        return _arrow(rows, T, stats)
    text = await off_loop_if_big(counts.size * 4, _counts_json, counts, T, stats)
    return web.Response(text=text, content_type="application/json", headers={"X-Terrascale-As-Of": str(T)})


async def _request(request: web.Request, fields: tuple[str, ...]) -> tuple[dict[str, Any], int | None]:
    """The body's fields (anything else is a 400 that changes nothing) and ``as_of``."""
    body = await request.read()
    doc = await json_body(request) if body and not body.isspace() else {}
    if not isinstance(doc, dict):
        raise ApiError(400, "invalid_query", "the request is a JSON object")
    extra = set(doc) - set(fields) - {"as_of"}
    if extra:
        raise ApiError(400, "invalid_query", f"unknown field(s): {', '.join(sorted(extra))}")
    where_terms(doc, request)  # 413 beyond node.max_query_terms
    return {f: doc.get(f) for f in fields}, as_of_value(doc.get("as_of"))


def _partitions(value: object, d: TableDef) -> list[int] | None:
    """The request's ``partitions``: None (all of them), or distinct partition numbers of ``d``."""
    if value is None:
        return None
    if not (isinstance(value, list) and value and all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < d.partitions for p in value)
            and len(set(value)) == len(value)):
        raise ApiError(400, "invalid_query", f'"partitions" must list distinct partition numbers 0..{d.partitions - 1} '
                                             f"of table {d.name!r}, not {str(value)[:60]}")
    return value


async def _gathered(api: Api, table: str, kind: str, args: dict[str, Any], as_of: int | None,
                    pids: list[int] | None = None) -> tuple[list[_Partial], int, dict[str, Any]]:
    """Every partial (this node's partitions, or every node's at one T; of ``pids`` only when
    given), T and the stats."""
    db = api.db
    run = db.aggregate if kind == "aggregate" else db.histogram
    if not api.router.multi:
        got, T, stats = await run(table, **args, as_of=as_of, partitions=pids)
        return [got], T, stats

    async def local(pids: list[int], T: int) -> tuple[_Partial, int, dict[str, Any]]:
        return await run(table, **args, as_of=T, partitions=pids, trusted=True)
    async def without(pids: list[int], T: int) -> tuple[_Partial, int, dict[str, Any]]:
        # their leader does not answer: their rows at T from their objects
        return await _from_objects(db, table, kind, args, pids, T)
    d = await db.describe(table)
    T, answers = await api.spread.partials(d, as_of, local, INTERNAL, {"table": table, "kind": kind, "args": args},
                                           without, pids)
    parts: list[_Partial] = []
    stats = {"path": "index", "decoded_columns": [], "rows": 0, "rows_decoded": 0, "partitions": 0}
    for _, a in answers:
        part, st = (a[0], a[2]) if isinstance(a, tuple) else await asyncio.to_thread(_decode, a, kind)
        parts.append(part)
        add_stats(stats, st)
    return parts, T, stats


async def _from_objects(db: Database, table: str, kind: str, args: dict[str, Any], pids: list[int],
                       T: int) -> tuple[_Partial, int, dict[str, Any]]:
    """The partial of partitions read without their leader (an ``as_of`` inside what their
    objects hold, RFC 0010 §6): their rows decoded, then aggregated like any others."""
    schema = (await db.describe(table, T, trusted=True)).schema
    assert schema is not None  # a live table's (Database.describe)
    if kind == "aggregate":
        spec = parse_spec(schema, args["group_by"], args["aggregates"], args.get("nan"))
        rows = await db.query_without_leader(table, T, pids, args["where"], args["bbox"])
        named = {"_row": pa.nulls(rows.num_rows, pa.int8()), **{cname(x): rows.column(x.name) for x in spec.columns()}}
        got = await asyncio.to_thread(partial, pa.table(named), spec)
        used = [x.name for x in spec.columns()]
    else:
        grid = parse_grid(schema, args["column"], args["bbox"], args["cells"])
        rows = await db.query_without_leader(table, T, pids, args["where"], {"column": args["column"], **args["bbox"]})
        got = await asyncio.to_thread(cell_counts, rows.column(args["column"]), grid)
        used = [args["column"]]
    return got, T, {"path": "decode", "decoded_columns": used, "rows": rows.num_rows, "rows_decoded": rows.num_rows,
                    "partitions": len(pids)}


async def share(api: Api, request: web.Request) -> web.Response:
    """A node's partial for its partitions at the coordinator's T (node to node)."""
    doc = await json_object(request, {"table", "kind", "args", "as_of", "partitions"},
                            ("table", "kind", "args", "as_of", "partitions"))
    pids = partition_list(doc["partitions"])
    kind, args, table = doc["kind"], doc["args"], table_arg(doc["table"])
    fields = {"aggregate": _AGG, "histogram": _HIST}.get(kind)
    if fields is None or not isinstance(args, dict) or set(args) - set(fields):
        raise ApiError(400, "bad_request", '"kind" is aggregate or histogram, with its "args"')
    await api.router.mine(table, pids)
    kw: dict[str, Any] = {f: args.get(f) for f in fields}
    as_of = ts_arg(doc["as_of"], "as_of")
    if kind == "aggregate":
        t, _, stats = await api.db.aggregate(table, **kw, as_of=as_of, partitions=pids, trusted=True)
    else:
        counts, _, stats = await api.db.histogram(table, **kw, as_of=as_of, partitions=pids, trusted=True)
        t = pa.table({"counts": pa.array(counts.ravel()), "_ny": pa.array(np.full(counts.size, counts.shape[0]))})
    t = t.replace_schema_metadata({b"stats": json.dumps(stats).encode()})
    return web.Response(body=await asyncio.to_thread(write_arrow_stream, t), content_type=ARROW_STREAM)


def _counts_json(counts: np.ndarray, T: int, stats: dict[str, Any]) -> str:
    """The answer's JSON, its counts written by a kernel (4096 × 4096 cells as Python ints
    would take gigabytes)."""
    return f'{{"as_of": {T}, "counts": {counts_json(counts)}, "stats": {json.dumps(stats)}}}'


def _decode(payload: bytes, kind: str) -> tuple[_Partial, dict[str, Any]]:
    t = read_arrow_stream(payload)
    stats = json.loads(t.schema.metadata[b"stats"])
    t = t.replace_schema_metadata(None)
    if kind == "aggregate":
        return t, stats
    counts = t.column("counts").to_numpy()
    ny = int(t.column("_ny")[0].as_py()) if t.num_rows else 1
    return counts.reshape(ny, -1), stats


def _arrow(t: pa.Table, T: int, stats: dict[str, Any]) -> web.Response:
    return web.Response(body=write_arrow_stream(t), content_type=ARROW_STREAM,
                        headers={"X-Terrascale-As-Of": str(T), "X-Terrascale-Stats": json.dumps(stats)})
