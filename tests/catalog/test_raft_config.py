"""raft:// in the config (docs/REFERENCE.md §5) and the URI table: every mistake is one line naming the key."""
import pytest

from catalog.errors import CatalogConfigError
from catalog.raft import RaftCatalog, parse_raft_uri
from node.config import from_dict
from node.errors import ConfigError
from terrafs.errors import ConfigurationError
from terrafs.uri import open_catalog

URI = "raft://127.0.0.1:7401,127.0.0.1:7411,127.0.0.1:7421?self=127.0.0.1:7401"


def test_parse_uri():
    members, me, opts = parse_raft_uri(URI + "&timeout=5")
    assert members == ["127.0.0.1:7401", "127.0.0.1:7411", "127.0.0.1:7421"] and me == "127.0.0.1:7401"
    assert opts == {"timeout": "5"}
    for bad in ["raft://127.0.0.1:7401", "raft://a:1,b:2?self=a", "raft://a:1,a:1?self=a:1",
                "raft://a:1?self=a:1&x=1", "raft://0.0.0.0:1?self=0.0.0.0:1", "trkv:///x"]:
        with pytest.raises(CatalogConfigError):
            parse_raft_uri(bad)


@pytest.fixture
def secret(tmp_path):
    p = tmp_path / "cluster.secret"
    p.write_text("0123456789abcdef0123456789abcdef\n")
    return str(p)


def test_config_accepts_a_raft_catalog(tmp_path, secret):
    cfg = from_dict({"catalog": {"uri": URI, "secret_file": secret, "dir": str(tmp_path / "raft")}})
    assert cfg.catalog == URI and cfg.catalog_dir == str(tmp_path / "raft")


@pytest.mark.parametrize("catalog,key", [
    ({"uri": URI, "dir": "/x"}, "catalog.secret_file"),
    ({"uri": URI, "secret_file": "SECRET"}, "catalog.dir"),
    ({"uri": "raft://127.0.0.1:7401", "secret_file": "SECRET", "dir": "/x"}, "catalog.uri"),
    ({"uri": URI, "secret_file": "/nonexistent/secret", "dir": "/x"}, "catalog.secret_file"),
    ({"uri": URI, "secret_file": "SHORT", "dir": "/x"}, "catalog.secret_file"),
])
def test_config_errors_name_the_key(tmp_path, secret, catalog, key):
    short = tmp_path / "short"
    short.write_text("abc")
    body = {k: (secret if v == "SECRET" else str(short) if v == "SHORT" else v) for k, v in catalog.items()}
    with pytest.raises(ConfigError) as ei:
        from_dict({"catalog": body})
    assert str(ei.value).startswith(key) and "\n" not in str(ei.value)


def test_open_catalog_builds_a_raft_backend(tmp_path, secret):
    c = open_catalog(URI, secret_file=secret, dir=str(tmp_path / "raft"))
    assert isinstance(c, RaftCatalog) and c.self_addr == "127.0.0.1:7401" and len(c.members) == 3
    with pytest.raises(ConfigurationError, match="secret_file"):
        open_catalog(URI, dir=str(tmp_path / "raft"))
    with pytest.raises(ConfigurationError, match="catalog.dir"):
        open_catalog(URI, secret_file=secret)
