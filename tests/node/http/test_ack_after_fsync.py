"""The durability rule, watched from outside with strace (docs/REFERENCE.md §7): no write is
acknowledged before an fdatasync that covers it — also when concurrent requests are coalesced
(node/http/coalesce.py) into shared appends and flushes.

The node runs under ``strace -f``; every response carrying a ``commit_ts`` is matched to its
request (the last row key read on that connection before it), to the device write that carried
that row's bytes (a marker string in the row), and to an fdatasync of that same file which
started after the write returned and finished before the response was written."""
import asyncio
import json
import re
import shutil

import aiohttp
import pytest

from bench.node_proc import NodeProc

CLIENTS, PER_CLIENT = 8, 15
LINE = re.compile(r"^(\d+)\s+(\d+\.\d+) (?:<\.\.\. (\w+) resumed>(.*)|(\w+)\((.*))$")
DURATION = re.compile(r"<(\d+\.\d+)>$")
FD_PATH = re.compile(r"^(\d+)<((?:TCP|TCPv6):\[[^\]]*\]|[^>]*)>")  # "->" inside a socket's name


def socket_of(fd: re.Match) -> str | None:
    """The connection a call's fd names: its number, not strace's text for it, which is
    ``TCP:[inode]`` instead of the addresses when a socket lookup fails now and then."""
    return fd.group(1) if fd.group(2).startswith(("TCP", "socket:")) else None


def _syscalls(text: str) -> list[dict]:
    """strace -f -ttt -T -yy lines as calls: pid, name, start, end, the text of their arguments."""
    calls: list[dict] = []
    open_: dict[int, dict] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        pid, ts = int(m.group(1)), float(m.group(2))
        if m.group(3):  # "<... name resumed>": the rest of an unfinished call of this thread
            c = open_.pop(pid, None)
            if c is None:
                continue
            c["args"] += m.group(4)
            tail = m.group(4)
        else:
            c = {"pid": pid, "name": m.group(5), "start": ts, "args": m.group(6)}
            tail = m.group(6)
            if tail.endswith("<unfinished ...>"):
                open_[pid] = c
                continue
        d = DURATION.search(tail.strip())
        c["end"] = c["start"] + (float(d.group(1)) if d else 0.0)
        calls.append(c)
    # Calls the trace never saw finish (the process stopped right after them: a cluster test's
    # last answer, sent as its nodes are stopped): their arguments count, their end is unknown —
    # never earlier than anything (a write or an fdatasync with no end covers nothing).
    for c in open_.values():
        c["args"] = c["args"].removesuffix("<unfinished ...>")
        calls.append({**c, "end": float("inf")})
    return calls


