"""S3 object store through aiobotocore (URI scheme ``trs3``). See docs/s3.md.

``trs3://BUCKET/prefix?endpoint_url=…&region=…&access_key_id=…&secret_access_key=…
&max_attempts=5&backoff_base=0.1&part_size=8388608&multipart_threshold=8388608``

Transient failures (throttling, 5xx, timeouts, refused or dropped
connections, bodies cut short) are retried by ``catalog.retry`` with exponential
backoff and full jitter on top of a single botocore attempt, so the policy is ours,
bounded and visible; after the last attempt the caller gets ``TransientStorageError``.
Large objects go up as multipart uploads that are aborted on any failure, so
a reader never sees part of an object. No botocore exception reaches a
caller: each is mapped onto ``terrafs.errors`` and chained as the cause.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Callable, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError as BotoConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)

from catalog.retry import Retry, acall
from terrafs.abc import Buffer, ObjectInfo, ObjectStore, check_name
from terrafs.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    StorageIOError,
    TransientStorageError,
)

_SECRET_OPTIONS = {"access_key_id", "secret_access_key"}
_INT_OPTIONS = {"max_attempts", "part_size", "multipart_threshold"}
_FLOAT_OPTIONS = {"backoff_base"}
_OPTIONS = {"endpoint_url", "region"} | _SECRET_OPTIONS | _INT_OPTIONS | _FLOAT_OPTIONS

_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
                    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable"}
# botocore wraps aiohttp's failures in ConnectionError (refused, connect
# timeout) and HTTPClientError (closed, read timeout, body cut short); the raw
# ones are listed too because a body read can surface them directly.
_NETWORK_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError,
                   aiohttp.ClientError, asyncio.TimeoutError, OSError)
MIN_PART = 5 << 20  # S3's minimum part size (every part but the last)
MAX_PART = 5 << 30  # S3's maximum part size
BACKOFF_MAX = 5.0  # seconds: the cap on one backoff sleep
T = TypeVar("T")
S3Client = Any  # aiobotocore's S3 client: the library ships no types


class S3ObjectStore(ObjectStore):
    """Objects under ``prefix/`` in one bucket of any S3-speaking server."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, max_attempts: int = 5,
                 backoff_base: float = 0.1, part_size: int = 8 << 20,
                 multipart_threshold: int = 8 << 20, uri: str | None = None):
        _check_config(bucket, access_key_id, secret_access_key, max_attempts, backoff_base,
                      part_size, multipart_threshold)
        self.bucket = bucket
        self.prefix = "/".join(p for p in prefix.split("/") if p)  # never a double slash
        self.endpoint_url, self.region = endpoint_url, region
        self._creds = (access_key_id, secret_access_key)
        self.max_attempts, self.backoff_base = max_attempts, backoff_base
        self._policy = Retry(attempts=max_attempts, base=backoff_base, cap=BACKOFF_MAX)
        self.part_size, self.multipart_threshold = part_size, multipart_threshold
        self.uri = uri or f"trs3://{bucket}/{self.prefix}"
        self._label = f"trs3://{bucket}/{self.prefix} at {endpoint_url or 'AWS'}"  # for messages
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: S3Client | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def from_uri(cls, uri: str) -> "S3ObjectStore":
        """Parse ``trs3://BUCKET/prefix?options``; unknown options are ConfigurationError."""
        parts = urlsplit(uri)
        if parts.scheme != "trs3":
            raise ConfigurationError(f"{uri}: not a trs3:// URI")
        opts: dict[str, Any] = {k: v for k, v in query_options(uri, _OPTIONS).items() if v != ""}
        public = {k: v for k, v in opts.items() if k not in _SECRET_OPTIONS}
        for names, conv in ((_INT_OPTIONS, int), (_FLOAT_OPTIONS, float)):
            for k in names & opts.keys():
                try:
                    opts[k] = conv(opts[k])
                except ValueError:
                    raise ConfigurationError(f"{uri}: option {k} must be a number") from None
        query = urlencode(public, safe=":/")
        shown = f"trs3://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
        return cls(parts.netloc, parts.path, **opts, uri=shown)

    # -- connection ------------------------------------------------------------------

    async def open_store(self) -> None:
        """Create the client and check the bucket answers (HeadBucket)."""
        await self._c()

    async def _c(self) -> S3Client:
        """The client, opened on first use; concurrent first uses open it once."""
        if self._client is None:
            async with self._opening:
                if self._client is None:
                    self._stack, self._client = await self._connect()
        return self._client

    async def _connect(self) -> tuple[contextlib.AsyncExitStack, S3Client]:
        stack = contextlib.AsyncExitStack()
        # Path-style for custom endpoints (MinIO, moto: no wildcard DNS); AWS picks its own.
        style = "path" if self.endpoint_url else "auto"
        cfg = AioConfig(retries={"total_max_attempts": 1, "mode": "standard"},  # retries are ours
                        s3={"addressing_style": style}, connect_timeout=5, read_timeout=60,
                        max_pool_connections=32)
        try:
            client = await stack.enter_async_context(get_session().create_client(
                "s3", endpoint_url=self.endpoint_url, region_name=self.region,
                aws_access_key_id=self._creds[0], aws_secret_access_key=self._creds[1], config=cfg))
            await self._retry("head_bucket", lambda: client.head_bucket(Bucket=self.bucket))
        except ObjectNotFoundError as e:
            await stack.aclose()
            raise StorageIOError(f"{self._label}: bucket {self.bucket!r} does not exist") from e
        except BaseException:
            await stack.aclose()
            raise
        return stack, client

    async def close(self) -> None:
        """Close the client and its connection pool; a later call opens a new one."""
        if self._stack is not None:
            stack, self._stack, self._client = self._stack, None, None
            await stack.aclose()

    def _key(self, key: str) -> str:
        check_name(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- retries and errors ----------------------------------------------------------

    async def _retry(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call()``; back off and retry transient failures (catalog.retry); map every
        botocore error. Every S3 call here may be repeated without harm: puts and parts of
        whole bytes, reads, deletes; a repeated CreateMultipartUpload leaves at most an unused
        upload (the bucket's AbortIncompleteMultipartUpload rule reclaims it), and a repeated
        CompleteMultipartUpload whose first answer was lost fails (NoSuchUpload) although
        the object is whole: a failed put of an object that exists, which a put again replaces."""
        where = f"{self._label}: {what}"

        async def once() -> T:
            try:
                return await call()
            except ClientError as e:
                raise _classify(e, where) from e
            except _NETWORK_ERRORS as e:
                raise TransientStorageError(f"{where}: {type(e).__name__}: {e}") from e
            except (NoCredentialsError, PartialCredentialsError) as e:
                raise ConfigurationError(f"{where}: no usable AWS credentials: {e}") from e
            except BotoCoreError as e:
                raise StorageIOError(f"{where}: {e}") from e

        return await acall(once, _transient, self._policy, give_up=_gave_up)

    # -- writes ----------------------------------------------------------------------

    async def put(self, key: str, data: Buffer) -> ObjectInfo:
        k, data = self._key(key), bytes(data)
        if len(data) <= self.multipart_threshold:
            c = await self._c()
            r = await self._retry(f"put {key}", lambda: c.put_object(Bucket=self.bucket, Key=k, Body=data))
            return ObjectInfo(key, len(data), _etag(r))

        async def parts() -> AsyncIterator[bytes]:
            for i in range(0, len(data), self.part_size):
                yield data[i : i + self.part_size]

        return await self._multipart(key, k, parts())

    async def put_stream(self, key: str, chunks: AsyncIterable[bytes]) -> ObjectInfo:
        """Buffer up to the threshold: small totals become one put, larger ones multipart."""
        k = self._key(key)
        it = chunks.__aiter__()
        head = bytearray()
        async for c in it:
            head += c
            if len(head) > self.multipart_threshold:
                break
        else:
            return await self.put(key, head)
        return await self._multipart(key, k, self._split(head, it))

    async def _split(self, buf: bytearray, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Cut ``buf`` + ``rest`` into parts; holds at most about two parts plus a chunk."""
        async for c in rest:
            buf += c
            while len(buf) >= 2 * self.part_size:
                yield bytes(buf[: self.part_size])
                del buf[: self.part_size]
        while len(buf) - self.part_size >= MIN_PART:  # the last part may be small, no other
            yield bytes(buf[: self.part_size])
            del buf[: self.part_size]
        if buf:
            yield bytes(buf)

    async def _multipart(self, key: str, k: str, parts: AsyncIterator[bytes]) -> ObjectInfo:
        """Upload ``parts`` as one multipart upload; abort it on any failure or cancellation."""
        c = await self._c()
        up = await self._retry(f"create multipart {key}",
                               lambda: c.create_multipart_upload(Bucket=self.bucket, Key=k))
        uid, size = up["UploadId"], 0
        done: list[dict[str, object]] = []
        try:
            async for body in parts:
                n = len(done) + 1
                r = await self._retry(f"upload part {n} of {key}", functools.partial(
                    c.upload_part, Bucket=self.bucket, Key=k, UploadId=uid, PartNumber=n, Body=body))
                done.append({"PartNumber": n, "ETag": r["ETag"]})
                size += len(body)
            r = await self._retry(f"complete multipart {key}", lambda: c.complete_multipart_upload(
                Bucket=self.bucket, Key=k, UploadId=uid, MultipartUpload={"Parts": done}))
        except BaseException:
            await self._abort(c, k, uid)
            raise
        return ObjectInfo(key, size, _etag(r))

    async def _abort(self, c: S3Client, k: str, uid: str) -> None:
        """Best effort, once: the original error matters more; a bucket lifecycle
        rule (AbortIncompleteMultipartUpload) reclaims what this misses."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(c.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=uid), 30)

    # -- reads -----------------------------------------------------------------------

    async def get(self, key: str) -> bytes:
        return await self._read(key, None)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        if length <= 0:
            await self.head(key)  # still report a missing object
            return b""
        return await self._read(key, f"bytes={offset}-{offset + length - 1}")

    async def _read(self, key: str, rng: str | None) -> bytes:
        c, k = await self._c(), self._key(key)
        kw = {"Range": rng} if rng else {}

        async def call() -> bytes:  # the body read is inside the retry: a cut-off body is retried too
            r = await c.get_object(Bucket=self.bucket, Key=k, **kw)
            async with r["Body"] as stream:
                body: bytes = await stream.read()
                return body

        try:
            return await self._retry(f"get {key}", call)
        except _RangePastEnd:
            return b""  # S3 says 416 only for an existing object (missing ones are NoSuchKey)

    async def presign_get(self, key: str, expires_s: float) -> str:
        """A presigned GET URL of ``key`` (readers that hold no credentials, e.g. Spark executors)."""
        c = await self._c()
        url: str = await c.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self._key(key)},
                                                  ExpiresIn=int(expires_s))
        return url

    async def head(self, key: str) -> ObjectInfo:
        c, k = await self._c(), self._key(key)
        r = await self._retry(f"head {key}", lambda: c.head_object(Bucket=self.bucket, Key=k))
        return ObjectInfo(key, r["ContentLength"], _etag(r))

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        c = await self._c()
        base = f"{self.prefix}/" if self.prefix else ""

        async def call() -> list[ObjectInfo]:  # a failed page restarts the listing: pages are not resumable safely
            out: list[ObjectInfo] = []
            pages = c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            async for page in pages:
                out.extend(ObjectInfo(o["Key"][len(base):], o["Size"], _etag(o))
                           for o in page.get("Contents", []))
            return out

        return sorted(await self._retry(f"list {prefix!r}", call), key=lambda o: o.key)

    async def delete(self, key: str) -> None:
        c, k = await self._c(), self._key(key)
        await self._retry(f"delete {key}", lambda: c.delete_object(Bucket=self.bucket, Key=k))


class _RangePastEnd(StorageIOError):
    """Raised internally when S3 answers 416 to a range starting at or past the end."""


def _classify(e: ClientError, where: str) -> Exception:
    """Map an S3 error response onto terrafs.errors (transient ones are retried by _retry)."""
    err = e.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in _NOT_FOUND_CODES:
        return ObjectNotFoundError(f"{where}: not found")
    if code == "InvalidRange":
        return _RangePastEnd(where)
    if code in _TRANSIENT_CODES or status == 429 or status >= 500:
        return TransientStorageError(f"{where}: {code or status}")
    return StorageIOError(f"{where}: {code or status}: {err.get('Message', '')}")


def _transient(e: Exception) -> bool:
    return isinstance(e, TransientStorageError)


def _gave_up(e: Exception, attempts: int) -> Exception:
    return TransientStorageError(f"{e} (gave up after {attempts} attempts)")


def _check_config(bucket: str, access_key_id: str | None, secret_access_key: str | None, max_attempts: int,
                  backoff_base: float, part_size: int, multipart_threshold: int) -> None:
    if not bucket:
        raise ConfigurationError("trs3:// needs a bucket name")
    if (access_key_id is None) != (secret_access_key is None):
        raise ConfigurationError("trs3://: give both access_key_id and secret_access_key, or neither")
    if max_attempts < 1 or backoff_base < 0:
        raise ConfigurationError("trs3://: max_attempts must be >= 1 and backoff_base >= 0")
    if not MIN_PART <= part_size <= MAX_PART:
        raise ConfigurationError(f"trs3://: part_size must be within [{MIN_PART}, {MAX_PART}] (S3's limits)")
    if multipart_threshold < 0:
        raise ConfigurationError("trs3://: multipart_threshold must be >= 0")


def _etag(r: dict[str, Any]) -> str:
    etag: str = r.get("ETag", "")
    return etag.strip('"')


def query_options(uri: str, allowed: set[str]) -> dict[str, str]:
    """Query parameters of ``uri``; an unknown one is a ConfigurationError naming it."""
    opts = dict(parse_qsl(urlsplit(uri).query, keep_blank_values=True))
    for k in opts:
        if k not in allowed:
            raise ConfigurationError(f"{uri}: unknown option {k!r} (known: {', '.join(sorted(allowed))})")
    return opts
