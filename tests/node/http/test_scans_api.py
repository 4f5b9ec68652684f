"""Measurement keys over HTTP against a real node process (docs/rfcs/0013-measurement-keys.md):
a sensor table keyed by (sensor, ts), reads by key, many keys at once, ordered scans paged
with cursors (JSON and Arrow), and every malformed request refused with nothing changed."""
from __future__ import annotations

import base64
import datetime as dt
import json
import time

import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from node.errors import ApiError

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
SENSORS = ["s1", "s2", "a/b", "ünï", ""]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("scans"), extra='max_body = "4MiB"')
    n.start()
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log


@pytest.fixture(scope="module")
def c(node):
    with node.client() as cl:
        cl.create_table("readings", [("sensor", "string"), ("ts", "timestamp"), ("v", "float64")],
                        ["sensor", "ts"], partitions=4)
        rows = [{"sensor": s, "ts": (T0 + dt.timedelta(seconds=i)).isoformat(), "v": float(i)}
                for s in SENSORS for i in range(30)]
        cl.upsert("readings", rows)
        yield cl


def test_the_table_describes_its_key_and_partition_key(c):
    d = c.describe("readings")
    assert d["primary_key"] == ["sensor", "ts"] and d["partition_key"] == ["sensor"]
    assert d["columns"][0]["nullable"] is False and d["columns"][1]["nullable"] is False


def test_a_row_by_its_key_components(c):
    row = c.get("readings", ["a/b", T0 + dt.timedelta(seconds=3)])  # a slash inside a component
    assert row["v"] == 3.0 and row["sensor"] == "a/b"
    assert c.get("readings", ["s1", int(T0.timestamp() * 1e6) + 5_000_000])["v"] == 5.0  # microseconds too
    assert c.get("readings", ["s1", T0 - dt.timedelta(days=1)]) is None


def test_many_rows_in_the_order_asked(c):
    got = c.get_many("readings", [["s2", T0], ["nope", T0], ["s1", T0 + dt.timedelta(seconds=1)]],
                     columns=["v"])
    assert got["rows"] == [{"v": 0.0}, None, {"v": 1.0}] and got["as_of"] > 0


@pytest.mark.parametrize("accept_arrow", [False, True])
def test_pages_of_a_scan_concatenate_to_the_scan(c, accept_arrow):
    want = sorted((s, i) for s in SENSORS for i in range(30))
    got, after, T = [], None, None
    while True:
        if accept_arrow:
            page = c.scan_page("readings", limit=7, after=after)
            rows = page.rows.to_pylist()
            nxt, T2 = page.next, page.as_of
        else:
            doc = {"after": after} if after else {"limit": 7}
            status, body, _ = c.request("POST", "/v1/tables/readings/scan", json.dumps(doc).encode(),
                                        "application/json")
            assert status == 200, body
            ans = json.loads(body)
            rows, nxt, T2 = ans["rows"], ans["next"], ans["as_of"]
        T = T if T is not None else T2
        assert T2 == T  # every page at the snapshot of the first
        got += [(r["sensor"], int((_ts(r["ts"]) - T0).total_seconds())) for r in rows]
        if nxt is None:
            break
        after = nxt
    assert got == sorted(want, key=lambda k: (k[0].encode(), k[1]))


def _ts(v):
    return v if isinstance(v, dt.datetime) else dt.datetime.fromisoformat(v.replace("Z", "+00:00"))


def test_a_prefix_and_a_window(c):
    batches = list(c.scan("readings", prefix=["s1"], start=["s1", T0 + dt.timedelta(seconds=10)],
                          end=["s1", T0 + dt.timedelta(seconds=20)], page_rows=3))
    t = pa.Table.from_batches(batches)
    assert t.column("v").to_pylist() == [float(i) for i in range(10, 20)]


def test_pages_stay_at_their_snapshot_while_rows_change(c):
    c.upsert("readings", [{"sensor": "s1", "ts": (T0 + dt.timedelta(seconds=100)).isoformat(), "v": 0.0}])
    first = c.scan_page("readings", prefix=["s1"], limit=5)
    c.upsert("readings", [{"sensor": "s1", "ts": (T0 + dt.timedelta(seconds=200)).isoformat(), "v": 0.0}])
    c.delete("readings", [["s1", T0 + dt.timedelta(seconds=29)]])
    rest, page = [], first
    while page.next is not None:
        page = c.scan_page("readings", after=page.next)
        rest += page.rows.to_pylist()
    assert len(first.rows) + len(rest) == 31  # 30 + the one written before the scan began
    assert c.get("readings", ["s1", T0 + dt.timedelta(seconds=29)]) is None  # the present moved on


