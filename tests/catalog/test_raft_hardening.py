"""RFC 0005's eight pysyncobj problems: each reproduced on stock pysyncobj, then shown fixed.

"Before" halves run ``tests/catalog/raft_stock.py`` in a subprocess (pysyncobj
exactly as shipped); "after" halves run our replica, in process or as real
node processes.
"""
import asyncio
import base64
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import pytest
from pysyncobj.encryptor import getEncryptor
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import FileJournal

from catalog.abc import Check, Put
from catalog.errors import CatalogTimeoutError, InvalidTransactionError
from catalog.raft import RaftCatalog
from catalog.raft.replica import BARRIER, Replica, apply_entry, encode_txn
from catalog.raft.wire import coalesce, plain_dumps, plain_loads
from catalog.state import CatalogState
from tests.catalog.raft_cluster import ROOT, Cluster, free_ports

SECRET = "0123456789abcdef0123456789abcdef"


def stock(scenario: str, tmp_path, nports: int = 1, timeout: float = 60) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.catalog.raft_stock", scenario, str(tmp_path),
                          *map(str, free_ports(nports))], cwd=ROOT, capture_output=True, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def listening_address(port: int) -> str:
    """Local address of the TCP socket listening on ``port`` (from /proc/net/tcp)."""
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        ip, p = f[1].split(":")
        if int(p, 16) == port and f[3] == "0A":
            return socket.inet_ntoa(struct.pack("<I", int(ip, 16)))
    raise LookupError(port)