async def post_rows(base: str, clients: int = CLIENTS, per_client: int = PER_CLIENT, row=None) -> list[int]:
    """``clients`` concurrent keep-alive clients, each writing ``per_client`` single-row requests
    to table ``st`` (``row(key, i)`` the row; its name holds the key's marker); the keys written."""
    row = row or (lambda key, i: {"id": key, "name": f"mk{key:08d}zz", "v": float(i)})

    async def one(k: int, http) -> list[int]:
        done = []
        for s in range(per_client):
            key = k * 1000 + s
            doc = {"rows": [row(key, s)]}
            async with http.post(f"{base}/v1/tables/st/rows", data=json.dumps(doc),
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
                await r.read()
            done.append(key)
        return done

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        got = await asyncio.gather(*[one(k, http) for k in range(clients)])
    return [k for g in got for k in g]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (make test installs it)")
def test_no_acknowledgement_before_its_fdatasync(tmp_path):
    node = NodeProc(tmp_path)
    trace = tmp_path / "strace.txt"
    strace = ("strace", "-f", "-qq", "-ttt", "-T", "-yy", "-s", "65536", "-o", str(trace),
              "-e", "trace=fdatasync,pwritev,pwritev2,pwrite64,write,writev,sendto,sendmsg,read,recvfrom",
              "-e", "signal=none")
    try:
        node.start(wrap=strace, timeout=120)
        with node.client() as c:
            c.create_table("st", [("id", "int64"), ("name", "string"), ("v", "float64")], "id")
        keys = asyncio.run(post_rows(node.base))
    finally:
        node.ensure_stopped()
    calls = _syscalls(trace.read_text(errors="replace"))
    checked = _check(calls, set(keys))
    assert checked == len(keys), f"matched {checked} of {len(keys)} acknowledgements in the trace"


def _check(calls: list[dict], keys: set[int]) -> int:
    """Every acknowledged key: write of its row to a device file F, then an fdatasync(F) that
    started after that write returned and ended before the acknowledgement. Returns how many."""
    writes: dict[int, tuple[str, float]] = {}  # key -> (device file, end of the write)
    syncs: list[tuple[str, float, float]] = []  # (file, start, end)
    last_key: dict[str, int] = {}  # connection -> the key of the last request read on it
    acks: list[tuple[int, float]] = []
    for c in sorted(calls, key=lambda c: c["start"]):
        fd = FD_PATH.match(c["args"])
        if fd is None:
            continue
        path, conn = fd.group(2), socket_of(fd)
        if c["name"] in ("pwritev", "pwritev2", "pwrite64") and "/block/" in path:
            for k in re.findall(r"mk(\d{8})zz", c["args"]):
                writes.setdefault(int(k), (path, c["end"]))
        elif c["name"] == "fdatasync" and "/block/" in path:
            syncs.append((path, c["start"], c["end"]))
        elif conn and c["name"] in ("read", "recvfrom"):
            m = re.findall(r'\\"id\\": (\d+)', c["args"])
            if m:
                last_key[conn] = int(m[-1])
        elif conn and c["name"] in ("write", "writev", "sendto", "sendmsg") \
                and "commit_ts" in c["args"] and conn in last_key:
            acks.append((last_key.pop(conn), c["start"]))
    checked = 0
    for key, t_ack in acks:
        if key not in keys:
            continue
        assert key in writes, f"key {key} acknowledged but its row was never written to a device file"
        f, t_w = writes[key]
        assert t_w <= t_ack, f"key {key} acknowledged before its row was written"
        assert any(p == f and s >= t_w and e <= t_ack for p, s, e in syncs), \
            f"key {key} acknowledged at {t_ack:.6f} with no fdatasync of {f} between its write ({t_w:.6f}) and then"
        checked += 1
    return checked


def test_the_check_catches_an_ack_before_its_fdatasync():
    """The checker itself, on a hand-written trace: an acknowledgement sent while the covering
    fdatasync is still running is refused."""
    trace = "\n".join([
        '7 10.000000 read(9<TCP:[127.0.0.1:1->127.0.0.1:2]>, "{\\"rows\\": [{\\"id\\": 5}]}", 100) = 20 <0.000010>',
        '8 10.001000 pwritev2(4</d/block/files/a.act>, [{iov_base="mk00000005zz"}], 1, 0, 0) = 12 <0.000010>',
        '8 10.002000 fdatasync(4</d/block/files/a.act> <unfinished ...>',
        '7 10.002500 write(9<TCP:[127.0.0.1:1->127.0.0.1:2]>, "{\\"commit_ts\\": 1}", 16) = 16 <0.000010>',
        '8 10.003000 <... fdatasync resumed>) = 0 <0.001000>',
    ])
    with pytest.raises(AssertionError, match="no fdatasync"):
        _check(_syscalls(trace), {5})
    ok = trace.replace("10.002500 write", "10.003500 write")
    assert _check(_syscalls(ok), {5}) == 1
    # strace names a socket it failed to look up by its inode only: the fd still ties the answer
    # to its request
    unnamed = ok.replace("10.003500 write(9<TCP:[127.0.0.1:1->127.0.0.1:2]>", "10.003500 write(9<TCP:[4242]>")
    assert _check(_syscalls(unnamed), {5}) == 1
