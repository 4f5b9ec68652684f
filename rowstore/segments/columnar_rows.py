"""A columnar segment's rows re-encoded as row bytes (docs/format/segment.md §1), each in its
own schema version: what point reads of row bytes and the garbage collector take from a
version 2 segment, as they take them from a version 1 segment's rows."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from rowstore.codec.rows import Decoded, encode_rows
from rowstore.errors import ColumnCorruptionError
from rowstore.schema import SchemaVersion


def version_rows(dec: Decoded, versions: Mapping[int, SchemaVersion], where: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows decoded into the union schema re-encoded as row bytes, each in its own schema
    version (docs/format/segment.md §1), with its commit_ts and flags: (bytes, starts).
    ``versions``: the segment's schema versions; ``where`` names the segment."""
    n = dec.batch.num_rows
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for v in np.unique(dec.schema_ver).tolist():
        s = versions.get(int(v))
        if s is None:
            raise ColumnCorruptionError(where, None, f"a row names schema version {v}, which the metadata lacks")
        sel = np.flatnonzero(dec.schema_ver == v)
        enc = encode_rows(dec.batch.take(pa.array(sel)), s, 0, dec.deleted[sel])
        buf = enc.buf
        if len(sel):  # each row's own commit timestamp (encode_rows writes one for all)
            ts = dec.commit_ts[sel].astype("<u8").view(np.uint8).reshape(-1, 8)
            buf[enc.starts[:, None] + np.arange(8, 16)] = ts
        parts.append((buf, enc.starts, sel))
    if len(parts) == 1 and np.array_equal(parts[0][2], np.arange(n)):
        return parts[0][0], parts[0][1]
    lens = np.zeros(n, np.int64)
    for buf, starts, sel in parts:
        lens[sel] = np.diff(np.append(starts, len(buf)))
    out_starts = np.zeros(n, np.int64)
    np.cumsum(lens[:-1], out=out_starts[1:])
    out = np.empty(int(lens.sum()), np.uint8)
    for buf, starts, sel in parts:
        ln = np.diff(np.append(starts, len(buf)))
        idx = np.repeat(out_starts[sel] - starts, ln) + np.arange(len(buf))
        out[idx] = buf
    return out, out_starts
