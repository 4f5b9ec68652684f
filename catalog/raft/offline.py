"""A Raft replica's catalog read offline from its files (``terrascale fsck``), read-only.

Reads ``meta.trm``, ``dump.trd`` and the newest ``journal-*.trj`` of a stopped node's
``[catalog] dir`` (layout: docs/format/raft-journal.md), verifies every checksum and
the index chain from the dump into the journal, and rebuilds the catalog state the
replica would hold after applying every entry it has: the dump's state, then each
journal entry after it, through the same ``apply_entry`` the live replica runs.

Entries after the saved commit index may be uncommitted (the index is saved once a
second, so most of them are committed). ``named_files`` therefore collects every file
row any of them puts, so an object such an entry names is never taken for an orphan.
Nothing is written: a torn journal tail is reported, not cut.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from catalog.abc import Check, Op, Put, TxnResult
from catalog.errors import CatalogCorruptionError, CatalogUnavailableError
from catalog.fsutil import lock_dir
from catalog.memory import StateReads
from catalog.raft.journal import JournalEntry, decode_dump, journal_files, parse_journal, parse_meta
from catalog.raft.replica import GROUP, TXN, EntryError, _split_group, apply_entry, decode_txn
from catalog.raft.wire import plain_loads
from catalog.state import CatalogState

REGULAR, NO_OP, MEMBERSHIP, VERSION = 0, 1, 2, 3  # pysyncobj's command types (part of the format)


@dataclass
class ReplicaFiles:
    """What a replica's directory holds, decoded."""

    path: str
    state: CatalogState
    term: int = 0
    vote: str | None = None
    commit_index: int = 0
    dump_index: int = 0          # last entry covered by the dump (0: no dump)
    last_index: int = 0
    last_term: int = 0
    members: list[str] = field(default_factory=list)
    torn_tail: tuple[str, int] | None = None
    refused: int = 0             # entries the state machine refused (deterministic, not damage)
    uncommitted_puts: list[tuple[str, bytes]] = field(default_factory=list)  # after commit_index

    def summary(self) -> str:
        return (f"replica {self.path}: term {self.term}, last entry {self.last_index} (term {self.last_term}), "
                f"commit index {self.commit_index} (saved), dump at {self.dump_index}, "
                f"members {','.join(self.members) or '-'}")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_replica(path: str, members: Sequence[str] = ()) -> ReplicaFiles:
    """Decode and check a replica's files; CatalogCorruptionError names file and offset.

    ``members``: the cluster at the first entry (the URI's), unless a dump says otherwise."""
    if not os.path.isdir(path):
        raise CatalogUnavailableError(f"{path}: no Raft catalog directory")
    meta = os.path.join(path, "meta.trm")
    term, vote, commit = parse_meta(_read(meta), meta) if os.path.exists(meta) else (0, None, 0)
    out = ReplicaFiles(path, CatalogState(), term, vote, commit, members=list(members))
    dump = os.path.join(path, "dump.trd")
    if os.path.exists(dump):
        last, _prev, members, st = decode_dump(_read(dump), dump)
        out.state = CatalogState.restore(st, dump)
        out.dump_index, out.last_index, out.last_term, out.members = last[1], last[1], last[2], list(members)
    files = journal_files(path)
    if not files:
        if out.dump_index == 0 and commit > 1:
            raise CatalogCorruptionError(path, None, f"no journal and no dump, but meta says commit index {commit}")
        return out
    gen, name = files[-1]
    where = os.path.join(path, name)
    entries, offsets, torn = parse_journal(_read(where), where, gen)
    if torn is not None:
        out.torn_tail = (where, torn[0])
    out.commit_index = max(commit, out.dump_index)
    _apply_journal(out, where, entries, offsets)
    return out


def _apply_journal(out: ReplicaFiles, where: str, entries: list[JournalEntry], offsets: list[int]) -> None:
    if entries and entries[0][1] > out.dump_index + 1:
        raise CatalogCorruptionError(where, offsets[0], f"journal starts at index {entries[0][1]}, after "
                                     f"the dump's {out.dump_index}: entries are missing")
    for (cmd, idx, term), off in zip(entries, offsets):
        if idx <= out.dump_index:
            continue  # in the dump already (pysyncobj keeps the dump's last two entries)
        _apply_command(out, cmd, idx, where, off)
        out.last_index, out.last_term = idx, term


def _apply_command(out: ReplicaFiles, cmd: bytes, idx: int, where: str, off: int) -> None:
    if not cmd:
        raise CatalogCorruptionError(where, off, f"entry {idx} is empty")
    kind = cmd[0]
    if kind in (NO_OP, VERSION):
        return
    try:
        data = plain_loads(cmd[1:])
    except Exception as e:  # checksummed but undecodable: damage
        raise CatalogCorruptionError(where, off, f"entry {idx}: undecodable command: {e}") from e
    if kind == MEMBERSHIP:
        if isinstance(data, list) and len(data) >= 2 and data[0] in ("add", "rem"):
            addr = data[1]
            if data[0] == "add" and addr not in out.members:
                out.members.append(addr)
            elif data[0] == "rem" and addr in out.members:
                out.members.remove(addr)
        return
    if kind != REGULAR or not isinstance(data, tuple) or len(data) != 2 or len(data[1]) != 1:
        raise CatalogCorruptionError(where, off, f"entry {idx}: not a catalog command")
    payload = data[1][0]
    if idx > out.commit_index:
        out.uncommitted_puts += _puts(payload)
    res = apply_entry(out.state, payload)
    results = res if isinstance(res, list) else [res]
    out.refused += sum(isinstance(r, EntryError) for r in results)


def _puts(payload: object) -> list[tuple[str, bytes]]:
    if not isinstance(payload, bytes) or not payload or payload[0] not in (TXN, GROUP):
        return []
    try:
        txns = _split_group(payload) if payload[0] == GROUP else [payload]
        return [(op.key, op.value) for t in txns for op in decode_txn(t)[1] if isinstance(op, Put)]
    except Exception:  # noqa: BLE001 - refused by the state machine too; names nothing
        return []


class OfflineRaftCatalog(StateReads):
    """The replica's rebuilt state as a read-only Catalog; holds the directory's LOCK."""

    def __init__(self, path: str, uri: str):
        self.path, self.uri = path, uri
        self.files: ReplicaFiles | None = None
        self._lock_fd = -1

    def _st(self) -> CatalogState:
        if self.files is None:
            raise CatalogUnavailableError(f"{self.uri} is not open")
        return self.files.state

    @property
    def torn_tail(self) -> tuple[str, int] | None:
        return self.files.torn_tail if self.files else None

    async def open(self) -> None:
        if not os.path.isdir(self.path):
            raise CatalogUnavailableError(f"{self.path}: no Raft catalog directory")
        self._lock_fd = lock_dir(self.path, f"{self.uri}: {self.path} is open in another process "
                                            "(stop the node first)")
        try:
            from catalog.raft.catalog import parse_raft_uri

            self.files = read_replica(self.path, parse_raft_uri(self.uri)[0])
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    async def txn(self, checks: Sequence[Check] = (), ops: Sequence[Op] = (), *,
                  request_id: str | None = None) -> TxnResult:
        raise CatalogUnavailableError(f"{self.uri}: opened offline, read-only")
