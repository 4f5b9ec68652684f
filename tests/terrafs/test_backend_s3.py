"""The S3 backend against a real S3-speaking server (a moto_server process on loopback).

Faults come from a real HTTP proxy in front of that server (FaultProxy), not
from mocks: the backend sees the same 503s, 403s and resets it would see
from S3.
"""
import asyncio
import io
import os
import time

import pytest
from aiobotocore.session import get_session
from aiohttp import ClientSession, web

from bench.ports import free_port
from catalog.memory import MemoryCatalog
from terrafs.backends.memory import MemoryBlockDevice
from terrafs.backends.s3 import S3ObjectStore
from terrafs.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    StorageIOError,
    TransientStorageError,
)
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.uri import open_object_store
from tests.fixtures.moto import make_bucket, s3_uri
from tests.terrafs.conformance import ObjectStoreSuite

MIB = 1 << 20
FAST = {"backoff_base": 0.01}  # keep retry tests quick


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


async def _raw(endpoint, op, **kw):
    """One call through a plain aiobotocore client, to look behind the store's back."""
    async with get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing") as c:
        return await getattr(c, op)(**kw)


async def _raw_keys(endpoint, bucket):
    r = await _raw(endpoint, "list_objects_v2", Bucket=bucket)
    return sorted(o["Key"] for o in r.get("Contents", []))


async def _uploads(endpoint, bucket):
    return (await _raw(endpoint, "list_multipart_uploads", Bucket=bucket)).get("Uploads", [])


# -- ranges, prefixes, lifecycle ---------------------------------------------------------

async def test_range_at_or_past_end_is_empty(s3_bucket_uri):
    """S3 answers 416 InvalidRange there; the store returns b"" like the local one."""
    s = await _open(s3_bucket_uri)
    await s.put("x", b"0123456789")
    await s.put("e", b"")
    assert await s.get_range("x", 10, 5) == b""
    assert await s.get_range("x", 50, 5) == b""
    assert await s.get_range("x", 8, 0) == b""
    assert await s.get_range("e", 0, 10) == b""
    with pytest.raises(ObjectNotFoundError):
        await s.get_range("missing", 50, 5)
    with pytest.raises(ObjectNotFoundError):
        await s.get_range("missing", 0, 0)
    await s.close()


async def test_keys_live_under_the_prefix(moto_server):
    bucket = make_bucket(moto_server)
    a = await _open(s3_uri(moto_server, bucket, prefix="/tenant//a/"))
    root = await _open(s3_uri(moto_server, bucket, prefix=""))
    b = await _open(s3_uri(moto_server, bucket, prefix="tenant/b"))
    await a.put("seg/1", b"a")
    await b.put("seg/1", b"b")
    await root.put("top", b"r")
    assert await _raw_keys(moto_server, bucket) == ["tenant/a/seg/1", "tenant/b/seg/1", "top"]
    assert [o.key for o in await a.list()] == ["seg/1"]
    assert await b.get("seg/1") == b"b"
    assert [o.key for o in await root.list()] == ["tenant/a/seg/1", "tenant/b/seg/1", "top"]
    for s in (a, b, root):
        await s.close()


async def test_close_releases_the_client(s3_bucket_uri):
    s = await _open(s3_bucket_uri)
    await s.put("k", b"v")
    await s.close()
    assert s._client is None and s._stack is None
    await s.close()  # idempotent
    assert await s.get("k") == b"v"  # reopens lazily
    await s.close()


# -- multipart -----------------------------------------------------------------------------

async def test_multipart_put_and_stream(moto_server):
    uri = s3_uri(moto_server, make_bucket(moto_server), part_size=5 * MIB, multipart_threshold=5 * MIB)
    s = await _open(uri)
    data = os.urandom(11 * MIB)
    info = await s.put("big", data)
    assert info.size == len(data) and info.etag.endswith("-3")  # a 3-part multipart etag
    across = (5 * MIB - 10, 20)  # spans the boundary between parts 1 and 2
    assert await s.get_range("big", *across) == data[across[0] : sum(across)]

    async def chunks():
        for i in range(0, len(data), MIB):
            yield data[i : i + MIB]

    info = await s.put_stream("streamed", chunks())
    assert info.size == len(data) and "-" in info.etag
    assert (await s.head("streamed")).size == len(data)
    assert await s.get_range("streamed", 10 * MIB - 3, 6) == data[10 * MIB - 3 : 10 * MIB + 3]
    assert await s.get_range("streamed", 11 * MIB - 4, 100) == data[-4:]
    assert await s.get("streamed") == data
    await s.close()


