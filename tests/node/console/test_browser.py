"""The admin console in headless Chromium (Debian's package, `make chromium`; Playwright's Python
package launches it, never a browser of its own) against a real 3-node cluster with R=3: each
page shows the numbers the API gives, a node killed with -9 shows down and its partitions'
new leaders, a box drawn on the map gives the rows POST /query gives for that bbox, values
that look like markup stay text, and a wrong token shows the API's 401 message.

Screenshots of every page: test-artifacts/console/ (git ignores it)."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from bench.node_proc import NodeProc, raft_cluster, start_all
from node.client.client import Client
from tests.node.http.test_api import _self_signed
from tests.node.proc import FAST_CLUSTER, eventually

TOKEN = "console-test-token"
SHOTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "console"
XSS = ["<script>window.__xss = 1</script>", "<img src=x onerror=window.__xss=2>", '"><svg onload=alert(1)>']
WAIT = 30_000  # ms: the longest any expectation waits (a page refreshes every 2-5 s)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = raft_cluster(tmp_path_factory.mktemp("console"), 3, extra=FAST_CLUSTER)
    for n in nodes:
        n.config.write_text(n.config.read_text() + f'[security]\ntoken = "{TOKEN}"\n')
        n.token = TOKEN
    try:
        start_all(nodes)
        with nodes[0].client(timeout=60) as c:
            c.create_table("pts", [("id", "int64"), ("loc", "point"), ("name", "string")], "id", indexes=["loc"],
                           partitions=4, replicas=3)
            rng = random.Random(7)
            rows = [{"id": i, "loc": {"x": rng.uniform(-170, 170), "y": rng.uniform(-60, 70)}, "name": f"p{i}"}
                    for i in range(600)]
            rows += [{"id": 1000 + i, "loc": {"x": 10.0 * i, "y": 5.0}, "name": s} for i, s in enumerate(XSS)]
            nodes[0].first_commit = eventually(lambda: c.upsert("pts", rows))["commit_ts"]
            c.admin("seal")
        yield nodes
    finally:
        for n in nodes:
            n.ensure_stopped()


@pytest.fixture(scope="module")
def browser():
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("the console's browser tests need Debian's chromium: run `make chromium` (make test does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, cluster):
    """A new tab on node n1's console, signed in; every dialog (alert ...) it opens is recorded."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.dialogs, pg.errors = [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))  # an uncaught exception in the console's code
    pg.on("console", lambda m: "Content Security Policy" in m.text and pg.errors.append(m.text))
    pg.goto(cluster[0].base + "/ui/")
    pg.fill("#token", TOKEN)
    pg.click("#login button[type=submit]")
    expect(pg.locator("#node-info")).to_contain_text("node n1", timeout=WAIT)
    yield pg
    assert pg.dialogs == [], "a value from the API ran as script"
    assert pg.errors == [], "the page raised or broke its own policy"
    assert pg.evaluate("window.__xss") is None
    ctx.close()


def shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def open_page(pg, name: str) -> None:
    pg.click(f"#nav a[data-page={name}]")
    expect(pg.locator(f"#page[data-page={name}]")).to_be_visible()


def text(pg, selector: str) -> str:
    return pg.locator(selector).inner_text(timeout=WAIT).strip()


def test_a_wrong_token_shows_the_401_message(browser, cluster):
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.goto(cluster[0].base + "/ui/")
    pg.fill("#token", "not-the-token")
    pg.click("#login button[type=submit]")
    expect(pg.locator("#login-error")).to_have_text("unauthorized: missing or wrong bearer token", timeout=WAIT)
    assert pg.evaluate("sessionStorage.length") == 0 and "token" not in pg.url
    shot(pg, "login-wrong-token")
    ctx.close()


def test_the_token_stays_in_session_storage_and_off_urls(page, cluster):
    assert page.evaluate("sessionStorage.getItem('terrascale.token')") == TOKEN
    assert page.evaluate("localStorage.length") == 0 and TOKEN not in page.url
    urls = []
    page.on("request", lambda r: urls.append(r.url))
    open_page(page, "tables")
    expect(page.locator("#table-summary")).to_be_visible(timeout=WAIT)
    assert urls and not any(TOKEN in u for u in urls)


