"""The admin console (docs/console.md): its files at ``GET /ui/`` on every node, from the
package's own ``node/ui/static/`` — public, since they hold no data; every data call the
console makes goes to the API with the bearer token. Each answer carries a strict
Content-Security-Policy: scripts and styles from this node only, no inline code, no eval,
no other host — so a value that looks like markup can never run."""
from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path

from aiohttp import web

from node.errors import ApiError
from node.http.params import bound
from node.http.ports import HandlerApi

STATIC = Path(__file__).resolve().parents[2] / "ui" / "static"
PREFIX = "/ui/"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
           # revalidated on every load (an ETag answers 304): a node upgraded serves its new files at once
           "Cache-Control": "no-cache"}
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".json": "application/json",
         ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain"}


def add_console_routes(api: HandlerApi, router: web.UrlDispatcher) -> None:
    files = load(STATIC)

    async def index(api: HandlerApi, request: web.Request) -> web.Response:
        return serve(files, "index.html", request)

    async def file(api: HandlerApi, request: web.Request) -> web.Response:
        return serve(files, request.match_info["path"], request)

    router.add_get("/ui", bound(api, to_index))
    router.add_get("/ui/", bound(api, index))
    router.add_get("/ui/{path:.+}", bound(api, file))


ROUTES = {"/ui", PREFIX, PREFIX + "{path}"}


def public(request: web.Request) -> bool:
    """The console's files need no token (the edge asks none for them): they hold no data. Known
    by the route the request matched, not by its path's text."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in ROUTES


def load(root: Path) -> dict[str, tuple[bytes, str, str]]:
    """Every file under ``root`` read once at start: relative path -> (body, type, ETag). Only
    these names are served, so no request path reaches the file system."""
    out: dict[str, tuple[bytes, str, str]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            body = p.read_bytes()
            ctype = TYPES.get(p.suffix) or mimetypes.guess_type(p.name)[0] or "application/octet-stream"
            out[p.relative_to(root).as_posix()] = (body, ctype, '"%s"' % hashlib.sha256(body).hexdigest()[:32])
    return out


async def to_index(api: HandlerApi, request: web.Request) -> web.Response:
    raise web.HTTPPermanentRedirect(PREFIX)


def serve(files: dict[str, tuple[bytes, str, str]], name: str, request: web.Request) -> web.Response:
    got = files.get(name)
    if got is None:
        raise ApiError(404, "not_found", f"the console has no file {name!r}")
    body, ctype, etag = got
    headers = {**HEADERS, "ETag": etag}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    charset = "utf-8" if ctype.startswith("text/") or ctype.endswith(("json", "javascript", "svg+xml")) else None
    return web.Response(body=body, content_type=ctype, charset=charset, headers=headers)
