"""`terrascale fsck --config` on the data dirs of a real 3-process Raft cluster: the replica's
journal is read offline, every segment, index run and object it names is checked, orphans
are listed, `--repair` removes only them, and damaged journal bytes are a clear error."""
import os
import subprocess

import pytest

from bench.node_proc import TERRASCALE, raft_cluster, start_all


def fsck(node, *args):
    return subprocess.run([TERRASCALE, "fsck", "--config", str(node.config), *args],
                          capture_output=True, text=True, timeout=120)


def objects(root):
    d = root / "objects" / "files"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A cluster that took rows, sealed, offloaded and checkpointed (index runs), then stopped."""
    root = tmp_path_factory.mktemp("fsckraft")
    nodes = raft_cluster(root, 3, extra='[tables]\npartitions = 2\n')
    try:
        start_all(nodes)
        with nodes[0].client() as c:
            c.create_table("t", [("id", "int64"), ("name", "string"), ("v", "float64")], "id", indexes=["name"])
            for k in range(3):
                c.upsert("t", [{"id": i, "name": f"n{i % 7}", "v": i / 3} for i in range(k * 500, k * 500 + 500)])
            owner = c.cluster()["partitions"]["t"]["0"]
        owner = next(n for n in nodes if n.node_id == owner)
        with owner.client() as c:
            c.admin("checkpoint")
            c.admin("seal")
            assert c.admin("offload")
            c.upsert("t", [{"id": 9999, "name": "tail", "v": 1.0}])  # an active segment too
        yield root, nodes, owner
    finally:
        for n in nodes:
            n.ensure_stopped()


def test_fsck_refuses_a_running_node_then_checks_every_stopped_replica(cluster):
    root, nodes, owner = cluster
    r = fsck(owner)
    assert r.returncode == 1 and "stop the node first" in r.stderr, r.stdout + r.stderr
    # the owner stops last, so its replica holds every catalog entry: the other nodes lead
    # partitions too (RFC 0010) and checkpoint them as they stop; a replica stopped before
    # that would not know those runs and list them as orphans
    for n in sorted(nodes, key=lambda n: n is owner):
        rc, log = n.stop()
        assert rc == 0, log
    named = objects(root)
    assert len(named) >= 3  # offloaded segments, key-index and column-index runs
    for n in nodes:
        r = fsck(n)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "event=fsck_raft" in r.stderr and "damage" not in r.stdout
        assert "0 problem(s)" in r.stderr
        if n is owner:  # its partitions' key and column runs were read entry by entry
            assert int(r.stderr.split("event=fsck_index_runs checked=")[1].split()[0]) >= 2


def test_orphans_listed_and_repair_removes_only_them(cluster):
    root, nodes, owner = cluster
    named = objects(root)
    orphan = root / "objects" / "files" / "0fffffff-0000000000000001.tfs"
    orphan.write_bytes(os.urandom(300))
    r = fsck(owner)
    assert r.returncode == 0 and f"notice trfs://{orphan}" in r.stdout and "orphan" in r.stdout, r.stdout + r.stderr
    assert orphan.exists()  # without --repair nothing changes
    r = fsck(owner, "--repair")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    listed = next(i for i, ln in enumerate(lines) if ln.startswith(f"notice trfs://{orphan}"))
    removed = lines.index(f"repair: removed trfs://{root}/objects/files/{orphan.name}")
    assert listed < removed  # printed before it was deleted
    assert not orphan.exists() and objects(root) == named  # every named object is still there
    assert "repair: no orphans" in fsck(owner, "--repair").stdout


def test_repair_refused_while_another_member_runs(cluster):
    root, nodes, owner = cluster
    other = next(n for n in nodes if n is not owner)
    orphan = root / "objects" / "files" / "0ffffffe-0000000000000001.tfs"
    orphan.write_bytes(b"x" * 10)
    start_all([n for n in nodes if n is not owner])  # two of three: a quorum without the owner
    try:
        r = fsck(owner, "--repair")
        assert r.returncode == 1 and "stop every node first" in r.stderr and other.raft_address in r.stderr
        assert orphan.exists()
    finally:
        for n in nodes:
            if n is not owner:
                n.stop()
    orphan.unlink()


def test_damaged_journal_and_object_are_named(cluster):
    root, nodes, owner = cluster
    journal = sorted((owner.data / "raft").glob("journal-*.trj"))[-1]
    raw = bytearray(journal.read_bytes())
    keep = bytes(raw)
    raw[len(raw) // 2] ^= 0x20  # inside a record that valid records follow: damage, not a torn tail
    journal.write_bytes(raw)
    try:
        r = fsck(owner)
        assert r.returncode == 1 and f"damage {journal}" in r.stdout and "offset=" in r.stdout, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        assert journal.read_bytes() == bytes(raw)  # nothing cut or rewritten
        journal.write_bytes(keep + b"TRJR\x00\x01")  # a torn, unacknowledged append: a notice, not cut
        r = fsck(owner)
        assert r.returncode == 0 and f"notice {journal}" in r.stdout and "torn tail" in r.stdout, r.stdout
        assert journal.read_bytes() == keep + b"TRJR\x00\x01"
    finally:
        journal.write_bytes(keep)
    obj = root / "objects" / "files" / objects(root)[0]
    raw = bytearray(obj.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    obj.write_bytes(raw)
    try:
        r = fsck(owner)
        assert r.returncode == 1 and str(obj) in r.stdout, r.stdout + r.stderr
    finally:
        raw[len(raw) // 3] ^= 0x01
        obj.write_bytes(raw)
    assert fsck(owner).returncode == 0
