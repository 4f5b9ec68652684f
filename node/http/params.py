"""Request parsing shared by the node's HTTP handlers (``node/http/api.py``, ``node/http/routes/``):
the one error a handler raises, JSON bodies parsed off the event loop once they are large and
held to the configured depth, ``as_of`` and ``where`` limits, and the arguments of node-to-node
calls (integers, timestamps from another node's clock, table names, partition lists)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, TypeVarTuple

from aiohttp import web

from node.config import NodeConfig
from node.errors import ApiError
from node.wire import BodyError, parse_json_body
from rowstore.hlc import ms_of
from rowstore.schema import Column, SchemaVersion, _check_name
from rowstore.types import ColumnType

THREAD_BYTES = 256 << 10  # bodies (and results) bigger than this are converted off the event loop
THREAD_ROWS = 2000

MAX_SKEW_MS = 10_000  # how far ahead of this node's clock another node's timestamp may be

T = TypeVar("T")
Args = TypeVarTuple("Args")
A = TypeVar("A")  # what a handler is given besides the request (node.http.api.Api, or what it implements)
R = TypeVar("R", bound=web.StreamResponse)


def int_arg(raw: object, name: str) -> int:
    if isinstance(raw, str) and raw.isdigit() and len(raw) <= 20:
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < 2**64:
        raise ApiError(400, "bad_request", f"{name} is an integer 0..2^64-1, not {raw!r}"[:200])
    return raw


def ts_arg(raw: object, name: str) -> int:
    """A timestamp from another node: observed by this node's clock, so never far ahead of
    it (a wild one would push every later commit timestamp up with it)."""
    ts = int_arg(raw, name)
    if ms_of(ts) > time.time_ns() // 1_000_000 + MAX_SKEW_MS:
        raise ApiError(400, "bad_request", f"{name} {ts} is more than {MAX_SKEW_MS // 1000} s ahead of this "
                                           "node's clock")
    return ts


def table_arg(raw: object) -> str:
    if not isinstance(raw, str):
        raise ApiError(400, "bad_request", '"table" is a table name')
    return raw


def partition_list(raw: object) -> list[int]:
    """The partitions a node-to-node request names: a non-empty list of partition numbers."""
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "bad_request", '"partitions" is a non-empty list of partition numbers')
    return [int_arg(p, "a partition") for p in raw]


CONFIG = web.AppKey("config", NodeConfig)  # the node's NodeConfig: limits for the module-level helpers


async def off_loop_if_big(size: int, fn: Callable[[*Args], T], *args: *Args) -> T:
    """Run ``fn`` in a worker thread when the work is big enough to stall the event loop."""
    return await asyncio.to_thread(fn, *args) if size > THREAD_BYTES else fn(*args)


def rows_of(doc: object) -> object:
    if not isinstance(doc, dict) or set(doc) != {"rows"}:
        raise ApiError(400, "invalid_rows", 'expected a JSON object {"rows": [...]}')
    return doc["rows"]


def parse_json(body: bytes, max_depth: int) -> Any:
    try:
        return parse_json_body(body, max_depth)
    except BodyError as e:
        raise ApiError(e.status, e.code, str(e)) from None


async def json_body(request: web.Request) -> Any:
    """The request's JSON body, parsed off the event loop once it is large."""
    body = await request.read()
    return await off_loop_if_big(len(body), parse_json, body, request.app[CONFIG].max_json_depth)


def where_terms(doc: dict[str, Any], request: web.Request) -> Any:
    """A query's ``where`` terms (JSON the engine checks), at most ``node.max_query_terms`` (413 beyond)."""
    where = doc.get("where")
    most = request.app[CONFIG].max_query_terms
    if isinstance(where, list) and len(where) > most:
        raise ApiError(413, "too_large", f"{len(where)} where terms; a query takes at most {most} "
                                         f"(node.max_query_terms)")
    return where


async def json_object(request: web.Request, allowed: set[str], required: Iterable[str] = ()) -> dict[str, Any]:
    doc = await json_body(request)
    if not isinstance(doc, dict):
        raise ApiError(400, "invalid_json", "expected a JSON object")
    extra = set(doc) - allowed
    if extra:
        raise ApiError(400, "bad_request", f"unknown field(s): {', '.join(sorted(extra))}")
    missing = [k for k in required if k not in doc]
    if missing:
        raise ApiError(400, "bad_request", f"missing field(s): {', '.join(missing)}")
    return doc


def as_of_value(v: object) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ApiError(400, "invalid_as_of", f"as_of must be a commit timestamp (a non-negative integer), not {v!r}")
    return v


def as_of_param(request: web.Request) -> int | None:
    raw = request.query.get("as_of")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 20):  # "²".isdigit(); int() of 5000 digits raises
        raise ApiError(400, "invalid_as_of", f"as_of must be a commit timestamp (a non-negative integer), not {raw!r}")
    return int(raw)


def schema_from_json(columns: object, primary_key: object, partition_key: object = None) -> SchemaVersion:
    """A new table's schema from ``POST /v1/tables``: ``primary_key`` is a column name or a list
    of them (in key order); ``partition_key`` a leading run of those (default: the first)."""
    if not isinstance(columns, list) or not columns:
        raise ApiError(400, "invalid_schema", '"columns" must be a non-empty list')
    keys = [primary_key] if isinstance(primary_key, str) else primary_key
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ApiError(400, "invalid_schema", '"primary_key" must be a column name or a list of column names')
    parts = 1 if partition_key is None else _partition_key(partition_key, keys)
    cols: list[Column] = []
    for i, c in enumerate(columns):
        if not isinstance(c, dict) or not {"name", "type"} <= set(c) or set(c) - {"name", "type", "nullable"}:
            raise ApiError(400, "invalid_schema", f"columns[{i}]: expected {{name, type, nullable}}")
        name, type_text, nullable = c["name"], c["type"], c.get("nullable", True)
        if not isinstance(name, str) or not isinstance(type_text, str) or not isinstance(nullable, bool):
            raise ApiError(400, "invalid_schema", f"columns[{i}]: name and type are strings, nullable a boolean")
        _check_name(name)
        if name in keys:
            if "nullable" in c and nullable:
                raise ApiError(400, "invalid_schema", f"the primary key column {name!r} cannot be nullable")
            nullable = False
        cols.append(Column(i + 1, name, ColumnType.parse(type_text), nullable))
    ids = {c.name: c.id for c in cols}
    missing = [k for k in keys if k not in ids]
    if missing:
        raise ApiError(400, "invalid_schema", f"primary_key {missing[0]!r} is not one of the columns")
    return SchemaVersion(1, tuple(cols), tuple(ids[k] for k in keys), len(cols) + 1, parts)


def _partition_key(value: object, keys: list[str]) -> int:
    """``partition_key``: a leading run of the key's columns, as how many lead."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or names != keys[: len(names)]:
        raise ApiError(400, "invalid_schema", f'"partition_key" must be a leading run of the primary key {keys} '
                                              f"(such as {keys[:1]}), not {value!r}"[:300])
    return len(names)


def bound(api: A, handler: Callable[[A, web.Request], Awaitable[R]]) -> Callable[[web.Request], Awaitable[R]]:
    """``handler(api, request)`` as an aiohttp handler (it wants coroutine functions, not partials)."""
    async def run(request: web.Request) -> R:
        return await handler(api, request)
    return run
