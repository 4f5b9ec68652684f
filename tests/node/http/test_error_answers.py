"""The edge's translation of storage failures (node/http/edge.py): a dependency that failed is
a 503 or 507 the client can act on, never a 500 — a 500 is reserved for our own bugs and for
damaged data."""
import errno
import json

import pytest
from aiohttp.test_utils import make_mocked_request

from node.http.edge import answer
from terrafs.errors import (CorruptionError, DeviceError, MirrorError, NoSpaceError, TransientStorageError,
                            failed_error)


@pytest.mark.parametrize("exc, status, code", [
    (failed_error("f.act: flush failed", OSError(errno.EIO, "Input/output error")), 503, "unavailable"),
    (DeviceError("f.act: an earlier flush failed"), 503, "unavailable"),
    (failed_error("f.act: an earlier flush failed", MirrorError("no longer led here")), 503, "unavailable"),
    (NoSpaceError("the block device is full"), 507, "insufficient_storage"),
    (OSError(errno.ENOSPC, "No space left on device"), 507, "insufficient_storage"),
    (TransientStorageError("s3://b: does not answer"), 503, "unavailable"),
    (CorruptionError("segment 7", 4096, "checksum mismatch"), 500, "storage_error"),
])
def test_storage_failures_answer_what_the_client_can_do(exc, status, code):
    resp = answer(make_mocked_request("POST", "/v1/tables/t/rows"), exc)
    assert resp.status == status
    assert json.loads(resp.body)["error"]["code"] == code
