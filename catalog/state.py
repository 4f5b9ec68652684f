"""The catalog's deterministic state machine, shared by every backend.

Pure and deterministic: the same transactions in the same order give the
same state on every replica. ``apply`` never raises (an exception inside a
replicated method would wedge every Raft replica, RFC 0005); malformed
transactions are refused earlier by :func:`validate_txn`.
"""
from __future__ import annotations

import struct
from bisect import bisect_left, insort
from collections import OrderedDict
from typing import Sequence

from catalog.abc import (
    MAX_KEY_BYTES,
    MAX_REQUEST_ID,
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Check,
    Delete,
    Entry,
    Op,
    Put,
    TxnResult,
)
from catalog.checksum import crc32c
from catalog.errors import CatalogCorruptionError, InvalidTransactionError

DEDUP_CAPACITY = 100_000
SNAP_MAGIC = b"TRKVSNAP"  # part of the format (docs/format/catalog-log.md)
SNAP_VERSION = 1


def validate_txn(checks: Sequence[Check], ops: Sequence[Op], request_id: str | None) -> None:
    """Refuse a malformed transaction before it reaches any state machine."""
    if len(checks) + len(ops) > MAX_TXN_OPS:
        raise InvalidTransactionError(f"transaction has {len(checks) + len(ops)} parts; max {MAX_TXN_OPS}")
    if request_id is not None and (not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID):
        raise InvalidTransactionError(f"request id must be 1..{MAX_REQUEST_ID} characters")
    total, written = 0, set()
    for c in checks:
        _check_key(c.key)
        if not isinstance(c.version, int) or c.version < 0:
            raise InvalidTransactionError(f"check on {c.key!r}: version must be an int >= 0")
    for op in ops:
        if not isinstance(op, (Put, Delete)):
            raise InvalidTransactionError(f"unknown operation {op!r}")
        total += _check_key(op.key)
        if op.key in written:
            raise InvalidTransactionError(f"key {op.key!r} is written twice in one transaction")
        written.add(op.key)
        if isinstance(op, Put):
            if not isinstance(op.value, (bytes, bytearray)):
                raise InvalidTransactionError(f"value of {op.key!r} must be bytes")
            if len(op.value) > MAX_VALUE_BYTES:
                raise InvalidTransactionError(f"value of {op.key!r} is {len(op.value)} bytes; max {MAX_VALUE_BYTES}")
            total += len(op.value)
    if total > MAX_TXN_BYTES:
        raise InvalidTransactionError(f"transaction writes {total} bytes; max {MAX_TXN_BYTES}")


def _check_key(key: object) -> int:
    if not isinstance(key, str) or not key or "\x00" in key:
        raise InvalidTransactionError(f"key {key!r} must be a non-empty string without NUL")
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidTransactionError(f"key {key!r} is not valid UTF-8") from None
    if n > MAX_KEY_BYTES:
        raise InvalidTransactionError(f"key of {n} bytes; max {MAX_KEY_BYTES}")
    return n


