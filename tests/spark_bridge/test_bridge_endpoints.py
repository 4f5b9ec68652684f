"""The endpoints the bridge adds or relies on, over real HTTP (no Spark): the snapshot a
DataFrame pins at load(); a tail that leaves out exactly the plan's sealed segments (so a
segment offloaded after planning is neither lost nor read twice); leases renewed by many
tasks at once, and refused once expired."""
from __future__ import annotations

import json
import threading
import time

import pytest

from node.errors import ApiError
from rowstore.schema import SchemaVersion
from spark_bridge.errors import LeaseExpiredError
from spark_bridge.lease import LeaseKeeper
from spark_bridge.options import Options
from tests.node.proc import eventually, holds
from tests.spark_bridge.conftest import started_node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "bridge-endpoints", 2)
    yield n
    n.stop()


def post(c, path, doc, arrow=False):
    return c._call("POST", path, doc, arrow=arrow)


def test_snapshot_pins_the_closed_timestamp_and_the_schema_at_it(node):
    c = node.client()
    c.create_table("snap", [{"name": "id", "type": "int64"}, {"name": "v", "type": "float64"}], "id")
    r = c.upsert("snap", [{"id": 1, "v": 1.0}])
    now = c._call("GET", "/v1/tables/snap/snapshot")
    assert now["as_of"] >= r["commit_ts"] and now["table"] == "snap"
    c.add_column("snap", "w", "string")
    past = c._call("GET", f"/v1/tables/snap/snapshot?as_of={now['as_of']}")
    assert past["as_of"] == now["as_of"] and past["schema"] == now["schema"]
    assert [col.name for col in SchemaVersion.from_json(past["schema"]).columns] == ["id", "v"]
    later = c._call("GET", "/v1/tables/snap/snapshot")
    assert [col.name for col in SchemaVersion.from_json(later["schema"]).columns] == ["id", "v", "w"]
    for path, status in [("/v1/tables/nope/snapshot", 404), ("/v1/tables/snap/snapshot?as_of=x", 400),
                         ("/v1/tables/snap/snapshot?as_of=1", 410)]:
        with pytest.raises(ApiError) as e:
            c._call("GET", path)
        assert e.value.status == status, path
    c.close()


def test_tail_leaves_out_exactly_the_plans_sealed_segments(node):
    c = node.client()
    c.create_table("t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "int64"}], "id")
    c.upsert("t", [{"id": i, "v": 1} for i in range(100)])
    c.admin("seal")
    c.admin("offload")
    c.upsert("t", [{"id": i, "v": 2} for i in range(100, 150)])
    plan = post(c, "/v1/tables/t/plan", {})
    sealed = [s["segid"] for s in plan["sealed"]]
    assert sealed and plan["tail"]
    c.admin("seal")
    assert c.admin("offload")["offloaded"]  # the tail's segments are objects now
    tails = {p: post(c, "/v1/tables/t/tail", {"partition": p, "as_of": plan["as_of"], "sealed": sealed}, arrow=True)
             for p in plan["tail"]}
    assert sorted(k for t in tails.values() for k in t.column("id").to_pylist()) == list(range(100, 150))
    # without the plan's list the node leaves out every segment offloaded *now*: those rows vanish
    now = [post(c, "/v1/tables/t/tail", {"partition": p, "as_of": plan["as_of"]}, arrow=True).num_rows
           for p in plan["tail"]]
    assert sum(now) == 0
    with pytest.raises(ApiError) as e:
        post(c, "/v1/tables/t/tail", {"partition": 0, "as_of": plan["as_of"], "sealed": ["x"]})
    assert e.value.status == 400
    c.close()


def test_leases_renewed_by_many_tasks_at_once_and_refused_once_expired(node):
    c = node.client()
    c.create_table("l", [{"name": "id", "type": "int64"}], "id")
    c.upsert("l", [{"id": 1}])
    plan = post(c, "/v1/tables/l/plan", {"lease_s": 30})
    opts = Options.parse({"endpoint": node.base, "table": "l", "lease_s": "30"})
    errors = []

    def task():
        try:
            for _ in range(5):
                with LeaseKeeper(opts, plan["lease"]):
                    pass
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=task) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    short = post(c, "/v1/tables/l/plan", {"lease_s": 0.5})["lease"]
    time.sleep(0.7)  # the TTL runs out on the node's own clock (another process); only a renew could observe it
    with pytest.raises(ApiError) as e:
        post(c, f"/v1/leases/{short}/renew", {"ttl_s": 30})
    assert (e.value.status, e.value.code) == (409, "lease_expired") and "expired" in e.value.message
    with pytest.raises(LeaseExpiredError):
        with LeaseKeeper(Options.parse({"endpoint": node.base, "table": "l"}), short):
            pass
    c.close()


def test_the_feeds_offset_moves_with_commits_not_with_the_clock(node):
    """An idle node's closed timestamp keeps up with the clock; the stream's latest offset is
    the newest closed commit of the table, so an idle table gives Spark no new micro-batch."""
    from pyspark.sql.types import StructType

    from spark_bridge.changes import ChangeFeedStream

    c = node.client()
    c.create_table("idle", [{"name": "id", "type": "int64"}], "id")
    feed = ChangeFeedStream(Options.parse({"endpoint": node.base, "table": "idle", "change_feed": "true"}),
                            StructType(), "")
    assert feed.latestOffset({"ts": 0}) == {"ts": 0}  # no commit yet
    ts = c.upsert("idle", [{"id": 1}])["commit_ts"]
    first = feed.latestOffset({"ts": 0})
    assert first == {"ts": ts}
    eventually(lambda: holds(c._call("GET", "/v1/tables/idle/snapshot")["as_of"] > ts,
                             "the closed timestamp moved on"))
    assert feed.latestOffset(first) == first  # idle: the clock moved, the offset did not
    ts2 = c.delete("idle", [1])["commit_ts"]
    assert feed.latestOffset(first) == {"ts": ts2}
    c.close()


class LosesFirstPlanAnswer:
    """An HTTP proxy before the node: every request reaches the node; the node's first answer
    to a read plan is dropped with the connection, as a network failure after the node acted
    would drop it. ``lost`` keeps that answer."""

    def __init__(self, port: int):
        import http.client
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self
        self.lost: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request(self.command, self.path, body or None,
                             {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")})
                r = conn.getresponse()
                data, ctype = r.read(), r.getheader("Content-Type", "application/json")
                conn.close()
                if self.path.endswith("/plan") and not proxy.lost:
                    proxy.lost.append(json.loads(data))
                    self.close_connection = True  # no answer: the client sees the connection drop
                    return
                self.send_response(r.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = forward

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_plan_whose_answer_was_lost_is_repeated_with_the_same_lease(node):
    """The bridge retries a plan when the connection drops, with the plan's request id: the
    node made the first plan (and its lease), and the repeat gets that same lease back."""
    from spark_bridge.remote import Remote

    c = node.client()
    c.create_table("lost", [{"name": "id", "type": "int64"}], "id")
    c.upsert("lost", [{"id": 1}])
    c.close()
    proxy = LosesFirstPlanAnswer(node.port)
    try:
        with Remote(Options.parse({"endpoint": proxy.url, "table": "lost"})) as r:
            T = r.snapshot(None)["as_of"]
            plan = r.plan(T, None, None, False, 30)
    finally:
        proxy.close()
    assert len(proxy.lost) == 1 and plan["lease"] == proxy.lost[0]["lease"] and plan["as_of"] == T
