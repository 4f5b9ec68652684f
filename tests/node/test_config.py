"""Config validation: every bad key or value is one line naming the key."""
import pytest

from node.config import defaults, from_dict, load, parse_duration, parse_size
from node.errors import ConfigError


def test_defaults_under_data_dir():
    c = defaults("./data")
    assert (c.block, c.volatile, c.objects, c.catalog) == (
        "trfs://./data/block", "trfs://./data/cache", "trfs://./data/objects", "trkv://./data/catalog")
    assert defaults("/srv/ts").objects == "trfs:///srv/ts/objects"
    assert c.listen == ("127.0.0.1", 7400)


def test_full_example(tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    p = tmp_path / "c.toml"
    p.write_text(f"""
[node]
id = "n2"
listen = "127.0.0.1:7410"
[storage]
block = "trfs:///var/lib/ts/block"
volatile = "trfs:///var/cache/ts"
objects = "trs3://bucket/prefix?endpoint_url=http://127.0.0.1:9000&region=us-east-1"
[catalog]
uri = "trkv:///var/lib/ts/catalog"
[segments]
seal_bytes = "256MiB"
flush_bytes = "64KiB"
flush_ms = 2
[security]
token_file = "{tok}"
[history]
retention = "7d"
""")
    c = load(str(p))
    assert c.node_id == "n2" and c.listen == ("127.0.0.1", 7410)
    assert c.seal_bytes == 256 << 20 and c.flush_bytes == 64 << 10 and c.flush_ms == 2
    assert c.token == "s3cret" and c.retention_s == 7 * 86400
    assert c.max_json_depth == 64 and c.max_query_terms == 256
    assert from_dict({"node": {"max_json_depth": 8, "max_query_terms": 3}}).max_query_terms == 3


@pytest.mark.parametrize("doc,key", [
    ({"node": {"idd": "x"}}, "node.idd"),
    ({"nodes": {}}, "nodes"),
    ({"node": {"listen": "nohost"}}, "node.listen"),
    ({"node": {"listen": "h:99999"}}, "node.listen"),
    ({"segments": {"seal_bytes": "lots"}}, "segments.seal_bytes"),
    ({"segments": {"flush_ms": "2"}}, "segments.flush_ms"),
    ({"segments": {"flush_ms": -1}}, "segments.flush_ms"),
    ({"history": {"retention": "7 weeks"}}, "history.retention"),
    ({"security": {"token_file": "/nonexistent/tok"}}, "security.token_file"),
    ({"security": {"encryption_key_file": "/nonexistent/kek"}}, "security.encryption_key_file"),
    ({"catalog": {"uri": "raft://127.0.0.1:7401?self=127.0.0.1:7401"}}, "catalog.secret_file"),
    ({"storage": {"block": 5}}, "storage.block"),
    ({"gc": {"min_garbage": 1.5}}, "gc.min_garbage"),
    ({"gc": {"min_garbage": True}}, "gc.min_garbage"),
    ({"gc": {"interval": "often"}}, "gc.interval"),
    ({"gc": {"grace": -1}}, "gc.grace"),
    ({"gc": {"max_bytes_per_run": "0B"}}, "gc.max_bytes_per_run"),
    ({"gc": {"speed": 1}}, "gc.speed"),
    ({"node": {"max_json_depth": 7}}, "node.max_json_depth"),
    ({"node": {"max_json_depth": 10_000}}, "node.max_json_depth"),
    ({"node": {"max_json_depth": "64"}}, "node.max_json_depth"),
    ({"node": {"max_query_terms": 0}}, "node.max_query_terms"),
    ({"node": {"max_query_terms": True}}, "node.max_query_terms"),
])
def test_bad_values_name_the_key(doc, key):
    with pytest.raises(ConfigError) as ei:
        from_dict(doc)
    msg = str(ei.value)
    assert msg.startswith(key) and "\n" not in msg


def test_gc_section_and_retention_down_to_zero():
    c = from_dict({"gc": {"interval": "0s", "min_garbage": 0.25, "grace": "0s", "max_bytes_per_run": "64MiB"},
                   "history": {"retention": "0s", "purge_lag": "0s"}})
    assert (c.gc_interval_s, c.gc_min_garbage, c.gc_grace_s, c.gc_max_bytes_per_run) == (0, 0.25, 0, 64 << 20)
    assert c.retention_s == 0 and c.purge_lag_s == 0 and defaults().purge_lag_s == 5
    d = defaults()
    assert (d.gc_interval_s, d.gc_min_garbage, d.gc_grace_s, d.gc_max_bytes_per_run) == (60, 0.5, 300, 1 << 30)


def test_bad_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[node\nid=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(str(p))
    with pytest.raises(ConfigError, match="cannot read"):
        load(str(tmp_path / "missing.toml"))


def test_units():
    assert parse_size("k", "1GiB") == 1 << 30 and parse_size("k", 4096) == 4096
    assert parse_duration("k", "12h") == 43200 and parse_duration("k", "250ms") == 0.25
