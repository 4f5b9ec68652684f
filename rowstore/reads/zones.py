"""Skipping rows without reading them. By cluster range (docs/rfcs/0009-gc.md): a copy
written in cluster order records the range of its ``cluster_by`` column (footer and catalog
row); a query drops every candidate row of a segment whose range its bbox or range terms
miss. By column statistics (docs/format/segment.md §7): a columnar segment keeps, per group
of rows and column, the null count and bounds; a query drops the rows of every group whose
statistics one of its terms (on any column) or its bbox cannot match."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rowstore.reads.predicates import BBox, Between, Term
from rowstore.segments.columnar import ColumnarSegment
from rowstore.segments.columnar_layout import HAS_MINMAX
from rowstore.segments.columnar_stats import bounds
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


def group_mask(seg: ColumnarSegment, terms: list[Term], box: BBox | None) -> np.ndarray:
    """Which groups of a columnar segment the terms and bbox may match, by each column's
    null count and bounds (docs/format/segment.md §7.2): False only where no row can."""
    keep = np.ones(seg.groups, bool)
    preds: list[Term | BBox] = [*terms, *([box] if box is not None else [])]
    for p in preds:
        for t in ([p, p.upper] if isinstance(p, Between) and p.upper is not None else [p]):
            ci = seg.index_of(t.column)
            if ci < 0:  # no row of the segment has the column: null everywhere, which nothing matches
                return np.zeros(seg.groups, bool)
            for g in np.flatnonzero(keep).tolist():
                if _chunk_misses(seg.meta.chunks[g, ci], seg.group_len(g), t):
                    keep[g] = False
    return keep


def _chunk_misses(entry: np.ndarray, rows: int, p: Term | BBox) -> bool:
    if int(entry["nulls"]) == rows:
        return True  # nulls match no term and no bbox
    if not int(entry["flags"]) & HAS_MINMAX:
        return False
    lo, hi = bounds(entry, p.column.type)
    if isinstance(p, BBox):
        return bool(p.xmax < lo[0] or p.xmin > hi[0] or p.ymax < lo[1] or p.ymin > hi[1])
    v: Any = p.value
    if isinstance(v, str):
        v = v.encode()
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, float) and v != v:
        return False  # NaN: compare nothing
    if isinstance(lo, bytes) != isinstance(v, bytes) or isinstance(lo, tuple):
        return False
    op = p.op
    return bool((op == "=" and (v < lo or v > hi)) or (op == "<" and lo >= v) or (op == "<=" and lo > v)
                or (op == ">" and hi <= v) or (op == ">=" and hi < v) or (op == "!=" and lo == hi == v))


def group_keep(rowids: np.ndarray, segs: Mapping[int, ColumnarSegment], terms: list[Term],
               box: BBox | None) -> np.ndarray | None:
    """Which ``rowids`` lie in groups of columnar segments the query may match (None: all)."""
    if len(rowids) == 0 or (box is None and not terms) or not segs:
        return None
    ids = np.asarray(rowids, np.uint64)
    seg_of = (ids >> np.uint64(32)).astype(np.uint32)
    keep = np.ones(len(ids), bool)
    for segid, seg in segs.items():
        mask = group_mask(seg, terms, box)
        if mask.all():
            continue
        sel = seg_of == segid
        groups = (ids[sel] & np.uint64(0xFFFFFFFF)).astype(np.int64) // seg.meta.group_rows
        keep[sel] = mask[np.minimum(groups, len(mask) - 1)]
    return None if keep.all() else keep