async def test_small_stream_is_a_single_put(s3_bucket_uri):
    s = await _open(s3_bucket_uri)

    async def chunks():
        yield b"ab"
        yield memoryview(b"cd")

    info = await s.put_stream("small", chunks())
    assert info.size == 4 and "-" not in info.etag  # a plain PutObject etag
    assert await s.get("small") == b"abcd"
    await s.close()


async def test_failing_stream_aborts_the_upload(moto_server):
    bucket = make_bucket(moto_server)
    s = await _open(s3_uri(moto_server, bucket, part_size=5 * MIB, multipart_threshold=5 * MIB))

    async def chunks():
        for _ in range(12):
            yield os.urandom(MIB)
            if _ == 10:
                raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        await s.put_stream("never", chunks())
    assert await _uploads(moto_server, bucket) == []
    with pytest.raises(ObjectNotFoundError):
        await s.head("never")
    await s.close()


# -- faults through a real HTTP proxy -------------------------------------------------------

class FaultProxy:
    """A loopback HTTP proxy in front of ``target`` that fails chosen requests.

    The first ``fail`` requests for which ``match(request)`` holds get an S3
    error (``status``/``code``), or with ``cut=True`` half of the real answer
    before the connection drops; everything else is forwarded unchanged.
    """

    def __init__(self, target: str, fail: int = 0, status: int = 503, code: str = "SlowDown",
                 match=lambda request: True, cut: bool = False):
        self.target, self.status, self.code, self.match, self.cut = target, status, code, match, cut
        self.arm(fail)

    def arm(self, fail: int) -> None:
        """Fail the next ``fail`` matching requests; reset the counters."""
        self.fail, self.seen, self.failed = fail, 0, 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if self.match(request):
            self.seen += 1
            if self.failed < self.fail:
                self.failed += 1
                if self.cut:
                    return await self._cut(request, await self._forward(request, body))
                xml = f"<Error><Code>{self.code}</Code><Message>injected</Message></Error>"
                return web.Response(status=self.status, body=xml.encode(), content_type="application/xml")
        return await self._forward(request, body)

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        hop = {"host", "expect", "transfer-encoding", "content-length", "connection"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with ClientSession(auto_decompress=False) as s:
            async with s.request(request.method, self.target + request.path_qs,
                                 headers=headers, data=io.BytesIO(body)) as r:
                return web.Response(status=r.status, body=await r.read(), headers={
                    k: v for k, v in r.headers.items() if k.lower() not in hop | {"content-encoding"}})

    @staticmethod
    async def _cut(request: web.Request, full: web.Response) -> web.StreamResponse:
        """Promise the whole body (Content-Length), send half, drop the connection."""
        resp = web.StreamResponse(status=full.status, headers={
            **full.headers, "Content-Length": str(len(full.body))})
        await resp.prepare(request)
        await resp.write(full.body[: len(full.body) // 2])
        request.transport.close()
        return resp

    async def __aenter__(self):
        app = web.Application(client_max_size=64 * MIB)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def test_throttling_is_retried_then_gives_up(moto_server):
    bucket = make_bucket(moto_server)
    async with FaultProxy(moto_server, fail=3) as proxy:
        s = await _open(s3_uri(proxy.url, bucket, max_attempts=5, **FAST))  # head_bucket absorbs 3
        assert proxy.seen == 4
        proxy.arm(2)
        await s.put("k", b"v")
        assert proxy.seen == 3
        proxy.arm(4)
        assert await s.get("k") == b"v"
        assert proxy.seen == 5
        proxy.arm(6)
        with pytest.raises(TransientStorageError, match="SlowDown.*after 5 attempts") as e:
            await s.get("k")
        assert proxy.seen == 5  # bounded: max_attempts, and botocore adds none of its own
        assert e.value.__cause__ is not None  # chained, but the botocore error is only the cause
        await s.close()


async def test_body_cut_short_is_retried(moto_server):
    bucket = make_bucket(moto_server)
    is_get = lambda r: r.method == "GET" and "list-type" not in r.query  # noqa: E731
    async with FaultProxy(moto_server, fail=2, cut=True, match=is_get) as proxy:
        s = await _open(s3_uri(proxy.url, bucket, max_attempts=3, **FAST))
        data = os.urandom(300_000)
        await s.put("k", data)
        assert await s.get("k") == data
        assert proxy.seen == 3
        proxy.arm(3)
        with pytest.raises(TransientStorageError, match="after 3 attempts"):
            await s.get_range("k", 1000, 100_000)
        await s.close()


async def test_5xx_during_multipart_retries_the_part(moto_server):
    bucket = make_bucket(moto_server)
    is_part_2 = lambda r: r.method == "PUT" and r.query.get("partNumber") == "2"  # noqa: E731
    async with FaultProxy(moto_server, fail=2, status=500, code="InternalError", match=is_part_2) as proxy:
        s = await _open(s3_uri(proxy.url, bucket, max_attempts=3, part_size=5 * MIB,
                               multipart_threshold=5 * MIB, **FAST))
        data = os.urandom(11 * MIB)
        await s.put("big", data)
        assert proxy.seen == 3 and await s.get("big") == data
        await s.close()


async def test_failed_part_aborts_the_upload(moto_server):
    bucket = make_bucket(moto_server)
    is_part_2 = lambda r: r.method == "PUT" and r.query.get("partNumber") == "2"  # noqa: E731
    async with FaultProxy(moto_server, fail=100, match=is_part_2) as proxy:
        s = await _open(s3_uri(proxy.url, bucket, max_attempts=2, part_size=5 * MIB,
                               multipart_threshold=5 * MIB, **FAST))
        with pytest.raises(TransientStorageError, match="upload part 2"):
            await s.put("big", os.urandom(11 * MIB))
        assert proxy.seen == 2
        await s.close()
    assert await _uploads(moto_server, bucket) == []  # aborted: no parts left behind
    assert await _raw_keys(moto_server, bucket) == []  # and no partial object


async def test_permission_errors_are_not_retried(moto_server):
    bucket = make_bucket(moto_server)
    is_get = lambda r: r.method == "GET" and "list-type" not in r.query  # noqa: E731
    async with FaultProxy(moto_server, fail=1, status=403, code="AccessDenied", match=is_get) as proxy:
        s = await _open(s3_uri(proxy.url, bucket, max_attempts=5, **FAST))
        await s.put("k", b"v")
        with pytest.raises(StorageIOError, match="AccessDenied") as e:
            await s.get("k")
        assert not isinstance(e.value, TransientStorageError) and proxy.seen == 1
        await s.close()


async def test_unreachable_endpoint_is_transient_and_bounded():
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    s = S3ObjectStore.from_uri(s3_uri(endpoint, "nobucket", max_attempts=3, **FAST))
    t0 = time.monotonic()
    with pytest.raises(TransientStorageError) as e:
        await asyncio.wait_for(s.open_store(), 20)
    assert time.monotonic() - t0 < 10
    assert "nobucket" in str(e.value) and endpoint in str(e.value) and "after 3 attempts" in str(e.value)
    await s.close()


# -- configuration ---------------------------------------------------------------------------

async def test_config_errors(moto_server):
    with pytest.raises(ConfigurationError, match="unknown option 'colour'"):
        S3ObjectStore.from_uri("trs3://b/p?colour=red")
    with pytest.raises(ConfigurationError, match="max_attempts"):
        S3ObjectStore.from_uri("trs3://b/p?max_attempts=many")
    with pytest.raises(ConfigurationError, match="max_attempts"):
        S3ObjectStore.from_uri("trs3://b/p?max_attempts=0")
    with pytest.raises(ConfigurationError, match="part_size"):
        S3ObjectStore.from_uri("trs3://b/p?part_size=1024")
    with pytest.raises(ConfigurationError, match="secret_access_key"):
        S3ObjectStore.from_uri("trs3://b/p?access_key_id=only")
    with pytest.raises(ConfigurationError, match="bucket"):
        S3ObjectStore.from_uri("trs3:///p")


async def test_missing_bucket_fails_at_open(moto_server):
    s = S3ObjectStore.from_uri(s3_uri(moto_server, "no-such-bucket-here"))
    with pytest.raises(StorageIOError, match="at http://127.0.0.1:.*bucket 'no-such-bucket-here' does not exist"):
        await s.open_store()
    assert s._client is None  # nothing left open
    await s.close()


async def test_credentials_from_the_environment(moto_server, monkeypatch):
    """No keys in the URI: botocore's chain finds them (here the AWS_* env vars)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    bucket = make_bucket(moto_server)
    s = await _open(f"trs3://{bucket}/p?endpoint_url={moto_server}&region=us-east-1")
    await s.put("k", b"v")
    assert await s.get("k") == b"v"
    await s.close()


async def test_uri_hides_credentials(moto_server):
    s = S3ObjectStore.from_uri(s3_uri(moto_server, "bkt", max_attempts=3))
    assert "testing" not in s.uri and "secret" not in s.uri and "access_key" not in s.uri
    assert s.uri.startswith("trs3://bkt/pre/fix?endpoint_url=http") and "max_attempts=3" in s.uri


# -- TerrascaleFS on top -----------------------------------------------------------------------

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
