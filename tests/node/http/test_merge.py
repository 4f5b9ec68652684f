"""The merge of a subscription's shares across nodes (node/http/merge.py) keeps the one-node
stream's order (docs/rfcs/0015-subscriptions.md §5): every change sent before ``closed T`` is
at or below T, every change after it is above T, and at the end every change at or below
the last closed T has gone out exactly once — for any shares' rounds, arriving in any
interleaving. A client that resumes from its last closed T therefore never sees a change twice
(the cluster test that found the hole: tests/node/cluster/test_subscribe_cluster.py)."""
from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from node.http.answers import json_text
from node.http.frames import Frame
from node.http.merge import MergedFrames
from rowstore.errors import SubscriptionEndedError

END = 1 << 40


class _Script:
    """Which share's next frame reaches the merge next: shares speak in the script's order."""

    def __init__(self, order: list[int]):
        self.order, self.turn = order, 0
        self.moved = asyncio.Condition()


class _Share:
    """A share replaying its frames when the script says; after the last it waits for ever."""

    def __init__(self, i: int, frames: list[Frame], script: _Script):
        self.i, self.frames, self.script = i, list(frames), script

    async def next(self) -> Frame:
        s = self.script
        async with s.moved:
            await s.moved.wait_for(lambda: s.turn < len(s.order) and s.order[s.turn] == self.i)
            s.turn += 1
            s.moved.notify_all()
        return self.frames.pop(0)

    def end(self, code: str, message: str, drop: bool = False) -> None:
        pass

    async def finished(self) -> SubscriptionEndedError:
        raise AssertionError("not asked")

    def close(self) -> None:
        pass


def _rounds(share: int, steps: list[list[int]]) -> tuple[list[Frame], list[int]]:
    """A share's frames: per step, its changes (``steps`` holds their commit-time increments),
    then its closed timestamp past them; last ``closed END``, after which the merge has sent
    everything."""
    frames, ts, t, n = [], [], 0, 0
    for step in steps:
        batch = []
        for inc in step:
            t += inc
            batch.append({"op": "upsert", "commit_ts": t, "row": {"id": share * 10_000 + n}})
            ts.append(t)
            n += 1
        if batch:
            frames.append(Frame(json_text(batch), "changes", len(batch)))
        t += 1
        frames.append(Frame(json_text({"closed": t}), "closed", 0, t))
    frames.append(Frame(json_text({"closed": END}), "closed", 0, END))  # the test's end
    return frames, ts


async def _merge(streams: list[list[Frame]], order: list[int], limit: int = 16 << 20) -> list[Frame]:
    script = _Script(order)
    m = MergedFrames([_Share(i, f, script) for i, f in enumerate(streams)], limit)
    out: list[Frame] = []
    try:
        while not out or out[-1].closed != END:
            out.append(await m.next())
    finally:
        m.close()
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(1, 5), max_size=3), min_size=1, max_size=6), min_size=2, max_size=4),
       st.data())
def test_the_merged_stream_keeps_the_one_node_order(shares, data):
    streams, every = [], []
    for i, steps in enumerate(shares):
        f, ts = _rounds(i, steps)
        streams.append(f)
        every.append(ts)
    order = data.draw(st.permutations([i for i, f in enumerate(streams) for _ in f]), "order")
    out = asyncio.run(_merge(streams, order))
    last, since, seen = 0, [], []
    for f in out:
        if f.closed is not None:
            assert f.closed > last, "closed timestamps only grow"
            assert all(t <= f.closed for t in since), f"a change above closed {f.closed} went out before it"
            last, since = f.closed, []
        else:
            for c in json.loads(f.text):
                assert c["commit_ts"] > last, f"change at {c['commit_ts']} after closed {last}"
                since.append(c["commit_ts"])
                seen.append((c["commit_ts"], c["row"]["id"]))
    assert len(seen) == len(set(seen)), "a change went out twice"
    assert sorted(t for t, _ in seen) == sorted(t for ts in every for t in ts), "every change went out"


def test_a_share_ahead_by_more_than_the_limit_ends_the_subscription():
    big = Frame(json_text([{"op": "upsert", "commit_ts": 5, "row": {"id": 1, "s": "x" * 500}}]), "changes", 1)
    try:
        asyncio.run(_merge([[big, big, big], [Frame(b"", "closed", 0, END)]], [0, 0, 0], limit=1000))
    except SubscriptionEndedError as e:
        assert e.code == "unavailable"
    else:
        raise AssertionError("the merge held more than its limit")