class Evil:
    """Unpickling this calls open(path, "w"): code runs and leaves a file behind."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def frame(payload: bytes) -> bytes:
    return struct.pack("i", len(payload)) + payload


async def single(tmp_path, **kw) -> RaftCatalog:
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    c = RaftCatalog([addr], addr, str(tmp_path / "r"), SECRET, **kw)
    await c.open()
    return c


# -- 1. durability -----------------------------------------------------------------------------

def test_1_stock_journal_never_fsyncs(tmp_path):
    got = stock("unsynced_ack", tmp_path, 3)
    assert got["committed"] == 50 and got["fsync"] == 0 and got["fdatasync"] == 0


async def test_1_acks_and_commits_only_after_fsync(tmp_path, monkeypatch):
    """Every append acknowledgement leaves after the journal covering it was fdatasync'd, and
    the leader advances its commit index only over entries its own journal has made durable."""
    from pysyncobj.tcp_connection import TcpConnection

    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    cats = [RaftCatalog(addrs, a, str(tmp_path / f"n{i}"), SECRET) for i, a in enumerate(addrs)]
    await asyncio.gather(*(c.open() for c in cats))
    durable, bad, acks = {}, [], [0]
    reps = {f"raft-{c.self_addr}": c.replica() for c in cats}
    for name, rep in reps.items():
        def sync(rep=rep, name=name, inner=rep.journal.sync):
            inner()
            durable[name] = rep.journal[-1][1]
        rep.journal.sync = sync

        def set_commit(i, rep=rep, name=name, inner=rep.journal.setRaftCommitIndex):
            if rep._isLeader() and i > durable.get(name, 0):
                bad.append(("commit", name, i, durable.get(name)))
            inner(i)
        rep.journal.setRaftCommitIndex = set_commit
    real_send = TcpConnection.send

    def send(self, msg):
        name = threading.current_thread().name
        if isinstance(msg, dict) and msg.get("type") == "next_node_idx" and msg["success"]:
            acks[0] += 1
            if msg["next_node_idx"] - 1 > durable.get(name, 0):
                bad.append(("ack", name, msg["next_node_idx"] - 1, durable.get(name)))
        return real_send(self, msg)

    monkeypatch.setattr(TcpConnection, "send", send)
    try:
        await asyncio.gather(*(cats[i % 3].txn(ops=[Put(f"k{i}", b"v")]) for i in range(60)))
        assert acks[0] > 0 and not bad, bad[:5]
        assert all(c.replica().journal.syncs > 0 for c in cats)
    finally:
        await asyncio.gather(*(c.close() for c in cats))


def test_1_meta_and_dump_are_fsynced(tmp_path, monkeypatch):
    """Term/vote: temp file fsync'd, renamed, directory fsync'd, before setCurrentTerm returns."""
    from catalog.raft.journal import DurableJournal

    j = DurableJournal(str(tmp_path))
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", b)), real_replace(a, b))[1])
    j.setCurrentTerm(7, "127.0.0.1:1")
    meta = str(tmp_path / "meta.trm")
    assert events == [("fsync", meta + ".tmp"), ("rename", meta), ("fsync", str(tmp_path))]
    j2 = DurableJournal(str(tmp_path))
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId()) == (7, "127.0.0.1:1")


# -- 2. network ---------------------------------------------------------------------------------

def _stock_server(scenario, tmp_path):
    (port,) = free_ports(1)
    p = subprocess.Popen([sys.executable, "-m", "tests.catalog.raft_stock", scenario, str(tmp_path), str(port)],
                         cwd=ROOT, stdout=subprocess.PIPE)
    p.stdout.readline()
    return p, port


def test_2_stock_binds_every_interface(tmp_path):
    p, port = _stock_server("serve_default_bind", tmp_path)
    try:
        assert listening_address(port) == "0.0.0.0"
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


def test_2_stock_port_runs_a_crafted_pickle_and_serves_strangers(tmp_path):
    p, port = _stock_server("serve", tmp_path)  # bound to loopback for this test's sake
    try:
        marker = tmp_path / "pwned"
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(frame(zlib.compress(pickle.dumps(Evil(str(marker)), protocol=2))))
            t0 = time.monotonic()
            while not marker.exists() and time.monotonic() - t0 < 10:
                time.sleep(0.02)
        assert marker.exists()  # remote code execution
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # utility message, no secret
            s.sendall(frame(zlib.compress(pickle.dumps(["status"], protocol=2))))
            n = struct.unpack("i", s.recv(4))[0]
            assert n > 0  # the status was served to a stranger
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


async def test_2_our_port_refuses_crafted_pickles_strangers_and_binds_the_address(tmp_path):
    cl = Cluster(str(tmp_path))
    cl.start_all()
    try:
        await cl.wait_leader()
        port = int(cl.addrs[0].rsplit(":", 1)[1])
        assert listening_address(port) == "127.0.0.1"
        marker = tmp_path / "pwned"
        evil = zlib.compress(pickle.dumps(Evil(str(marker)), protocol=2))
        secret = open(cl.secret_file).read().strip()
        enc = getEncryptor(secret)
        for payload in [evil,  # no secret: Fernet refuses it before anything is decoded
                        enc.encrypt_at_time(evil, 10**9),  # with the secret: the plain-data unpickler refuses
                        zlib.compress(pickle.dumps(["status"], protocol=2))]:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(frame(payload))
                assert s.recv(4) == b""  # dropped, nothing answered
        assert not marker.exists()
        assert (await cl.client(0).txn(ops=[Put("still", b"up")]))["committed"]
    finally:
        cl.stop_all()


def test_2_plain_data_codec():
    msg = {"type": "append_entries", "entries": [(b"\x00cmd", 5, 2)], "s": {1, 2}, "f": 1.5, "n": None}
    assert plain_loads(plain_dumps(msg)) == msg
    for evil in [pickle.dumps(Evil("/tmp/x"), protocol=p) for p in (0, 2, 5)] + [pickle.dumps(os.system)]:
        with pytest.raises(pickle.UnpicklingError, match="refused global"):
            plain_loads(evil)


def test_2_a_secret_is_required(tmp_path):
    with pytest.raises(Exception, match="secret"):
        RaftCatalog(["127.0.0.1:1"], "127.0.0.1:1", str(tmp_path), "")


# -- 3. journal without dump ----------------------------------------------------------------------

def test_3_stock_journal_without_dump_loses_data_after_compaction(tmp_path):
    got = stock("compaction_restart", tmp_path)
    assert got["before"] == 51 and got["after_restart"] < 51


async def test_3_ours_keeps_everything_across_compaction_and_restart(tmp_path):
    c = await single(tmp_path, tuning={"logCompactionMinEntries": 10})
    for i in range(51):
        await c.txn(ops=[Put(f"k{i}", b"x")])
    assert len(c.replica().journal) < 51  # compacted
    await c.close()
    await _reopened_holds_all_51(c)


async def _reopened_holds_all_51(closed: RaftCatalog) -> None:
    """The catalog's directory opened again holds every one of the 51 acknowledged puts."""
    c = RaftCatalog(closed.members, closed.self_addr, closed.path, SECRET)
    await c.open()
    try:
        assert await c.revision() == 51 and len(await c.scan("k")) == 51
    finally:
        await c.close()

