"""Skipping segments by their cluster range (docs/rfcs/0009-gc.md): a copy written in
cluster order records the range of its ``cluster_by`` column (footer and catalog row); a
query drops every candidate row of a segment whose range its bbox or range terms miss."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rowstore.reads.predicates import BBox, Term
from rowstore.segments.sealed import CLUSTER_BOX, ClusterRange


def misses(cluster: ClusterRange | None, terms: list[Term], box: BBox | None) -> bool:
    """Whether no row of a segment with cluster range ``cluster`` ((kind, column id, lo...,
    hi...), or None: unknown) can match the bbox and the terms."""
    if not cluster:
        return False
    kind, cid = cluster[0], cluster[1]
    if kind == CLUSTER_BOX:
        xmin, ymin, xmax, ymax = cluster[2:6]
        return box is not None and box.column.id == cid and (
            box.xmax < xmin or box.xmin > xmax or box.ymax < ymin or box.ymin > ymax)
    lo, hi = cluster[2], cluster[3]
    for t in terms:
        if t.column.id != cid or isinstance(t.value, (bytes, str, bool)) or t.value is None:
            continue
        v = t.value
        if (t.op == "=" and (v < lo or v > hi)) or (t.op == "<" and lo >= v) or (t.op == "<=" and lo > v) \
                or (t.op == ">" and hi <= v) or (t.op == ">=" and hi < v):
            return True
    return False


def segments_of(rowids: np.ndarray) -> list[int]:
    segids: list[int] = np.unique((np.asarray(rowids, np.uint64) >> np.uint64(32)).astype(np.uint32)).tolist()
    return segids


def keep_mask(rowids: np.ndarray, clusters: Mapping[int, ClusterRange | None], terms: list[Term],
              box: BBox | None) -> np.ndarray | None:
    """Which ``rowids`` are in segments whose cluster range the query may hit (None: all)."""
    if len(rowids) == 0 or (box is None and not terms):
        return None
    segs = (np.asarray(rowids, np.uint64) >> np.uint64(32)).astype(np.uint32)
    skip = [s for s in np.unique(segs).tolist() if misses(clusters.get(s), terms, box)]
    if not skip:
        return None
    return ~np.isin(segs, np.array(skip, np.uint32))
