"""One table maps URI schemes to backends; unsupported ones say so clearly."""
import pytest

from catalog.local import LocalCatalog
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.backends.s3 import S3ObjectStore
from terrafs.errors import ConfigurationError, UnsupportedSchemeError
from terrafs.backends.s3 import query_options
from terrafs.backends.logged import LoggedBlockDevice
from terrafs.uri import local_path, open_block_device, open_catalog, open_object_store


def test_local_paths():
    assert local_path("trfs:///var/lib/x") == "/var/lib/x"
    assert local_path("trfs://./data/objects") == "./data/objects"
    assert local_path("trkv://data/catalog") == "data/catalog"
    with pytest.raises(ConfigurationError):
        local_path("trfs://")


def test_table(tmp_path):
    durable = open_block_device(f"trfs://{tmp_path}/b")
    assert isinstance(durable, LoggedBlockDevice) and isinstance(durable.plain, LocalBlockDevice)
    assert isinstance(open_block_device(f"trfs://{tmp_path}/v", durable=False), LocalBlockDevice)
    assert isinstance(open_object_store(f"trfs://{tmp_path}/o"), LocalObjectStore)
    assert isinstance(open_catalog(f"trkv://{tmp_path}/c"), LocalCatalog)
    s = open_object_store("trs3://bucket/pre?endpoint_url=http://127.0.0.1:1&region=us-east-1")
    assert isinstance(s, S3ObjectStore) and s.bucket == "bucket" and s.prefix == "pre"


@pytest.mark.parametrize("scheme", ["trec2", "trmd", "trpgblob", "trblob", "trdyn", "trtab"])
def test_cloud_schemes_not_in_this_build(scheme):
    opener = {"trec2": open_block_device, "trmd": open_block_device, "trpgblob": open_block_device,
              "trblob": open_object_store, "trdyn": open_catalog, "trtab": open_catalog}[scheme]
    with pytest.raises(UnsupportedSchemeError, match="not supported in this build"):
        opener(f"{scheme}://somewhere/x")


def test_wrong_kind_and_unknown():
    with pytest.raises(ConfigurationError, match="not a catalog"):
        open_catalog("trfs:///tmp/x")
    with pytest.raises(ConfigurationError, match="not a block device"):
        open_block_device("trs3://b/p")
    with pytest.raises(ConfigurationError, match="unknown scheme"):
        open_object_store("ftp://host/x")
    with pytest.raises(ConfigurationError, match="takes no options"):
        open_block_device("trfs:///tmp/x?sync=no")


def test_query_options():
    assert query_options("trs3://b/p?region=x", {"region"}) == {"region": "x"}
    with pytest.raises(ConfigurationError, match="unknown option 'regoin'"):
        query_options("trs3://b/p?regoin=x", {"region"})