async def test_3_a_dump_newer_than_the_journal_loses_nothing(tmp_path, monkeypatch):
    """The node stops (or is killed) after a background dump replaced dump.trd but before
    pysyncobj heard of it and compacted the journal: the journal then starts before the dump's
    entries. pysyncobj clears such a journal down to the dump's two entries, which dropped every
    acknowledged entry after the dump; the replica aligns the journal to the dump first."""
    real = Replica._dump_status

    def never_reports_success(self):
        st = real(self)
        return SERIALIZER_STATE.SERIALIZING if st == SERIALIZER_STATE.SUCCESS else st

    c = await single(tmp_path, tuning={"logCompactionMinEntries": 10})
    monkeypatch.setattr(Replica, "_dump_status", never_reports_success)
    for i in range(51):
        await c.txn(ops=[Put(f"k{i}", b"x")])
    dump_thread = c.replica()._dump_thread
    if dump_thread is not None:
        dump_thread.join(10)
    await c.close()
    monkeypatch.setattr(Replica, "_dump_status", real)
    await _reopened_holds_all_51(c)

# -- 4. exceptions in the state machine ---------------------------------------------------------------

def test_4_stock_exception_wedges_the_replica(tmp_path):
    got = stock("exception_wedges", tmp_path)
    assert got["first"] == 1 and str(got["after_boom"]).startswith("error") and got["n"] == 1


async def test_4_bad_entries_are_error_values_and_the_cluster_goes_on(tmp_path):
    cl = Cluster(str(tmp_path))
    cl.start_all()
    try:
        lead = await cl.wait_leader()
        for raw in [b"\x01garbage", b"\x09", encode_txn([], [Put("", b"x")], "r")]:
            got = await cl.client(lead).call("raw_entry", payload=base64.b64encode(raw).decode())
            assert got.startswith("EntryError(")
        for i in range(3):
            assert (await cl.client(i).txn(ops=[Put(f"after{i}", b"1")]))["committed"]
        await cl.client(0).call("revision")  # barrier: all replicas keep applying
        revs = [await cl.client(i).call("revision") for i in range(3)]
        assert revs == [3, 3, 3]
    finally:
        cl.stop_all()


def test_4_apply_entry_never_raises():
    st = CatalogState()
    for payload in [b"", None, b"\x01", b"\x01\xff\xff", bytes([BARRIER]), b"\x01" + os.urandom(64),
                    encode_txn([Check("k", 0)], [Put("k", b"v")], "x" * 65)]:
        apply_entry(st, payload)
    assert st.revision == 0
    assert apply_entry(st, encode_txn([Check("k", 0)], [Put("k", b"v")], "ok")).committed


# -- 5. unknown outcomes ---------------------------------------------------------------------------------

def test_5_stock_timeout_is_applied_and_a_retry_applies_twice(tmp_path):
    got = stock("timeout_applies", tmp_path)
    assert got["timed_out"] and got["n"] == 3 and got["intended"] == 2


async def test_5_retries_are_applied_once(tmp_path):
    # Attempts time out long before the fsync: every txn is submitted several times.
    c = await single(tmp_path, attempt_timeout=0.00005)
    try:
        rs = [await c.txn([Check("n", i)], [Put("n", b"%d" % i)], request_id=f"r{i}") for i in range(20)]
        assert all(r.committed for r in rs) and await c.revision() == 20
        entries = sum(1 for e in c.replica().journal[:] if e[0][:1] == b"\x00")
        assert entries > 20  # duplicates reached the log, the state machine applied each id once
    finally:
        await c.close()


async def test_5_a_timed_out_txn_is_found_by_its_id(tmp_path):
    c = await single(tmp_path)
    try:
        await c.txn(ops=[Put("warm", b"")])  # a leader is known
        # the replica's thread is held, so the submission waits in its queue past the deadline
        # however fast or loaded the machine (a bare short timeout raced the commit)
        gate = threading.Event()
        c.replica().post(lambda: gate.wait(60))
        c.timeout, c.attempt_timeout = 0.2, 0.05
        try:
            with pytest.raises(CatalogTimeoutError) as ei:
                await c.txn(ops=[Put("t", b"1")], request_id="maybe")
        finally:
            gate.set()
        assert ei.value.request_id == "maybe"
        c.timeout, c.attempt_timeout = 10.0, 2.0
        first = await c.outcome("maybe")
        assert first is not None and first.committed  # it did commit
        assert await c.txn(ops=[Put("t", b"1")], request_id="maybe") == first
        assert await c.revision() == 2
    finally:
        await c.close()


