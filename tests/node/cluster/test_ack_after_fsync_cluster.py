"""The durability rule on a replicated partition, watched from outside with strace (RFC 0011
step 4, docs/REFERENCE.md §7): with R = 3 a write is acknowledged only after the fdatasync that
covers its row on the leader *and* on a follower (a majority of three), also when the device
rounds (terrafs/rounds.py) write several files' groups with one flush and the replication
stream (node/cluster/transport.py) carries several partitions' groups in one request.

All three nodes run under ``strace -f``, each with its own trace; their timestamps come from the
one machine clock. Every acknowledged key (a marker string in its row) is matched to the
leader's device write of the row and an fdatasync of that file that started after the write
returned and ended before the acknowledgement, and to the same pair on at least one follower."""
import asyncio
import re
import shutil

import pyarrow as pa
import pytest

from bench.node_proc import raft_cluster
from rowstore.tables.keys import encode_keys, partition_of
from tests.node.http.test_ack_after_fsync import FD_PATH, _syscalls, post_rows, socket_of
from tests.node.cluster.test_replication_faults import caught_up
from tests.node.proc import FAST_CLUSTER, eventually

CLIENTS, PER_CLIENT, PARTITIONS = 6, 10, 2
STRACE = ("strace", "-f", "-qq", "-ttt", "-T", "-yy", "-s", "65536", "-e", "signal=none",
          "-e", "trace=fdatasync,pwritev,pwritev2,pwrite64,write,writev,sendto,sendmsg,read,recvfrom")


def _durable_at(calls: list[dict]) -> dict[int, list[tuple[float, float]]]:
    """key -> (end of the device write carrying its row, end of the first fdatasync of that
    file that started after it) for each such write in one node's trace."""
    writes: list[tuple[int, str, float]] = []
    syncs: list[tuple[str, float, float]] = []
    for c in calls:
        fd = FD_PATH.match(c["args"])
        if fd is None or "/block/" not in fd.group(2):
            continue
        if c["name"] in ("pwritev", "pwritev2", "pwrite64"):
            writes += [(int(k), fd.group(2), c["end"]) for k in re.findall(r"mk(\d{8})zz", c["args"])]
        elif c["name"] == "fdatasync":
            syncs.append((fd.group(2), c["start"], c["end"]))
    out: dict[int, list[tuple[float, float]]] = {}
    for key, path, t_w in writes:
        after = [e for p, s, e in syncs if p == path and s >= t_w]
        if after:
            out.setdefault(key, []).append((t_w, min(after)))
    return out


def _acks(calls: list[dict], keys: set[int]) -> dict[int, float]:
    """key -> when the node wrote the answer carrying its commit_ts to the client."""
    last: dict[str, int] = {}
    acks: dict[int, float] = {}
    for c in sorted(calls, key=lambda c: c["start"]):
        fd = FD_PATH.match(c["args"])
        conn = socket_of(fd) if fd else None
        if conn is None:
            continue
        if c["name"] in ("read", "recvfrom"):
            m = re.findall(r'\\"id\\": (\d+)', c["args"])
            if m and int(m[-1]) in keys:
                last[conn] = int(m[-1])
        elif c["name"] in ("write", "writev", "sendto", "sendmsg") and "commit_ts" in c["args"] and conn in last:
            acks[last.pop(conn)] = c["start"]
    return acks


def _check(acks: dict[int, float], leader: list[dict], followers: list[list[dict]]) -> int:
    """Every acknowledgement in ``acks`` came after an fdatasync covering its row on the leader
    of its partition and on at least one follower; returns how many were checked."""
    here = _durable_at(leader)
    there = [_durable_at(f) for f in followers]
    for key, t_ack in acks.items():
        assert any(e <= t_ack for _, e in here.get(key, [])), \
            f"key {key} acknowledged at {t_ack:.6f} before an fdatasync covering its row on the leader"
        assert any(e <= t_ack for f in there for _, e in f.get(key, [])), \
            f"key {key} acknowledged at {t_ack:.6f} before an fdatasync covering its row on any follower"
    return len(acks)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (make test installs it)")
def test_no_acknowledgement_before_the_leader_and_a_follower_fdatasync(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    traces = {n.node_id: tmp_path / f"strace-{n.node_id}.txt" for n in nodes}
    try:
        for n in nodes:
            n.start(wait=False, wrap=(*STRACE, "-o", str(traces[n.node_id])))
        for n in nodes:
            n.wait_ready(180)
        with nodes[0].client(timeout=120) as c:
            c.create_table("st", [("id", "int64"), ("name", "string")], "id", partitions=PARTITIONS, replicas=3)
            place = {p["partition"]: p["leader"] for p in c.describe("st")["placement"]}
        eventually(lambda: caught_up(nodes, PARTITIONS), 120)  # every partition promoted and served (slow under strace)
        entry = nodes[0]  # answers every write: its own partitions' and, forwarded, the others'
        keys = asyncio.run(post_rows(entry.base, CLIENTS, PER_CLIENT,
                                   lambda key, i: {"id": key, "name": f"mk{key:08d}zz"}))
    finally:
        for n in nodes:
            n.ensure_stopped()
    calls = {nid: _syscalls(t.read_text(errors="replace")) for nid, t in traces.items()}
    acks = _acks(calls[entry.node_id], set(keys))
    pids = partition_of(encode_keys(pa.array(sorted(acks), pa.int64()), "int64"), PARTITIONS)
    checked = 0
    for pid, leader in place.items():
        mine = {k: acks[k] for k, p in zip(sorted(acks), pids) if p == pid}
        checked += _check(mine, calls[leader], [calls[m] for m in calls if m != leader])
    assert checked == len(keys), \
        f"matched {checked} of {len(keys)} acknowledgements in the traces; unmatched: {sorted(set(keys) - set(acks))}"


def test_the_check_catches_an_ack_before_the_followers_fdatasync():
    """The checker itself, on hand-written traces: the leader's flush came first, but the one
    follower that wrote the row flushed it only after the acknowledgement."""
    leader = "\n".join([
        '7 10.000000 read(9<TCP:[127.0.0.1:1->127.0.0.1:2]>, "{\\"rows\\": [{\\"id\\": 5}]}", 100) = 20 <0.000010>',
        '8 10.001000 pwrite64(4</d/block/logdev>, "mk00000005zz", 12, 0) = 12 <0.000010>',
        '8 10.002000 fdatasync(4</d/block/logdev>) = 0 <0.000100>',
        '7 10.004000 write(9<TCP:[127.0.0.1:1->127.0.0.1:2]>, "{\\"commit_ts\\": 1}", 16) = 16 <0.000010>',
    ])
    follower = "\n".join([
        '3 10.001500 pwrite64(5</e/block/logdev>, "mk00000005zz", 12, 0) = 12 <0.000010>',
        '3 10.004500 fdatasync(5</e/block/logdev>) = 0 <0.000100>',
    ])
    acks = _acks(_syscalls(leader), {5})
    assert acks == {5: 10.004}
    with pytest.raises(AssertionError, match="any follower"):
        _check(acks, _syscalls(leader), [_syscalls(follower)])
    early = follower.replace("10.004500 fdatasync", "10.002500 fdatasync")
    assert _check(acks, _syscalls(leader), [_syscalls(early)]) == 1