class CatalogState:
    """Keys in UTF-8 order (= code point order of Python strings), versions, outcomes."""

    def __init__(self, dedup_capacity: int = DEDUP_CAPACITY):
        self.revision = 0
        self._data: dict[str, tuple[bytes, int]] = {}
        self._keys: list[str] = []
        self._outcomes: OrderedDict[str, TxnResult] = OrderedDict()
        self._cap = dedup_capacity

    def copy(self) -> "CatalogState":
        """A snapshot-able copy, in C-level copies (entries and results are immutable)."""
        c = CatalogState(self._cap)
        c.revision, c._data, c._keys = self.revision, dict(self._data), list(self._keys)
        c._outcomes = OrderedDict(self._outcomes)
        return c

    # -- reads ---------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        hit = self._data.get(key)
        return Entry(key, hit[0], hit[1]) if hit else None

    def version(self, key: str) -> int:
        hit = self._data.get(key)
        return hit[1] if hit else 0

    def scan(self, prefix: str = "", start: str | None = None, end: str | None = None,
             limit: int | None = None, reverse: bool = False) -> list[Entry]:
        lo = max(prefix, start) if start is not None else prefix
        i = bisect_left(self._keys, lo)
        j = i
        keys = self._keys
        while j < len(keys) and keys[j].startswith(prefix) and (end is None or keys[j] < end):
            j += 1
        sel = keys[i:j]
        if reverse:
            sel = sel[::-1]
        if limit is not None:
            sel = sel[:limit]
        return [Entry(k, *self._data[k]) for k in sel]

    def outcome(self, request_id: str) -> TxnResult | None:
        return self._outcomes.get(request_id)

    def __len__(self) -> int:
        return len(self._keys)

    # -- writes ----------------------------------------------------------------------

    def conflicts(self, checks: Sequence[Check], overlay: dict[str, int] | None = None) -> tuple[str, ...]:
        """Keys whose check fails; ``overlay`` holds versions written earlier in a group."""
        bad = []
        for c in checks:
            v = overlay[c.key] if overlay and c.key in overlay else self.version(c.key)
            if v != c.version:
                bad.append(c.key)
        return tuple(bad)

    def apply(self, checks: Sequence[Check], ops: Sequence[Op], request_id: str | None = None) -> TxnResult:
        """Run one (validated) transaction. Never raises."""
        if request_id is not None and request_id in self._outcomes:
            return self._outcomes[request_id]
        bad = self.conflicts(checks)
        if bad:
            res = TxnResult(False, self.revision, bad, request_id)
        else:
            self.write(ops, self.revision + 1)
            res = TxnResult(True, self.revision, (), request_id)
        self.remember(res)
        return res

    def write(self, ops: Sequence[Op], revision: int) -> None:
        """Apply ops as ``revision`` (the next one); used by apply and by log replay."""
        for op in ops:
            if isinstance(op, Put):
                if op.key not in self._data:
                    insort(self._keys, op.key)
                self._data[op.key] = (bytes(op.value), revision)
            elif op.key in self._data:
                del self._data[op.key]
                del self._keys[bisect_left(self._keys, op.key)]
        self.revision = revision

    def remember(self, res: TxnResult) -> None:
        if res.request_id is None:
            return
        self._outcomes[res.request_id] = res
        self._outcomes.move_to_end(res.request_id)
        while len(self._outcomes) > self._cap:
            self._outcomes.popitem(last=False)

    # -- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> bytes:
        out = bytearray(SNAP_MAGIC + struct.pack("<HQQ", SNAP_VERSION, self.revision, len(self._keys)))
        for k in self._keys:
            v, ver = self._data[k]
            kb = k.encode()
            out += struct.pack("<H", len(kb)) + kb + struct.pack("<QI", ver, len(v)) + v
        out += struct.pack("<Q", len(self._outcomes))
        for rid, r in self._outcomes.items():
            rb = rid.encode()
            out += struct.pack("<H", len(rb)) + rb + struct.pack("<BQH", r.committed, r.revision, len(r.conflicts))
            for c in r.conflicts:
                cb = c.encode()
                out += struct.pack("<H", len(cb)) + cb
        out += struct.pack("<I", crc32c(bytes(out)))
        return bytes(out)

    @classmethod
    def restore(cls, raw: bytes, where: str, dedup_capacity: int = DEDUP_CAPACITY) -> "CatalogState":
        if len(raw) < 30 or raw[:8] != SNAP_MAGIC:
            raise CatalogCorruptionError(where, 0, "bad snapshot magic")
        if crc32c(raw[:-4]) != struct.unpack_from("<I", raw, len(raw) - 4)[0]:
            raise CatalogCorruptionError(where, len(raw) - 4, "snapshot checksum mismatch")
        ver, rev, n = struct.unpack_from("<HQQ", raw, 8)
        if ver != SNAP_VERSION:
            raise CatalogCorruptionError(where, 8, f"unsupported snapshot version {ver}")
        st = cls(dedup_capacity)
        st.revision, pos = rev, 26
        try:
            for _ in range(n):
                (kl,) = struct.unpack_from("<H", raw, pos)
                k = raw[pos + 2 : pos + 2 + kl].decode()
                ver_k, vl = struct.unpack_from("<QI", raw, pos + 2 + kl)
                pos += 14 + kl
                st._data[k] = (raw[pos : pos + vl], ver_k)
                st._keys.append(k)
                pos += vl
                if ver_k > rev:
                    raise CatalogCorruptionError(where, pos, f"entry {k!r} is newer than the snapshot")
            (m,) = struct.unpack_from("<Q", raw, pos)
            pos += 8
            for _ in range(m):
                (rl,) = struct.unpack_from("<H", raw, pos)
                rid = raw[pos + 2 : pos + 2 + rl].decode()
                ok, r_rev, nc = struct.unpack_from("<BQH", raw, pos + 2 + rl)
                pos += 13 + rl
                conf = []
                for _ in range(nc):
                    (cl,) = struct.unpack_from("<H", raw, pos)
                    conf.append(raw[pos + 2 : pos + 2 + cl].decode())
                    pos += 2 + cl
                st._outcomes[rid] = TxnResult(bool(ok), r_rev, tuple(conf), rid)
        except (struct.error, UnicodeDecodeError) as e:
            raise CatalogCorruptionError(where, pos, f"malformed snapshot: {e}") from e
        if st._keys != sorted(st._keys):
            raise CatalogCorruptionError(where, 26, "snapshot keys are not sorted")
        return st
