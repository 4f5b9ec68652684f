"""The hand-off endpoints (RFC 0010 §7): ``POST /v1/internal/handoff`` (move a one-copy
partition this node serves to another node) and ``POST /v1/internal/take`` (serve what the
placement now gives this node). The moves themselves: :mod:`node.cluster.handoff`."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from node.cluster.handoff import hand_off, take_if_placed
from node.errors import ApiError
from node.http.api import Api
from node.http.params import bound, json_object
from node.http.answers import json_answer


def add_handoff_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_post("/v1/internal/handoff", bound(api, handoff))
    router.add_post("/v1/internal/take", bound(api, take))


async def _doc(api: Api, request: web.Request, keys: set[str], required: Iterable[str]) -> dict[str, Any]:
    doc = await json_object(request, keys, required)
    if not isinstance(doc["table"], str) or isinstance(doc["pid"], bool) or not isinstance(doc["pid"], int):
        raise ApiError(400, "bad_request", '"table" is a table name, "pid" an integer')
    api.db  # noqa: B018 - 503 while starting or stopping
    if not api.multi:
        raise ApiError(409, "not_a_cluster", "moving partitions needs a cluster (catalog raft://)")
    return doc


async def handoff(api: Api, request: web.Request) -> web.Response:
    doc = await _doc(api, request, {"table", "pid", "to"}, ("table", "pid", "to"))
    if not isinstance(doc["to"], str):
        raise ApiError(400, "bad_request", '"to" is a node id')
    return json_answer(await hand_off(api.serving, doc["table"], doc["pid"], doc["to"]))


async def take(api: Api, request: web.Request) -> web.Response:
    doc = await _doc(api, request, {"table", "pid"}, ("table", "pid"))
    return json_answer({"taken": await take_if_placed(api.serving, doc["table"], doc["pid"])})
