"""A test node's fault files on its calls to other nodes (``Cluster.call``,
``TERRASCALE_FAILPOINT_CUT_DIR``, terrafs/failpoints.py): ``slow-<node>`` holding a number of
ms makes each call to that node wait that long (without blocking the loop) before it is sent;
an empty file named after the node refuses the call; neither: sent at once."""
import pytest

from node.cluster import members
from node.cluster.members import Cluster
from terrafs import failpoints


class _Answer:
    status, headers = 200, {}

    async def read(self) -> bytes:
        return b"{}"

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


class _Session:
    def __init__(self, events: list):
        self.events = events

    def request(self, method, url, **kw):
        self.events.append(("sent", method, url))
        return _Answer()


@pytest.fixture
def world(tmp_path, monkeypatch):
    events: list = []

    async def sleep(s):  # recorded, not waited: members.py's asyncio only (the loop's is untouched)
        events.append(("waited", s))
    monkeypatch.setattr(failpoints, "CUT_DIR", str(tmp_path))
    monkeypatch.setattr(members, "asyncio", type("Asyncio", (), {"sleep": staticmethod(sleep)}))
    c = Cluster(None, "n1", "http://n1", None)
    c._members = {n: {"http": f"http://{n}", "raft": None} for n in ("n2", "n3")}
    c._session = _Session(events)
    return tmp_path, c, events


async def test_a_slow_link_waits_before_each_call_to_that_node_only(world):
    d, c, events = world
    (d / "slow-n2").write_text("250")
    assert (await c.call("n2", "GET", "/v1/internal/closed"))[0] == 200
    assert (await c.call("n3", "GET", "/v1/internal/closed"))[0] == 200
    assert events == [("waited", 0.25), ("sent", "GET", "http://n2/v1/internal/closed"),
                      ("sent", "GET", "http://n3/v1/internal/closed")]


async def test_a_cut_refuses_the_call_and_no_file_sends_it_at_once(world):
    d, c, events = world
    (d / "n2").touch()
    (d / "slow-n2").write_text("250")
    with pytest.raises(ConnectionError, match="cut by a test"):
        await c.call("n2", "GET", "/x")
    assert events == []
    (d / "n2").unlink()
    (d / "slow-n2").unlink()
    await c.call("n2", "GET", "/x")
    assert events == [("sent", "GET", "http://n2/x")]