# -- 6. entry and frame sizes ---------------------------------------------------------------------------

def test_6_stock_chunked_entry_breaks_followers(tmp_path):
    got = stock("big_entry", tmp_path, 3)
    assert got["n_failures"] > 0, got  # followers fail while decoding the chunked entry


async def test_6_big_entries_are_refused_and_frames_capped(tmp_path):
    c = await single(tmp_path)
    try:
        checks = [Check(f"{i:03d}" + "k" * 497, 0) for i in range(200)]  # valid txn, ~100 KB entry
        with pytest.raises(InvalidTransactionError, match="encodes to"):
            await c.txn(checks, [Put("x", b"1")])
        assert await c.revision() == 0
        port = int(c.self_addr.rsplit(":", 1)[1])
        for n in (2**31 - 1, -5, (1 << 20) + 1):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(struct.pack("i", n) + b"x" * 1000)
                assert s.recv(4) == b""  # dropped at once, nothing buffered
        assert (await c.txn(ops=[Put("x", b"1")])).committed
    finally:
        await c.close()


def test_6_coalesce_merges_only_what_is_equivalent():
    ae = lambda prev, ents, term=1, ci=0: {"type": "append_entries", "term": term, "commit_index": ci,  # noqa: E731
                                           "prevLogIdx": prev, "prevLogTerm": 1, "entries": ents}
    e = lambda i: (b"x" * 10, i, 1)  # noqa: E731
    resp = {"type": "apply_command_response", "request_id": 1, "log_idx": 5, "log_term": 1}
    out = coalesce([ae(4, [e(5)]), resp, ae(5, [e(6)], ci=3), ae(9, [e(10)])])
    assert out[0] == resp and len(out) == 3
    assert out[1]["prevLogIdx"] == 4 and [x[1] for x in out[1]["entries"]] == [5, 6] and out[1]["commit_index"] == 3
    big = [ae(i, [(b"x" * 40000, i + 1, 1)]) for i in range(3)]
    assert len(coalesce(big)) == 3  # never over the batch size
    ack = lambda n, ok=True, reset=False: {"type": "next_node_idx", "next_node_idx": n, "success": ok,  # noqa: E731
                                           "reset": reset}
    assert coalesce([ack(3), ack(5), ack(2, False, True), ack(7)]) == [ack(5), ack(2, False, True), ack(7)]


# -- 7. torn reads ------------------------------------------------------------------------------------------

class PausingDict(dict):
    """Blocks the writer inside a multi-key apply, after its first key, until released."""

    def __init__(self, *a):
        super().__init__(*a)
        self.armed, self.paused, self.release = False, threading.Event(), threading.Event()

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        if self.armed:
            self.armed = False
            self.paused.set()
            self.release.wait(10)


def _two_key_txn(rid):
    return encode_txn([], [Put("a", rid.encode()), Put("b", rid.encode())], rid)


def test_7_unlocked_reads_are_torn():
    st = CatalogState()
    st.apply([], [Put("a", b"0"), Put("b", b"0")])
    st._data = PausingDict(st._data)
    st._data.armed = True
    t = threading.Thread(target=apply_entry, args=(st, _two_key_txn("1")))
    t.start()
    st._data.paused.wait(10)
    torn = {e.key: e.value for e in st.scan()}  # how pysyncobj's local reads look at state
    st._data.release.set()
    t.join()
    assert torn == {"a": b"1", "b": b"0"}


async def test_7_replica_reads_hold_the_apply_lock(tmp_path):
    c = await single(tmp_path)
    try:
        await c.txn(ops=[Put("a", b"0"), Put("b", b"0")])
        rep: Replica = c.replica()
        d = PausingDict(rep.state._data)
        rep.state._data = d
        d.armed = True
        t = threading.Thread(target=rep._apply, args=(_two_key_txn("1"),), kwargs={"_doApply": True})
        t.start()  # exactly what the tick thread does for a committed entry
        d.paused.wait(10)
        got = {}
        # the read path of get/scan/stale reads, from another thread than the applier
        reader = threading.Thread(target=lambda: got.update({e.key: e.value for e in rep.read(lambda st: st.scan())}))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive()  # waits for the apply instead of reading half of it
        d.release.set()
        reader.join()
        t.join()
        assert got == {"a": b"1", "b": b"1"}
    finally:
        await c.close()


