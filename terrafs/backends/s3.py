"""S3 object store through aiobotocore (URI scheme ``trs3``).

``trs3://BUCKET/prefix?endpoint_url=…&region=…&access_key_id=…&secret_access_key=…
&max_attempts=5&part_size=8388608&multipart_threshold=8388608``

Transient failures (throttling, 5xx, timeouts, refused connections) are
retried with exponential backoff and full jitter, on top of a single botocore
attempt, so the policy is ours and visible; after the last attempt the
caller gets ``TransientStorageError``. Large objects go up as multipart
uploads (aborted on failure), so a reader never sees part of an object.
See docs/s3.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import random
from typing import AsyncIterable
from urllib.parse import urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from terrafs.abc import ObjectInfo, ObjectStore, check_name
from terrafs.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    StorageIOError,
    TransientStorageError,
)
from terrafs.uri import query_options

_OPTIONS = {"endpoint_url", "region", "access_key_id", "secret_access_key", "max_attempts",
            "part_size", "multipart_threshold"}
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                    "ServiceUnavailable", "RequestTimeTooSkewed", "500", "502", "503", "504"}
_NETWORK_ERRORS = (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError,
                   aiohttp.ClientError, asyncio.TimeoutError, OSError)
MIN_PART = 5 << 20  # S3's minimum part size (all but the last part)


class S3ObjectStore(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, max_attempts: int = 5,
                 part_size: int = 8 << 20, multipart_threshold: int = 8 << 20,
                 base_delay: float = 0.05, uri: str | None = None):
        if not bucket:
            raise ConfigurationError("trs3:// needs a bucket name")
        if part_size < MIN_PART:
            raise ConfigurationError(f"part_size must be at least {MIN_PART} bytes (S3's minimum)")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.endpoint_url, self.region = endpoint_url, region
        self._creds = (access_key_id, secret_access_key)
        self.max_attempts, self.part_size = max(1, max_attempts), part_size
        self.multipart_threshold, self.base_delay = multipart_threshold, base_delay
        self.uri = uri or f"trs3://{bucket}/{self.prefix}"
        self._stack: contextlib.AsyncExitStack | None = None
        self._client = None
        self._opening = asyncio.Lock()

    @classmethod
    def from_uri(cls, uri: str) -> "S3ObjectStore":
        parts = urlsplit(uri)
        if parts.scheme != "trs3":
            raise ConfigurationError(f"{uri}: not a trs3:// URI")
        opts = query_options(uri, _OPTIONS)
        ints = {}
        for k in ("max_attempts", "part_size", "multipart_threshold"):
            if k in opts:
                try:
                    ints[k] = int(opts.pop(k))
                except ValueError:
                    raise ConfigurationError(f"{uri}: option {k} must be an integer") from None
        public = f"trs3://{parts.netloc}{parts.path}"
        if opts.get("endpoint_url"):
            public += f"?endpoint_url={opts['endpoint_url']}"
        return cls(parts.netloc, parts.path, **opts, **ints, uri=public)

    # -- connection ------------------------------------------------------------------

    async def open_store(self) -> None:
        """Create the client and check the bucket answers."""
        await self._c()

    async def _c(self):
        if self._client is not None:
            return self._client
        async with self._opening:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                cfg = AioConfig(retries={"total_max_attempts": 1, "mode": "standard"},  # retries are ours
                                s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=60)
                client = await stack.enter_async_context(get_session().create_client(
                    "s3", endpoint_url=self.endpoint_url, region_name=self.region,
                    aws_access_key_id=self._creds[0], aws_secret_access_key=self._creds[1], config=cfg))
                try:
                    await self._retry("head_bucket", lambda: client.head_bucket(Bucket=self.bucket))
                except ObjectNotFoundError:
                    await stack.aclose()
                    raise StorageIOError(f"{self.uri}: bucket {self.bucket!r} does not exist "
                                         f"at {self.endpoint_url or 'AWS'}") from None
                except BaseException:
                    await stack.aclose()
                    raise
                self._stack, self._client = stack, client
        return self._client

    async def close(self) -> None:
        if self._stack is not None:
            stack, self._stack, self._client = self._stack, None, None
            await stack.aclose()

    def _key(self, key: str) -> str:
        check_name(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- retries and errors ----------------------------------------------------------

    async def _retry(self, what: str, call):
        """Run ``call()`` with backoff on transient errors; map every botocore error."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                return await call()
            except ClientError as e:
                err = _classify(e, f"{self.uri}: {what}")
            except _NETWORK_ERRORS as e:
                err = TransientStorageError(f"{self.uri}: {what}: {type(e).__name__}: {e}")
            except BotoCoreError as e:
                raise StorageIOError(f"{self.uri}: {what}: {e}") from e
            if not isinstance(err, TransientStorageError) or attempt == self.max_attempts:
                raise err
            await asyncio.sleep(random.uniform(0, self.base_delay * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    # -- operations ------------------------------------------------------------------

    async def put(self, key: str, data) -> ObjectInfo:
        k = self._key(key)
        data = bytes(data)
        if len(data) <= self.multipart_threshold:
            c = await self._c()
            r = await self._retry(f"put {key}", lambda: c.put_object(Bucket=self.bucket, Key=k, Body=data))
            return ObjectInfo(key, len(data), r.get("ETag", "").strip('"'))

        async def parts():
            for i in range(0, len(data), self.part_size):
                yield data[i : i + self.part_size]

        return await self._multipart(key, k, parts())

    async def put_stream(self, key: str, chunks: AsyncIterable[bytes]) -> ObjectInfo:
        """Buffer up to one part; small totals become a single put, large ones multipart."""
        k = self._key(key)
        it = chunks.__aiter__()
        head = bytearray()
        async for c in it:
            head += c
            if len(head) > self.multipart_threshold:
                break
        else:
            return await self.put(key, bytes(head))

        async def parts():
            buf = head
            async for c in it:
                buf += c
                while len(buf) >= 2 * self.part_size:
                    yield bytes(buf[: self.part_size])
                    del buf[: self.part_size]
            while len(buf) - self.part_size >= MIN_PART:  # every part but the last >= S3's minimum
                yield bytes(buf[: self.part_size])
                del buf[: self.part_size]
            if buf:
                yield bytes(buf)

        return await self._multipart(key, k, parts())

    async def _multipart(self, key: str, k: str, parts) -> ObjectInfo:
        c = await self._c()
        up = await self._retry(f"create multipart {key}",
                               lambda: c.create_multipart_upload(Bucket=self.bucket, Key=k))
        uid, done, size = up["UploadId"], [], 0
        try:
            async for n, body in _numbered(parts):
                r = await self._retry(f"upload part {n} of {key}", lambda: c.upload_part(
                    Bucket=self.bucket, Key=k, UploadId=uid, PartNumber=n, Body=body))
                done.append({"PartNumber": n, "ETag": r["ETag"]})
                size += len(body)
            r = await self._retry(f"complete multipart {key}", lambda: c.complete_multipart_upload(
                Bucket=self.bucket, Key=k, UploadId=uid, MultipartUpload={"Parts": done}))
        except BaseException:
            with contextlib.suppress(Exception):
                await c.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=uid)
            raise
        return ObjectInfo(key, size, r.get("ETag", "").strip('"'))

    async def get(self, key: str) -> bytes:
        return await self._read(key, None)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            await self.head(key)  # still report a missing object
            return b""
        return await self._read(key, f"bytes={offset}-{offset + length - 1}")

    async def _read(self, key: str, rng: str | None) -> bytes:
        c, k = await self._c(), self._key(key)

        async def call():
            kw = {"Range": rng} if rng else {}
            r = await c.get_object(Bucket=self.bucket, Key=k, **kw)
            async with r["Body"] as stream:
                return await stream.read()

        try:
            return await self._retry(f"get {key}", call)
        except _RangePastEnd:
            await self.head(key)
            return b""

    async def head(self, key: str) -> ObjectInfo:
        c, k = await self._c(), self._key(key)
        r = await self._retry(f"head {key}", lambda: c.head_object(Bucket=self.bucket, Key=k))
        return ObjectInfo(key, r["ContentLength"], r.get("ETag", "").strip('"'))

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        c = await self._c()
        base = f"{self.prefix}/" if self.prefix else ""

        async def call():
            out = []
            pages = c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            async for page in pages:
                for o in page.get("Contents", []):
                    out.append(ObjectInfo(o["Key"][len(base):], o["Size"], o.get("ETag", "").strip('"')))
            return out

        return sorted(await self._retry(f"list {prefix}", call), key=lambda o: o.key)

    async def delete(self, key: str) -> None:
        c, k = await self._c(), self._key(key)
        await self._retry(f"delete {key}", lambda: c.delete_object(Bucket=self.bucket, Key=k))


class _RangePastEnd(StorageIOError):
    """S3 answers 416 to a range starting at or past the end: we return b""."""


def _classify(e: ClientError, what: str) -> Exception:
    code = str(e.response.get("Error", {}).get("Code", ""))
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
        return ObjectNotFoundError(f"{what}: not found")
    if code == "InvalidRange":
        return _RangePastEnd(what)
    if code in _TRANSIENT_CODES or status >= 500:
        return TransientStorageError(f"{what}: {code or status}")
    return StorageIOError(f"{what}: {code or status}: {e.response.get('Error', {}).get('Message', '')}")


async def _numbered(parts):
    n = 0
    async for p in parts:
        n += 1
        yield n, p
