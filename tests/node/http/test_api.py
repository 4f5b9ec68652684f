"""The whole HTTP API against a real `terrascale node run` process, through node.client."""
import asyncio
import base64
import datetime as dt
import json
import uuid

import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from node.client.client import AsyncClient, Client
from node.errors import ApiError
from tests.node.proc import eventually

TOKEN = "t0ken-for-tests"
ALL_TYPES = [
    ("id", "int64"), ("i8", "int8"), ("i16", "int16"), ("i32", "int32"), ("u8", "uint8"), ("u16", "uint16"),
    ("u32", "uint32"), ("u64", "uint64"), ("f32", "float32"), ("f64", "float64"), ("b", "bool"), ("s", "string"),
    ("bin", "binary"), ("ts", "timestamp"), ("d", "date"), ("u", "uuid"), ("j", "json"), ("p", "point"),
    ("bx", "box"), ("ri", "range<int64>"), ("rf", "range<float64>"), ("rt", "range<timestamp>"),
]
ROW = {
    "id": 7, "i8": -128, "i16": 32767, "i32": -2**31, "u8": 255, "u16": 65535, "u32": 2**32 - 1, "u64": 2**64 - 1,
    "f32": 1.5, "f64": -2.25, "b": True, "s": "héllo ✓", "bin": base64.b64encode(b"\x00\xffbytes").decode(),
    "ts": "2024-02-29T12:34:56.123456Z", "d": "2024-02-29", "u": "12345678-1234-5678-1234-567812345678",
    "j": {"a": [1, 2, {"b": None}], "c": "x"}, "p": {"x": 1.5, "y": -2.0},
    "bx": {"xmin": 0.0, "ymin": 1.0, "xmax": 2.0, "ymax": 3.0},
    "ri": {"lower": 1, "upper": 10, "lower_inclusive": True, "upper_inclusive": False},
    "rf": {"lower": None, "upper": 2.5, "lower_inclusive": False, "upper_inclusive": True},
    "rt": {"lower": "2024-01-01T00:00:00.000000Z", "upper": None, "lower_inclusive": True,
           "upper_inclusive": False},
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("api"), token=TOKEN, extra='max_body = "4MiB"')
    n.start()
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log and "event=stopped" in log


@pytest.fixture
def c(node):
    with node.client() as cl:
        yield cl


def points(ids, seed=0) -> pa.Table:
    ids = np.asarray(ids, np.int64)
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": ids, "ts": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
        "loc": pa.StructArray.from_arrays([pa.array(rng.uniform(0, 100, len(ids))),
                                           pa.array(rng.uniform(0, 100, len(ids)))], names=["x", "y"]),
        "name": pa.array([f"name-{i % 13}" for i in ids.tolist()]),
        "v": pa.array(rng.uniform(-50, 50, len(ids))), "n": pa.array(ids % 17, pa.int64()),
    })


def make_points(c, name, indexes=("loc", "name", "v")):
    c.create_table(name, [("id", "int64"), ("ts", "timestamp"), ("loc", "point"), ("name", "string"),
                          ("v", "float64"), ("n", "int64")], "id", indexes=indexes, partitions=4)


def test_health_ready_metrics(node, c):
    assert c.healthz() == {"status": "ok"}
    assert c.readyz() == {"status": "ready", "writes": True}
    text = c.metrics()
    for name in ("terrascale_http_requests_total", "terrascale_http_request_seconds_bucket", "terrascale_segments",
                 "terrascale_block_cache_hit_ratio", "terrascale_job_seconds", "terrascale_flushes",
                 "terrascale_closed_timestamp", "terrascale_files", "terrascale_device_fdatasyncs",
                 "terrascale_device_rounds", "terrascale_device_round_groups", "terrascale_device_allocated_bytes",
                 "terrascale_device_used_bytes"):
        assert name in text, name


