"""Batch reads: a read plan pinned at T, one Spark partition per offloaded segment (read by
the executor straight from object storage) and one per table partition's unsealed tail
(fetched from the node as Arrow). docs/spark.md describes the whole path."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from rowstore.reads.plan import ReadPlan, SegmentSlice
from rowstore.schema import SchemaVersion
from spark_bridge.errors import BridgeError
from spark_bridge.lease import LeaseKeeper
from spark_bridge.options import Options
from spark_bridge.remote import Remote
from spark_bridge.types import decoding_schema, select_columns, spark_arrow_schema, to_spark_batch


@dataclass
class SegmentPartition(InputPartition):
    """One offloaded segment: its object and the bitmap of localids visible at T."""

    slice: SegmentSlice


@dataclass
class TailPartition(InputPartition):
    """The visible rows at T of one table partition that the plan does not send to object storage."""

    partition: int


class TerrascaleReader(DataSourceReader):
    """Made on the driver when Spark plans the DataFrame's first action (and reused by every
    later one: a DataFrame is one snapshot). The plan is made here; only what every task
    needs is kept on ``self`` (it is shipped with each task), the bitmaps travel in the
    partitions."""

    def __init__(self, opts: Options, schema: StructType, as_of: int, pinned_schema: str):
        self.opts, self.schema = opts, schema
        with Remote(opts) as r:
            plan = ReadPlan.from_json(r.plan(as_of, opts.where, opts.bbox, opts.sealed_only, opts.lease_s))
        if plan.schema.to_json() != pinned_schema:
            raise BridgeError(f"table {opts.table!r}: the plan's schema at {as_of} is not the one load() saw")
        self.as_of, self.lease, self.objects = plan.as_of, plan.lease, opts.objects or plan.objects
        self.target, self.versions = plan.schema, plan.versions
        self.encrypted = plan.encrypted
        if self.encrypted and plan.sealed and not opts.key_file:
            raise BridgeError(f"table {opts.table!r} is encrypted at rest: give option key_file (the node's "
                              f"security.encryption_key_file, readable on every executor)")
        self._sealed = list(plan.sealed)
        self.sealed_segids = plan.sealed_segids
        self._tail = list(plan.tail)

    def __getstate__(self) -> dict:
        # Spark pickles the reader (into every task) before it asks for the partitions:
        # leave the per-segment bitmaps out, they travel in their own partition.
        state = dict(self.__dict__)
        state.pop("_sealed", None)
        state.pop("_tail", None)
        return state

    def partitions(self) -> list[InputPartition]:
        parts: list[InputPartition] = [SegmentPartition(s) for s in self._sealed]
        return parts + [TailPartition(p) for p in self._tail]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        target = self.target
        keep = select_columns(target, self.opts.columns)
        names, kinds = [c.name for c in keep], [c.type for c in keep]
        arrow = spark_arrow_schema(self.schema)
        if isinstance(partition, SegmentPartition):
            source = self._segment(partition.slice, target, keep)
        elif isinstance(partition, TailPartition):
            source = self._tail_rows(partition.partition)
        else:
            return  # an empty plan: Spark still runs one task
        for b in source:
            if b.num_rows:
                yield to_spark_batch(b.select(names), kinds, arrow)

    def _tail_rows(self, partition: int) -> Iterator[pa.RecordBatch]:
        with Remote(self.opts) as r:
            t = r.tail(partition, self.as_of, self.opts.where, self.opts.bbox, self.sealed_segids)
        yield from t.to_batches(max_chunksize=65_536)

    def _segment(self, part: SegmentSlice, target: SchemaVersion, keep: list) -> Iterator[pa.RecordBatch]:
        with LeaseKeeper(self.opts, self.lease) as keeper:  # first, before the slow imports below
            from rowstore.reads.external import read_segment, schemas_lookup
            from rowstore.reads.predicates import parse_bbox, parse_where

            schemas = schemas_lookup(list(self.versions))
            # decode only the columns read and the ones the predicates need
            used = [target.by_name(t[0]) for t in self.opts.where or ()]
            used += [target.by_name(self.opts.bbox["column"])] if self.opts.bbox else []
            target = decoding_schema(target, keep + [c for c in used if c is not None])
            terms, box = parse_where(target, self.opts.where), parse_bbox(target, self.opts.bbox)
            kek = None
            if self.encrypted:
                from terrafs.crypto import KeyEncryptionKey

                kek = KeyEncryptionKey.load(self.opts.key_file)
            batches = read_segment(self.objects, part, schemas, target, terms, box, kek)
            for b in sync_iter(batches):
                keeper.check()
                yield b


def sync_iter(agen) -> Iterator:
    """Drive an async iterator from synchronous code (a Spark task) on a private event loop."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        try:
            loop.run_until_complete(agen.aclose())
        finally:
            loop.close()
