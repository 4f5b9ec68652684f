"""The S3 backend against a real S3-speaking server (moto_server process on loopback)."""
import asyncio
import os

import pytest
from aiohttp import ClientSession, web

from catalog.memory import MemoryCatalog
from terrafs.backends.memory import MemoryBlockDevice
from terrafs.backends.s3 import S3ObjectStore
from terrafs.errors import ConfigurationError, StorageIOError, TransientStorageError
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.uri import open_object_store
from tests.fixtures.moto import free_port, make_bucket, s3_uri
from tests.terrafs.conformance import ObjectStoreSuite


class TestS3ObjectStore(ObjectStoreSuite):
    @pytest.fixture
    async def make(self, s3_bucket_uri):
        s = open_object_store(s3_bucket_uri)
        await s.open_store()
        yield s
        await s.close()


async def _open(uri):
    s = S3ObjectStore.from_uri(uri)
    await s.open_store()
    return s


async def test_multipart_put_and_stream(moto_server):
    uri = s3_uri(moto_server, make_bucket(moto_server), part_size=5 << 20, multipart_threshold=5 << 20)
    s = await _open(uri)
    data = os.urandom(11 << 20)
    info = await s.put("big", data)
    assert info.size == len(data) and "-" in info.etag  # a multipart etag
    assert await s.get_range("big", (5 << 20) - 10, 20) == data[(5 << 20) - 10 : (5 << 20) + 10]

    async def chunks():
        for i in range(0, len(data), 1 << 20):
            yield data[i : i + (1 << 20)]

    info = await s.put_stream("streamed", chunks())
    assert info.size == len(data) and await s.get("streamed") == data
    await s.close()


class FlakyProxy:
    """A loopback HTTP proxy that answers 503 SlowDown to the first ``fail`` requests."""

    def __init__(self, target: str, fail: int):
        self.target, self.fail, self.seen = target, fail, 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        if self.seen <= self.fail:
            body = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
            return web.Response(status=503, body=body, content_type="application/xml")
        async with ClientSession(auto_decompress=False) as s:
            async with s.request(request.method, self.target + request.path_qs, headers={
                    k: v for k, v in request.headers.items() if k.lower() != "host"},
                    data=await request.read()) as r:
                return web.Response(status=r.status, body=await r.read(), headers={
                    k: v for k, v in r.headers.items()
                    if k.lower() not in ("transfer-encoding", "content-length", "content-encoding")})

    async def __aenter__(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def test_transient_errors_are_retried(moto_server):
    bucket = make_bucket(moto_server)
    async with FlakyProxy(moto_server, fail=3) as proxy:
        s = await _open(s3_uri(proxy.url, bucket, max_attempts=5))  # head_bucket absorbs 3 failures
        proxy.seen, proxy.fail = 0, 2
        await s.put("k", b"v")
        proxy.seen, proxy.fail = 0, 4
        assert await s.get("k") == b"v"
        proxy.seen, proxy.fail = 0, 5
        with pytest.raises(TransientStorageError):
            await s.get("k")
        await s.close()


async def test_unreachable_endpoint_is_transient_and_bounded():
    s = S3ObjectStore.from_uri(s3_uri(f"http://127.0.0.1:{free_port()}", "nobucket", max_attempts=2))
    with pytest.raises(TransientStorageError):
        await asyncio.wait_for(s.open_store(), 30)


async def test_config_errors(moto_server):
    with pytest.raises(ConfigurationError, match="unknown option 'colour'"):
        S3ObjectStore.from_uri("trs3://b/p?colour=red")
    with pytest.raises(ConfigurationError, match="max_attempts"):
        S3ObjectStore.from_uri("trs3://b/p?max_attempts=many")
    with pytest.raises(StorageIOError, match="does not exist"):
        await _open(s3_uri(moto_server, "no-such-bucket-here"))


async def test_uri_hides_credentials(moto_server):
    s = S3ObjectStore.from_uri(s3_uri(moto_server, "bkt"))
    assert "testing" not in s.uri and s.uri.startswith("trs3://bkt/pre/fix")


async def test_terrascalefs_offload_and_paged_reads_on_s3(s3_bucket_uri):
    """TerrascaleFS end to end with sealed objects in S3 (moto server)."""
    store = open_object_store(s3_bucket_uri)
    await store.open_store()
    cat = MemoryCatalog()
    fs = TerrascaleFS(cat, MemoryBlockDevice(), MemoryBlockDevice(durable=False), store,
                      config=FsConfig(sealed_block_size=4096))
    await fs.open()
    af = await fs.create()
    data = os.urandom(100_000)
    await af.append(data)
    await fs.seal(af.inode)
    rec = await fs.offload(af.inode)
    assert (await store.head(rec.location)).size == rec.object_size
    assert await fs.read(af.inode, 50_000, 10_000) == data[50_000:60_000]
    reader = TerrascaleFS(cat, MemoryBlockDevice(), MemoryBlockDevice(durable=False), store,
                          config=FsConfig(node_id="n2"))
    await reader.open()
    assert await reader.read(af.inode, 0, 100_000) == data  # another node reads the object
    await fs.delete(af.inode)
    assert await store.list("files/") == []
    await fs.close()
    await reader.close()
    await store.close()