def test_cluster_page_shows_the_members_leaders_and_epochs(page, cluster):
    open_page(page, "cluster")
    with cluster[0].client() as c:
        def same():
            view = c.cluster()
            assert text(page, '[data-k="catalog-leader"]') == view["leader"]
            for m in view["members"]:
                assert text(page, f'tr[data-node="{m["id"]}"] [data-k="state"]') == "up"
            for p in view["placement"]["pts"]:
                row = f'tr[data-part="pts/{p["partition"]}"]'
                assert text(page, f"{row} [data-k=leader]") == p["leader"]
                assert text(page, f"{row} [data-k=epoch]") == str(p["epoch"])
                assert text(page, f"{row} [data-k=health]") == "ok"
            status = {n.node_id: n.client().status() for n in cluster}
            for nid, st in status.items():
                assert text(page, f'tr[data-node="{nid}"] [data-k="led"]') == str(st["partitions_owned"])
        eventually(same, 60)
    shot(page, "cluster")


def test_membership_changes_wait_for_a_confirmation(page, cluster):
    open_page(page, "cluster")
    with cluster[0].client() as c:
        before = c.cluster()["members"]
    page.locator('tr[data-node="n3"] button').click()
    expect(page.locator("#confirm")).to_contain_text(f"Remove the member at {cluster[2].raft_address}?")
    page.locator("#confirm button", has_text="Cancel").click()
    expect(page.locator("#confirm")).to_have_count(0)
    with cluster[0].client() as c:
        assert [m["id"] for m in c.cluster()["members"]] == [m["id"] for m in before]


def test_tables_page_shows_the_description_and_segments(page, cluster):
    with cluster[0].client() as c:
        if "extra" not in {col["name"] for col in c.describe("pts")["columns"]}:
            c.add_column("pts", "extra", "float64")
    open_page(page, "tables")
    with cluster[0].client() as c:
        def same():
            history = page.locator("#schema-history tbody tr")
            assert history.count() == 2 and "extra float64" in history.nth(0).inner_text()
            assert "extra" not in history.nth(1).inner_text()
            d, segs = c.describe("pts"), c.segments("pts")["segments"]
            assert text(page, "#table-summary [data-k=partitions]") == str(d["partitions"])
            assert text(page, "#table-summary [data-k=replicas]") == "3"
            assert text(page, "#table-summary [data-k=version]") == str(d["schema_version"])
            for state in {s["state"] for s in segs}:
                n = sum(1 for s in segs if s["state"] == state)
                assert text(page, f"#segment-states [data-k=n-{state}]") == str(n)
            assert page.locator("#table-partitions tbody tr").count() == d["partitions"]
        eventually(same, 60)
    shot(page, "tables")


