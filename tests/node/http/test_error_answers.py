"""The edge's translation of storage failures (node/http/edge.py): a dependency that failed is
a 503 or 507 the client can act on, never a 500 — a 500 is reserved for our own bugs and for
damaged data."""
import errno
import json

import pytest
from aiohttp.test_utils import make_mocked_request

from node.http.edge import answer
from terrafs.errors import (FileCorruptionError, DeviceError, MirrorError, NoSpaceError, TransientStorageError,
                            failed_error)


@pytest.mark.parametrize("exc, status, code", [
    (failed_error("f.act: flush failed", OSError(errno.EIO, "Input/output error")), 503, "unavailable"),
    (DeviceError("f.act: an earlier flush failed"), 503, "unavailable"),
    (failed_error("f.act: an earlier flush failed", MirrorError("no longer led here")), 503, "unavailable"),
    (NoSpaceError("the block device is full"), 507, "insufficient_storage"),
    (OSError(errno.ENOSPC, "No space left on device"), 507, "insufficient_storage"),
    (TransientStorageError("s3://b: does not answer"), 503, "unavailable"),
    (FileCorruptionError("segment 7", 4096, "checksum mismatch"), 500, "storage_error"),
])
def test_storage_failures_answer_what_the_client_can_do(exc, status, code):
    resp = answer(make_mocked_request("POST", "/v1/tables/t/rows"), exc)
    assert resp.status == status
    assert json.loads(resp.body)["error"]["code"] == code


def _crash_in_a_handler():
    raise KeyError("a bug in a handler")


def test_a_500_logs_its_whole_traceback_once_per_kind_and_counts_the_repeats(caplog, monkeypatch):
    """The node's log holds where a 500 came from (every frame, the handler's included) — once:
    the same failure again within a minute is counted, not logged again."""
    from node.http import edge

    now = [0.0]
    monkeypatch.setattr(edge, "CRASHES", edge.CrashLog(every_s=60.0, clock=lambda: now[0]))
    request = make_mocked_request("POST", "/v1/tables/t/rows")

    def fail():
        try:
            _crash_in_a_handler()
        except KeyError as e:
            return answer(request, e)

    with caplog.at_level("ERROR", logger="terrascale.node"):
        for _ in range(3):
            assert fail().status == 500
        logged = [r for r in caplog.records if "request_crashed" in r.getMessage()]
        assert len(logged) == 1 and logged[0].exc_info is not None
        assert "_crash_in_a_handler" in caplog.text and "Traceback" in caplog.text
        now[0] = 61.0
        fail()
        logged = [r for r in caplog.records if "request_crashed" in r.getMessage()]
        assert len(logged) == 2 and "repeats_unlogged=2" in logged[1].getMessage()