def test_every_type_round_trips_through_json_and_arrow(c):
    c.create_table("typed", [{"name": n, "type": t, "nullable": n != "id"} for n, t in ALL_TYPES], "id",
                   indexes=["p", "ts", "ri"])
    nulls = {n: None for n, _ in ALL_TYPES if n != "id"}
    r = c.upsert("typed", [ROW, {"id": 8, **nulls}])
    assert r["committed"] == 2 and r["commit_ts"] > 0
    assert c.get("typed", 7) == ROW
    assert c.get("typed", 8) == {"id": 8, **nulls}
    doc = c.query_json("typed")
    assert doc["rows"] == [ROW, {"id": 8, **nulls}] and doc["as_of"] >= r["commit_ts"]
    t = c.query("typed", where=[["id", "=", 7]])
    assert t.schema.field("ts").type == pa.timestamp("us", tz="UTC") and t.schema.field("u").type == pa.binary(16)
    row = t.to_pylist()[0]
    assert row["ts"] == dt.datetime(2024, 2, 29, 12, 34, 56, 123456, tzinfo=dt.timezone.utc)
    assert row["u"] == uuid.UUID(ROW["u"]).bytes and row["bin"] == b"\x00\xffbytes" and row["u64"] == 2**64 - 1
    # integer microseconds are accepted on input too, and an Arrow body round-trips into the same row
    assert c.upsert("typed", [{"id": 9, "ts": 1_709_210_096_123_456}])["committed"] == 1
    assert c.get("typed", 9)["ts"] == ROW["ts"]
    c.upsert("typed", t.set_column(0, "id", pa.array([10], pa.int64())))
    assert c.get("typed", 10) == {**ROW, "id": 10}
    # predicates over typed columns take the JSON forms
    assert [x["id"] for x in c.query_json("typed", where=[["ts", ">=", "2024-02-29T00:00:00Z"]])["rows"]] == [7, 9, 10]
    assert [x["id"] for x in c.query_json("typed", where=[["u", "=", ROW["u"]]])["rows"]] == [7, 10]
    assert [x["id"] for x in c.query_json("typed", where=[["ri", "=", 5]])["rows"]] == [7, 10]


def test_float_specials_and_unicode_keys(c):
    c.create_table("sk", [("k", "string"), ("f", "float64")], "k")
    c.upsert("sk", [{"k": "a/b c?d#é", "f": "NaN"}, {"k": "inf", "f": "-Infinity"}])
    assert c.get("sk", "a/b c?d#é") == {"k": "a/b c?d#é", "f": "NaN"}
    assert c.get("sk", "inf")["f"] == "-Infinity"
    assert c.delete("sk", ["a/b c?d#é", "nope"])["deleted"] == 1
    assert c.get("sk", "a/b c?d#é") is None


def test_table_catalog_and_schema_evolution_as_of(c):
    make_points(c, "evo")
    names = [t["name"] for t in c.list_tables()["tables"]]
    assert "evo" in names
    d0 = c.describe("evo")
    assert d0["primary_key"] == "id" and d0["indexes"] == ["loc", "name", "v"] and d0["partitions"] == 4
    w1 = c.upsert("evo", [{"id": 1, "v": 1.0, "name": "one"}])
    d1 = c.add_column("evo", "extra", "float64")
    assert [col["name"] for col in d1["columns"]][-1] == "extra"
    c.upsert("evo", [{"id": 2, "extra": 2.5}])
    d2 = c.rename_column("evo", "name", "label")
    assert "label" in [col["name"] for col in d2["columns"]]
    d3 = c.drop_column("evo", "n")
    assert "n" not in [col["name"] for col in d3["columns"]]
    # a read as of T sees the columns and names of time T
    old = c.describe("evo", as_of=w1["commit_ts"])
    assert [col["name"] for col in old["columns"]] == ["id", "ts", "loc", "name", "v", "n"]
    assert c.get("evo", 1, as_of=w1["commit_ts"])["name"] == "one"
    assert c.get("evo", 1)["label"] == "one" and "name" not in c.get("evo", 1)
    assert c.get("evo", 2)["extra"] == 2.5
    dropped = c.drop_table("evo")
    assert dropped["dropped"] == "evo"
    assert "evo" not in [t["name"] for t in c.list_tables()["tables"]]
    assert "evo" in [t["name"] for t in c.list_tables(as_of=dropped["commit_ts"] - 1)["tables"]]
    with pytest.raises(ApiError) as ei:
        c.describe("evo")
    assert ei.value.status == 404 and ei.value.code == "table_not_found"


