"""The console's files at /ui/ on a real node: public, under a strict Content-Security-Policy,
revalidated by ETag, only the package's own files; every data call still needs the token."""
import http.client
import json
import re
from pathlib import Path

import pytest

from bench.node_proc import NodeProc
from node.http.routes.console import STATIC

TOKEN = "console-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("console"), token=TOKEN)
    n.start()
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log


def fetch(node, path, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def test_the_page_is_public_and_under_a_strict_policy(node):
    status, h, body = fetch(node, "/ui/")
    assert status == 200 and h["content-type"].startswith("text/html")
    csp = h["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert h["x-content-type-options"] == "nosniff" and h["cache-control"] == "no-cache"
    assert b"<script>" not in body and "onclick" not in body.decode() and "style=" not in body.decode()


def test_every_file_the_page_names_is_served_from_this_host(node):
    """Scripts, styles and modules: relative or absolute to this node, never another host."""
    texts = [fetch(node, "/ui/")[2].decode()]
    texts += [p.read_text() for p in Path(STATIC, "js").rglob("*.js")]
    for text in texts:
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "a file from another host"
        assert not re.search(r"""from ["']https?:""", text) and "eval(" not in text and "innerHTML" not in text
    for ref in re.findall(r'(?:src|href)="([^":]+)"', texts[0]):
        status, h, _ = fetch(node, "/ui/" + ref)
        assert status == 200, ref
        assert "content-security-policy" in h


def test_an_unchanged_file_is_a_304(node):
    _, h, _ = fetch(node, "/ui/js/app.js")
    assert h["content-type"].startswith("text/javascript")
    status, _, body = fetch(node, "/ui/js/app.js", {"If-None-Match": h["etag"]})
    assert status == 304 and body == b""


def test_only_the_packages_files(node):
    for path in ("/ui/nope.js", "/ui/../node.toml", "/ui/%2e%2e/node.toml", "/ui/js/../../node.toml"):
        status, h, body = fetch(node, path)
        assert status == 404, path
        assert set(json.loads(body)["error"]) == {"code", "message"}


def test_ui_redirects_to_the_page(node):
    status, h, _ = fetch(node, "/ui")
    assert status == 308 and h["location"] == "/ui/"


def test_data_calls_still_need_the_token(node):
    for path in ("/v1/admin/status", "/ui/../v1/admin/status", "/ui/%2e%2e/v1/admin/status",
                 "/ui/..%2fv1/admin/status"):
        status, _, body = fetch(node, path)
        assert status in (401, 404) and json.loads(body)["error"]["code"] in ("unauthorized", "not_found"), path
    status, _, body = fetch(node, "/v1/admin/status")
    assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
    status, _, body = fetch(node, "/v1/admin/nodes", {"Authorization": f"Bearer {TOKEN}"})
    doc = json.loads(body)
    assert status == 200 and [n["id"] for n in doc["nodes"]] == ["n1"]
    assert doc["nodes"][0]["status"]["version"] and doc["nodes"][0]["status"]["history_horizon"] is not None