# -- 8. speed and the event loop ---------------------------------------------------------------------------

async def test_8_event_loop_keeps_running_while_a_txn_waits(tmp_path):
    """No quorum (partners never started): the txn waits out its deadline without blocking the loop."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    c = RaftCatalog(addrs, addrs[0], str(tmp_path / "n0"), SECRET, timeout=1.0, quorum_grace=30)
    await c.open()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.ensure_future(ticker())
    try:
        with pytest.raises(Exception, match="unavailable"):
            await c.txn(ops=[Put("x", b"1")])
        assert ticks >= 10
    finally:
        t.cancel()
        await c.close()


async def test_8_tuned_configuration_is_in_force(tmp_path):
    c = await single(tmp_path)
    try:
        conf = c.replica().conf
        assert conf.appendEntriesUseBatch is False and conf.autoTick is False
        assert conf.connectionRetryTime <= 0.5 and conf.leaderFallbackTimeout <= 2
        assert conf.bindAddress == c.self_addr and conf.password
        assert conf.fullDumpFile and conf.journalFile is c.replica().journal
    finally:
        await c.close()


def test_stock_file_journal_is_what_we_replace(tmp_path):
    # The stock journal takes a path and writes through mmap: the interface we implement.
    j = FileJournal(str(tmp_path / "j"))
    j.add(b"\x00x", 1, 1)
    assert j[0] == (b"\x00x", 1, 1)
    j._destroy()


def test_group_entries_apply_in_order_like_separate_entries():
    """Concurrent txns share one entry (GROUP); each is applied, deduplicated and answered alone."""
    from catalog.raft.replica import encode_group

    a, b = CatalogState(), CatalogState()
    txns = [encode_txn([Check("k", 0)], [Put("k", b"1")], "r1"),
            encode_txn([Check("k", 0)], [Put("k", b"2")], "r2"),  # conflicts with r1
            encode_txn([], [Put("j", b"3")], "r3"),
            encode_txn([Check("k", 0)], [Put("k", b"1")], "r1")]  # a retry of r1
    got = apply_entry(a, encode_group(txns))
    assert got == [apply_entry(b, t) for t in txns]
    assert [r.committed for r in got] == [True, False, True, True] and got[3] == got[0]
    assert a.scan() == b.scan() and a.revision == 2
    bad = apply_entry(a, encode_group([b"\x02"]))  # a barrier is not a txn: the whole entry is refused
    assert type(bad).__name__ == "EntryError" and a.revision == 2


def test_followers_truncate_only_on_a_conflict():
    """pysyncobj cuts a follower's log after prevLogIdx whenever the log is longer, even for
    entries it already holds (re-sends after a stale ack): acknowledged entries past the
    message vanish. skip_known_entries keeps Raft's rule: only a conflicting entry cuts."""
    from catalog.raft.wire import skip_known_entries

    log = [(b"c%d" % i, i, 1 if i < 5 else 2) for i in range(3, 11)]  # indexes 3..10, term 2 from 5
    ae = lambda prev, ents, term=2: {"type": "append_entries", "term": term, "commit_index": 4,  # noqa: E731
                                     "prevLogIdx": prev, "prevLogTerm": 1, "entries": ents}
    # a re-send of 5..7 while 8..10 (leader's term) are held: heartbeat at the end of the log
    m = skip_known_entries(log, ae(4, log[2:5]))
    assert (m["prevLogIdx"], m["prevLogTerm"], m["entries"]) == (10, 2, [])
    # new entries after known ones: only the new ones, after the last known
    new = [(b"n11", 11, 2)]
    m = skip_known_entries(log, ae(8, log[6:8] + new))
    assert (m["prevLogIdx"], m["entries"]) == (10, new)
    # a conflict at 9 (a new leader of term 3): cut from 9, as Raft says
    conflict = [(b"x9", 9, 3), (b"x10", 10, 3)]
    m = skip_known_entries(log, ae(7, [log[5]] + conflict, term=3))
    assert (m["prevLogIdx"], m["prevLogTerm"], m["entries"]) == (8, 2, conflict)
    # entries before the journal start are in the dump (committed): known
    m = skip_known_entries(log, ae(0, [(b"a", 1, 1), (b"b", 2, 1)] + log[:2]))
    assert m["prevLogIdx"] == 10 and m["entries"] == []
    # nothing known: untouched
    m0 = ae(10, new)
    assert skip_known_entries(log, m0) is m0