def test_a_tables_retention_through_the_api(c):
    """Set at creation and by PATCH, shown by describe, applied to reads; a bad one is a 400
    that writes no definition (RFC 0016 §5)."""
    cols = [{"name": "id", "type": "int64"}, {"name": "ts", "type": "timestamp", "nullable": False}]
    c.create_table("ret", cols, "id", retention={"column": "ts", "keep": "1h"})
    now = dt.datetime.now(dt.timezone.utc)
    w = c.upsert("ret", [{"id": 1, "ts": now.isoformat()}, {"id": 2, "ts": (now - dt.timedelta(hours=2)).isoformat()}])
    assert c.describe("ret")["retention"] == {"column": "ts", "keep_s": 3600.0}
    assert [x["id"] for x in c.query_json("ret")["rows"]] == [1]
    assert c.get("ret", 2) is None
    for bad in ({"column": "id", "keep": "1h"}, {"column": "ts", "keep": "0s"}, {"column": "ts"}, "1h"):
        with pytest.raises(ApiError) as ei:
            c.set_retention("ret", bad)
        assert ei.value.status == 400 and ei.value.code == "invalid_schema", bad
        with pytest.raises(ApiError) as ei:
            c.create_table("ret_bad", cols, "id", retention=bad)
        assert ei.value.status == 400 and ei.value.code == "invalid_schema", bad
    assert "ret_bad" not in [t["name"] for t in c.list_tables()["tables"]]
    assert c.describe("ret")["ts"] < w["commit_ts"]  # no new definition version
    off = c.set_retention("ret", None)
    assert off["retention"] is None
    assert [x["id"] for x in c.query_json("ret")["rows"]] == [1, 2]
    assert [x["id"] for x in c.query_json("ret", as_of=off["ts"] - 1)["rows"]] == [1]  # the setting of T


def test_arrow_ingest_queries_limits_and_time_travel(c):
    make_points(c, "pts")
    first = c.upsert("pts", points(range(0, 30_000)))
    assert first["committed"] == 30_000
    second = c.upsert("pts", points(range(30_000, 35_000), seed=1))
    t = c.query("pts", limit=100_000)
    assert t.num_rows == 35_000 and t.column("id").to_pylist() == list(range(35_000))
    assert c.query("pts").num_rows == 10_000  # the default limit
    assert c.query("pts", limit=12_345).num_rows == 12_345
    assert c.query("pts", as_of=first["commit_ts"], limit=10**8).num_rows == 30_000  # beyond the engine's cap
    src = points(range(0, 30_000))
    loc = src.column("loc").combine_chunks()
    x, y = loc.field("x").to_numpy(), loc.field("y").to_numpy()
    want = set(np.flatnonzero((x <= 10) & (y <= 10)).tolist())
    got = c.query("pts", bbox={"column": "loc", "xmin": 0, "ymin": 0, "xmax": 10, "ymax": 10},
                  where=[["id", "<", 30_000]], columns=["id"], limit=100_000)
    assert set(got.column("id").to_pylist()) == want and got.column_names == ["id"]
    got = c.query_json("pts", where=[["name", "=", "name-3"], ["v", ">", 0]], limit=100_000)
    assert all(r["name"] == "name-3" and r["v"] > 0 for r in got["rows"]) and got["rows"]
    # deletes and time travel
    d = c.delete("pts", [1, 2, 99_999_999])
    assert d["deleted"] == 2
    assert c.get("pts", 1) is None
    assert c.get("pts", 1, as_of=d["commit_ts"] - 1)["id"] == 1
    assert c.get("pts", 31_000, as_of=first["commit_ts"]) is None
    assert c.get("pts", 31_000, as_of=second["commit_ts"])["id"] == 31_000
    assert c.query("pts", as_of=d["commit_ts"] - 1, where=[["id", "<", 3]]).num_rows == 3
    assert c.query("pts", where=[["id", "<", 3]]).num_rows == 1


