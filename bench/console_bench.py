"""The admin console's page loads with many tables and segments (docs/console.md), in headless
Chromium (Debian's package, as the console's tests use it) against one real node.

A node with ``BENCH_CONSOLE_TABLES`` tables (default 100) of 8 partitions, written and sealed
in rounds until it holds ``BENCH_CONSOLE_SEGMENTS`` segments (default 10,000). Then, for each
page, a full reload of the signed-in tab until the page's main table is drawn (median of
``RUNS``) — vs the peer: the API calls that page makes, timed from Python (so the difference
is the browser's part: parsing, building the DOM, layout). Filling the node is most of the run
(about 25 minutes on 2 shared cores); docs/console.md has the numbers measured."""
from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Result, print_table, write_json
from bench.node_proc import NodeProc

TABLES = int(os.environ.get("BENCH_CONSOLE_TABLES", 100))
SEGMENTS = int(os.environ.get("BENCH_CONSOLE_SEGMENTS", 10_000))
RUNS = 5
TOKEN = "bench-token"
# page -> (the element drawn last, the API calls the page makes on load)
PAGES = {
    "cluster": ("#partitions", ["/v1/admin/status", "/v1/admin/cluster", "/v1/admin/nodes"]),
    "tables": ("#segments", ["/v1/admin/status", "/v1/tables", "/v1/tables/t000", "/v1/admin/segments?table=t000"]),
    "explorer": ("#q-run", ["/v1/admin/status", "/v1/tables", "/v1/admin/status"]),
}


def fill(node: NodeProc) -> int:
    """Tables written and sealed in rounds until the node holds SEGMENTS segments; how many it holds."""
    with node.client(timeout=120) as c:
        for t in range(TABLES):
            c.create_table(f"t{t:03d}", [("id", "int64"), ("loc", "point"), ("v", "float64")], "id", partitions=8)
        key = 0
        while True:
            n = len(c.segments()["segments"])
            if n >= SEGMENTS:
                return n
            for t in range(TABLES):
                rows = [{"id": key + i, "loc": {"x": (key + i) % 360 - 180.0, "y": (key + i) % 180 - 90.0}, "v": 1.0}
                        for i in range(64)]
                c.upsert(f"t{t:03d}", rows)
            key += 64
            c.admin("seal")


def api_seconds(node: NodeProc, paths: list[str]) -> float:
    with node.client(timeout=120) as c:
        t0 = time.perf_counter()
        for p in paths:
            c._call("GET", p)
        return time.perf_counter() - t0


def page_seconds(node: NodeProc) -> dict[str, float]:
    from playwright.sync_api import sync_playwright
    out = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        pg = b.new_page(viewport={"width": 1280, "height": 900})
        pg.goto(node.base + "/ui/")
        pg.fill("#token", TOKEN)
        pg.click("#login button[type=submit]")
        pg.wait_for_selector("#node-info:has-text('node')")
        for name, (done, _) in PAGES.items():
            pg.click(f"#nav a[data-page={name}]")
            pg.wait_for_selector(done, timeout=120_000)
            runs = []
            for _ in range(RUNS):
                t0 = time.perf_counter()
                pg.reload()
                pg.wait_for_selector(done, timeout=120_000)
                runs.append(time.perf_counter() - t0)
            out[name] = statistics.median(runs)
        b.close()
    return out


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="console-bench-"))
    node = NodeProc(root, token=TOKEN, extra='[jobs]\noffload_every = "0s"\ncheckpoint_every = "1s"\n')
    try:
        node.start()
        t0 = time.perf_counter()
        held = await asyncio.to_thread(fill, node)
        print(f"{TABLES} tables, {held} segments written in {time.perf_counter() - t0:.0f} s", flush=True)
        pages = await asyncio.to_thread(page_seconds, node)
        results = [Result(f"{name} page load ({TABLES} tables, {held} segments)", 1000 * s, "its API calls",
                          1000 * api_seconds(node, PAGES[name][1]), "ms", extra={"segments": held})
                   for name, s in pages.items()]
    finally:
        node.ensure_stopped()
        shutil.rmtree(root, ignore_errors=True)
    print_table("Admin console page loads (median of 5 reloads, until the page's table is drawn)", results)
    write_json("console", results)


if __name__ == "__main__":
    asyncio.run(main())