def test_explorer_rows_and_markup_stay_text(page, cluster):
    open_page(page, "explorer")
    page.fill("#q-columns", "id,name")
    page.click("#q-run")
    with cluster[0].client() as c:
        total = len(c.query_json("pts", limit=100_000)["rows"])
    expect(page.locator("#row-count")).to_have_text(str(total), timeout=WAIT)
    pages = -(-total // 50)
    expect(page.locator("#explorer-result")).to_contain_text(f"page 1 of {pages}")
    page.click("#page-next")
    expect(page.locator("#explorer-result")).to_contain_text(f"page 2 of {pages}")
    assert page.locator("#rows tbody tr").count() == min(50, total - 50)
    expect(page.locator("#explorer-commands")).to_contain_text("terrascale --endpoint")
    cells = page.locator("#rows td")
    page.fill("#q-columns", "id,name")
    page.click("#q-where-add")
    page.select_option("#q-where-col-0", "id")
    page.select_option("#q-where-op-0", ">=")
    page.fill("#q-where-val-0", "1000")
    page.dispatch_event("#q-where-val-0", "change")
    page.click("#q-run")
    expect(page.locator("#row-count")).to_have_text(str(len(XSS)), timeout=WAIT)
    for s in XSS:  # shown as the very text the row holds; nothing injected
        expect(cells.filter(has_text=s)).to_have_count(1)
    assert page.locator("#rows img, #rows script, #rows svg").count() == 0
    shot(page, "explorer")
    page.fill("#q-columns", XSS[1])  # an error message quoting the input: text as well
    page.dispatch_event("#q-columns", "change")
    page.click("#q-run")
    expect(page.locator("#error")).to_contain_text(f"no column '{XSS[1]}'", timeout=WAIT)
    assert page.locator("#error img").count() == 0


def test_explorer_reads_as_of_the_time_on_its_slider(page, cluster):
    with cluster[0].client() as c:
        eventually(lambda: c.upsert("pts", [{"id": 5000 + i, "name": "later"} for i in range(5)]))
        latest = len(c.query_json("pts", limit=100_000)["rows"])
    open_page(page, "explorer")
    expect(page.locator("#q-asof")).to_be_visible(timeout=WAIT)
    page.locator("#q-asof").fill(str(cluster[0].first_commit >> 16))  # the first batch's millisecond
    page.click("#q-run")
    expect(page.locator("#result-asof")).not_to_have_text("", timeout=WAIT)
    as_of = int(text(page, "#result-asof"))
    assert as_of >> 16 == cluster[0].first_commit >> 16
    with cluster[0].client() as c:
        want = len(c.query_json("pts", as_of=as_of, limit=100_000)["rows"])
    assert want < latest
    expect(page.locator("#row-count")).to_have_text(str(want))
    expect(page.locator("#explorer-commands")).to_contain_text(f"--as-of {as_of}")


def test_a_box_drawn_on_the_map_gives_the_rows_of_that_bbox(page, cluster):
    open_page(page, "map")
    expect(page.locator("#map-note")).to_contain_text("points in view", timeout=WAIT)
    shot(page, "map")
    page.click("#map-box")
    box = page.locator("#map-canvas").bounding_box()
    page.mouse.move(box["x"] + 300, box["y"] + 120)
    page.mouse.down()
    page.mouse.move(box["x"] + 500, box["y"] + 220, steps=5)
    page.mouse.move(box["x"] + 650, box["y"] + 330, steps=5)
    page.mouse.up()
    expect(page.locator("#map-box-count")).to_be_visible(timeout=WAIT)
    b = {k: float(page.get_attribute("#map-bbox", f"data-{k}")) for k in ("xmin", "ymin", "xmax", "ymax")}
    assert b["xmin"] < b["xmax"] and b["ymin"] < b["ymax"]
    with cluster[0].client() as c:
        want = len(c.query_json("pts", bbox={"column": "loc", **b}, limit=100_000)["rows"])
    assert 0 < want < 600
    expect(page.locator("#map-box-count")).to_have_text(str(want))
    shot(page, "map-box")
    page.click("#map-open-explorer")
    expect(page.locator("#row-count")).to_have_text(str(want), timeout=WAIT)
    assert float(page.input_value("#q-bbox-xmin")) == b["xmin"]


def test_map_pan_and_zoom_read_the_points_of_the_view(page, cluster):
    open_page(page, "map")
    note = page.locator("#map-note")
    expect(note).to_have_attribute("data-points", "603", timeout=WAIT)  # the whole world: every row with a point
    box = page.locator("#map-canvas").bounding_box()
    page.mouse.move(box["x"] + 500, box["y"] + 250)
    for _ in range(3):
        page.mouse.wheel(0, -100)  # zoom in at the centre
    page.mouse.move(box["x"] + 600, box["y"] + 300)
    page.mouse.down()
    page.mouse.move(box["x"] + 500, box["y"] + 250, steps=4)  # pan: the view moves east and south
    page.mouse.up()

    def same():
        v = {k: float(note.get_attribute(f"data-{k}")) for k in ("xmin", "ymin", "xmax", "ymax")}
        assert v["xmax"] - v["xmin"] < 200 and v["xmin"] > -180
        with cluster[0].client() as c:
            want = len(c.query_json("pts", bbox={"column": "loc", **v}, limit=100_000)["rows"])
        assert note.get_attribute("data-points") == str(want) and 0 < want < 603
    eventually(same, 30)
    shot(page, "map-zoomed")


def test_map_density_layer_counts_the_points_of_the_view_with_the_histogram_endpoint(page, cluster):
    """The density layer's cells, from POST /histogram over the view, add up to the rows
    POST /query finds in the same bbox (edges inclusive in both)."""
    open_page(page, "map")
    expect(page.locator("#map-note")).to_contain_text("points in view", timeout=WAIT)
    page.select_option("#map-layer", "density")
    note = page.locator("#map-note")
    expect(note).to_contain_text("counted per cell by the histogram endpoint", timeout=WAIT)

    def same():
        v = {k: float(note.get_attribute(f"data-{k}")) for k in ("xmin", "ymin", "xmax", "ymax")}
        with cluster[0].client() as c:
            want = len(c.query_json("pts", bbox={"column": "loc", **v}, limit=100_000)["rows"])
        assert note.get_attribute("data-cells") == str(want) and want > 0
    eventually(same, 30)
    shot(page, "map-density")


def test_explorer_live_reruns_the_query_as_changes_commit(page, cluster):
    """"Live" on the Explorer: a subscription with the query's filter says when a change touches
    the result, and the query runs again as of the closed T covering it — rows that come to
    match appear, rows that stop matching (an overwrite) or are deleted go."""
    open_page(page, "explorer")
    page.select_option("#q-table", "pts")
    page.click("#q-where-add")
    page.select_option("#q-where-col-0", "name")
    page.fill("#q-where-val-0", "watched")
    page.locator("#q-where-val-0").dispatch_event("change")
    page.click("#q-live")
    expect(page.locator("#q-live-state")).to_contain_text("live (live)", timeout=WAIT)
    expect(page.locator("#row-count")).to_have_text("0")
    with cluster[1].client() as c:  # written through another node
        c.upsert("pts", [{"id": 9100 + i, "loc": {"x": 3.0, "y": 4.0}, "name": "watched"} for i in range(2)])
        expect(page.locator("#row-count")).to_have_text("2", timeout=WAIT)
        c.upsert("pts", [{"id": 9100, "loc": {"x": 3.0, "y": 4.0}, "name": "not any more"}])
        expect(page.locator("#row-count")).to_have_text("1", timeout=WAIT)
        c.delete("pts", [9101])
        expect(page.locator("#row-count")).to_have_text("0", timeout=WAIT)
        c.delete("pts", [9100])
    expect(page.locator("#q-live-state")).to_contain_text("up to commit")


def test_map_live_shows_each_change_as_it_commits(page, cluster):
    """"Live": the view's points, then every change to them as it commits, from a subscription
    across the three nodes (each leads some partitions; node/ui/static/js/live.js): points
    written in view appear, one moved out of the view goes, a deleted one goes — the page never
    reloads (the density layer's refresh is off while live)."""
    open_page(page, "map")
    note = page.locator("#map-note")
    expect(note).to_have_attribute("data-points", "603", timeout=WAIT)
    page.click("#map-live")
    expect(note).to_contain_text("live (live)", timeout=WAIT)
    expect(page.locator("#map-live")).to_have_attribute("aria-pressed", "true")
    ids = [9000, 9001, 9002]
    with cluster[0].client() as c:
        written = [{"id": i, "loc": {"x": 1.0 + i % 10, "y": 2.0}, "name": f"live{i}"} for i in ids]
        T = c.upsert("pts", written)["commit_ts"]
        expect(note).to_have_attribute("data-points", "606", timeout=WAIT)
        assert int(note.get_attribute("data-live")) >= T  # shown once a closed timestamp covers it
        c.upsert("pts", [{"id": 9000, "loc": {"x": 1.0, "y": 95.0}, "name": "gone north"}])  # out of the view
        expect(note).to_have_attribute("data-points", "605", timeout=WAIT)
        c.delete("pts", [9001])
        expect(note).to_have_attribute("data-points", "604", timeout=WAIT)
        shot(page, "map-live")
        c.delete("pts", [9000, 9002])
        expect(note).to_have_attribute("data-points", "603", timeout=WAIT)


def test_jobs_dry_run_before_gc(page, cluster):
    open_page(page, "jobs")
    page.click("#job-seal")
    expect(page.locator("#job-answer")).to_contain_text('"job": "seal"', timeout=WAIT)
    expect(page.locator("#gc-run")).to_be_disabled()
    page.click("#gc-dry")
    expect(page.locator("#job-answer")).to_contain_text('"dry_run":true', timeout=WAIT)
    expect(page.locator("#job-answer")).to_contain_text('"job": "gc"')
    expect(page.locator("#gc-run")).to_be_enabled()
    page.click("#gc-run")
    expect(page.locator("#job-answer")).to_contain_text('"dry_run":false', timeout=WAIT)
    expect(page.locator("#gc-run")).to_be_disabled()
    expect(page.locator('[data-k="gc-runs"]')).to_contain_text("now", timeout=WAIT)
    shot(page, "jobs")


def test_metrics_charts_follow_the_nodes_counters(page, cluster):
    open_page(page, "metrics")
    for k in ("rows-per-s", "fsync-per-s", "queries-per-s", "lag-bytes"):
        expect(page.locator(f'[data-k="{k}"]')).to_contain_text("now", timeout=WAIT)
    key = iter(range(20_000, 30_000, 50))

    def moving():  # rows written and queries through this node show as rates above 0
        with cluster[0].client() as c:
            k = next(key)
            c.upsert("pts", [{"id": k + i, "name": "m"} for i in range(50)])
            c.query_json("pts", where=[["id", "=", k]])
        for chart in ("rows-per-s", "queries-per-s"):
            assert text(page, f'[data-k="{chart}"]') not in ("now 0", ""), chart
    eventually(moving, 60, every=0.5)
    shot(page, "metrics")


def test_zz_a_killed_node_shows_down_and_its_partitions_new_leaders(page, cluster):
    """Last in the module: it kills a node of the shared cluster."""
    open_page(page, "cluster")
    victim = cluster[2]
    with cluster[0].client() as c:
        led = [p["partition"] for p in c.cluster()["placement"]["pts"] if p["leader"] == victim.node_id]
        victim.kill()
        expect(page.locator(f'tr[data-node="{victim.node_id}"] [data-k="state"]')).to_have_text("down", timeout=WAIT)

        def moved():
            place = {p["partition"]: p for p in c.cluster()["placement"]["pts"]}
            for pid in led:
                assert place[pid]["leader"] != victim.node_id
                row = f'tr[data-part="pts/{pid}"]'
                assert text(page, f"{row} [data-k=leader]") == place[pid]["leader"]
                assert text(page, f"{row} [data-k=epoch]") == str(place[pid]["epoch"])
            for pid in place:  # every partition had a replica on it: all under-replicated now
                assert text(page, f'tr[data-part="pts/{pid}"] [data-k=health]') == "under-replicated"
        eventually(moved, 60)
    expect(page.locator(f'tr[data-node="{victim.node_id}"]')).to_have_class("down")
    shot(page, "cluster-node-down")


def test_over_tls_as_the_api(browser, tmp_path):
    """A node serving HTTPS serves its console over HTTPS: the page and its data calls."""
    cert, key = _self_signed(tmp_path)
    node = NodeProc(tmp_path, token=TOKEN)
    node.config.write_text(node.config.read_text() + f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    node.base = node.base.replace("http://", "https://")
    ctx = browser.new_context(ignore_https_errors=True)  # the test's self-signed certificate
    try:
        node.start(wait=False)

        def ready():
            with Client(node.base, TOKEN, verify=cert) as c:
                c.readyz()
        eventually(ready, 60, proc=node.proc)
        pg = ctx.new_page()
        pg.goto(node.base + "/ui/")
        pg.fill("#token", TOKEN)
        pg.click("#login button[type=submit]")
        expect(pg.locator('tr[data-node="n1"] [data-k="state"]')).to_have_text("up", timeout=WAIT)
        assert pg.url.startswith("https://")
    finally:
        ctx.close()
        node.ensure_stopped()