def test_admin_jobs_segments_status_cluster(c):
    make_points(c, "adm")
    c.upsert("adm", points(range(5000)))
    segs = c.segments("adm")["segments"]
    assert segs and {s["state"] for s in segs} == {"active"} and all(s["table"] == "adm" for s in segs)
    assert sum(s["rows"] for s in segs) == 5000 and all(s["bytes"] > 0 for s in segs)
    assert set(segs[0]) >= {"segid", "table", "partition", "state", "rows", "live_rows", "bytes", "live_bytes",
                            "location"}
    mine = {s["segid"] for s in segs}
    sealed = c.admin("seal")
    assert sealed["job"] == "seal" and mine <= set(sealed["sealed"])  # every table's current segments
    c.admin("offload")
    states = {s["segid"]: s for s in c.segments("adm")["segments"]}
    assert all(states[s]["state"] == "offloaded" and states[s]["location"] for s in mine)
    assert sum(states[s]["rows"] for s in mine) == 5000
    assert c.query("adm", limit=10_000).num_rows == 5000  # read back from the objects
    assert set(c.admin("checkpoint")) == {"job", "checkpointed", "merged"}
    gc = c.admin("gc")  # history is kept 7 days by default: nothing is garbage yet
    assert gc == {"job": "gc", "segments_collected": 0, "rows_copied": 0, "bytes_reclaimed": 0, "retired": [],
                  "deleted": []}
    dry = c.gc("adm", dry_run=True)
    assert dry["dry_run"] is True and dry["victims"] == []
    assert c.describe("adm")["cluster_by"] == "id"
    st = c.status()
    assert st["node_id"] == "n1" and st["role"] == "single" and st["ready"] is True
    assert st["segments"]["offloaded"] >= len(mine) and st["closed_ts"] > 0
    assert st["catalog_leader"] == "n1" and st["partitions_owned"] >= 4
    cl = c.cluster()
    assert cl["members"] == [{"id": "n1", "address": c.endpoint, "alive": True}] and cl["leader"] == "n1"
    assert cl["partitions"]["adm"] == {str(p): "n1" for p in range(4)}
    with pytest.raises(ApiError) as ei:
        c.segments("no_such_table")
    assert ei.value.status == 404


ENDPOINTS = [
    ("GET", "/readyz"), ("GET", "/metrics"), ("POST", "/v1/tables"), ("GET", "/v1/tables"),
    ("GET", "/v1/tables/x"), ("DELETE", "/v1/tables/x"), ("POST", "/v1/tables/x/columns"),
    ("DELETE", "/v1/tables/x/columns/c"), ("PATCH", "/v1/tables/x/columns/c"), ("POST", "/v1/tables/x/rows"),
    ("POST", "/v1/tables/x/delete"), ("GET", "/v1/tables/x/rows/1"), ("POST", "/v1/tables/x/query"),
    ("GET", "/v1/admin/status"), ("GET", "/v1/admin/segments"), ("POST", "/v1/admin/seal"),
    ("POST", "/v1/admin/offload"), ("POST", "/v1/admin/gc"), ("POST", "/v1/admin/checkpoint"),
    ("GET", "/v1/admin/cluster"), ("GET", "/v1/admin/nodes"),
]


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x"])
def test_every_endpoint_but_healthz_needs_the_token(node, token):
    """Every data endpoint; the console's files need none (tests/node/console/test_serving.py)."""
    with Client(node.base, token) as anon:
        assert anon.healthz() == {"status": "ok"}
        for method, path in ENDPOINTS:
            status, body, _ = anon.request(method, path, b"{}", "application/json")
            assert status == 401, (method, path)
            assert json.loads(body) == {"error": {"code": "unauthorized", "message": "missing or wrong bearer token"}}