def _cursor(c):
    return c.scan_page("readings", limit=2).next


@pytest.mark.parametrize("mangle", [
    lambda s: s[:-3], lambda s: s[:10] + ("A" if s[10] != "A" else "B") + s[11:], lambda s: "not base64 !",
    lambda s: base64.urlsafe_b64encode(b"\x01" + b"x" * 40).decode(), lambda s: 12,
])
def test_a_changed_or_made_up_cursor_is_refused(c, mangle):
    with pytest.raises(ApiError) as e:
        c.scan_page("readings", after=mangle(_cursor(c)))
    assert e.value.status == 400 and e.value.code == "invalid_cursor"


def test_another_tables_cursor_and_a_cursor_with_company_are_refused(c):
    c.create_table("other", [("id", "int64")], "id")
    with pytest.raises(ApiError) as e:
        c.scan_page("other", after=_cursor(c))
    assert (e.value.status, e.value.code) == (400, "invalid_cursor")
    status, body, _ = c.request("POST", "/v1/tables/readings/scan",
                                json.dumps({"after": _cursor(c), "limit": 3}).encode(), "application/json")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_query"


@pytest.mark.parametrize(("path", "doc", "code"), [
    ("scan", {"prefix": ["s1", "2026-01-01T00:00:00Z", 3]}, "bad_request"),  # longer than the key
    ("scan", {"prefix": ["s1", "yesterday"]}, "bad_request"),
    ("scan", {"prefix": "s1"}, "bad_request"),
    ("scan", {"limit": 0}, "invalid_query"),
    ("scan", {"limit": 10**9}, "invalid_query"),
    ("get", {"keys": [["s1"]]}, "bad_request"),
    ("get", {"keys": [["s1", "2026-01-01T00:00:00Z", 1]]}, "bad_request"),
    ("get", {"keys": "s1"}, "bad_request"),
    ("delete", {"keys": [["s1", "not a time"]]}, "bad_request"),
    ("delete", {"keys": [["s1"]]}, "bad_request"),
])
def test_malformed_keys_and_bounds_are_400_and_change_nothing(c, path, doc, code):
    before = c.scan_page("readings", limit=1000).rows.num_rows
    status, body, _ = c.request("POST", f"/v1/tables/readings/{path}", json.dumps(doc).encode(), "application/json")
    assert status == 400 and json.loads(body)["error"]["code"] == code, body
    assert c.scan_page("readings", limit=1000).rows.num_rows == before


@pytest.mark.parametrize(("columns", "pk", "part", "why"), [
    ([("sensor", "string"), ("ts", "timestamp")], ["sensor", "ts"], ["ts"], "leading run"),
    ([("sensor", "string"), ("ts", "timestamp")], ["sensor", "nope"], None, "not one of the columns"),
    ([("sensor", "string"), ("p", "point")], ["sensor", "p"], None, "cannot be of type"),
    ([("sensor", "string"), ("ts", "timestamp")], [], None, "primary_key"),
])
def test_a_bad_key_definition_is_refused(c, columns, pk, part, why):
    with pytest.raises(ApiError, match=why) as e:
        c.create_table("bad_" + str(abs(hash(why)) % 1000), columns, pk, partition_key=part)
    assert e.value.status == 400


def test_a_cursor_behind_the_retention_horizon_is_410(tmp_path):
    n = NodeProc(tmp_path, extra="", )
    text = n.config.read_text()
    n.config.write_text(text + '\n[history]\nretention = "1s"\npurge_lag = "0s"\n')
    n.start()
    try:
        with n.client() as cl:
            cl.create_table("r", [("sensor", "string"), ("ts", "timestamp")], ["sensor", "ts"])
            cl.upsert("r", [{"sensor": "s", "ts": i} for i in range(5)])
            cur = cl.scan_page("r", limit=2).next
            time.sleep(2.5)  # past retention: the cursor's snapshot may be purged
            with pytest.raises(ApiError) as e:
                cl.scan_page("r", after=cur)
            assert (e.value.status, e.value.code) == (410, "history_purged")
    finally:
        n.stop()