def test_unknown_route_and_method(c):
    status, body, _ = c.request("GET", "/v1/nothing")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    status, body, _ = c.request("PUT", "/v1/tables")
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"


def test_async_client_mirrors_the_api(node):
    async def go():
        async with AsyncClient(node.base, TOKEN) as ac:
            assert (await ac.readyz()) == {"status": "ready", "writes": True}
            await ac.create_table("asy", [("id", "int64"), ("name", "string")], "id", indexes=["name"])
            results = await asyncio.gather(*[ac.upsert("asy", [{"id": i, "name": f"n{i % 3}"}]) for i in range(50)])
            assert len({r["commit_ts"] for r in results}) == 50
            assert (await ac.get("asy", 3)) == {"id": 3, "name": "n0"}
            assert (await ac.get("asy", 333)) is None
            t = await ac.query("asy", where=[["name", "=", "n1"]])
            assert t.column("id").to_pylist() == [i for i in range(50) if i % 3 == 1]
            assert (await ac.delete("asy", [1]))["deleted"] == 1
            d = await ac.add_column("asy", "z", "int32")
            assert d["columns"][-1] == {"name": "z", "type": "int32", "nullable": True, "id": 3}
            assert (await ac.status())["node_id"] == "n1"
            assert (await ac.admin("seal"))["sealed"]
            assert (await ac.cluster())["leader"] == "n1"
            with pytest.raises(ApiError) as ei:
                await ac.describe("nope")
            assert ei.value.code == "table_not_found"
    asyncio.run(go())


def _self_signed(tmp_path):
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")


def test_tls(tmp_path):
    cert, key = _self_signed(tmp_path)
    node = NodeProc(tmp_path, token=TOKEN)
    node.config.write_text(node.config.read_text() + f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    node.base = node.base.replace("http://", "https://")
    try:
        node.start(wait=False)

        def ready():
            with Client(node.base, TOKEN, verify=cert) as c:
                assert c.readyz() == {"status": "ready", "writes": True}
        eventually(ready, 60, proc=node.proc)
        with Client(node.base, TOKEN, verify=cert) as c:
            c.create_table("sec", [("id", "int64"), ("s", "string")], "id")
            assert c.upsert("sec", [{"id": 1, "s": "over tls"}])["committed"] == 1
            assert c.get("sec", 1) == {"id": 1, "s": "over tls"}
            assert c.status()["address"].startswith("https://")
        with pytest.raises(ConnectionError):  # an unverified peer is refused by the client ...
            with Client(node.base, TOKEN) as c:
                c.readyz()
        with pytest.raises(ConnectionError):  # ... and plain HTTP gets no answer from a TLS port
            with Client(node.base.replace("https://", "http://"), TOKEN) as c:
                c.readyz()
    finally:
        node.ensure_stopped()


def test_a_dropped_keep_alive_connection_is_reopened_only_for_requests_safe_to_repeat(node):
    """The connection drops between two requests (a proxy cuts it): a GET is sent again on a
    new connection; a POST is not — it may have reached the node — and raises ConnectionError."""
    from tests.fixtures.proxy import Proxy

    proxy = Proxy(node.port)
    c = Client(f"http://127.0.0.1:{proxy.port}", TOKEN)
    try:
        assert c.readyz()["status"] == "ready"
        proxy.cut()
        proxy.restore()
        assert c.readyz()["status"] == "ready"
        proxy.cut()
        proxy.restore()
        with pytest.raises(ConnectionError):
            c.create_table("keepalive", [("id", "int64")], "id")
        assert c.create_table("keepalive", [("id", "int64")], "id")["name"] == "keepalive"  # a new connection
    finally:
        c.close()
        proxy.close()
