"""The change feed as a Structured Streaming source: offsets are closed commit timestamps,
each micro-batch holds the changes in (previous offset, new offset] in commit order with
commit_ts and op, and a query restarted from its checkpoint delivers every change exactly
once — also when a micro-batch failed after its offsets were logged (Spark re-runs it with
the same offsets even though more changes arrived meanwhile)."""
from __future__ import annotations

import json
import os

import pytest

from tests.spark_bridge.conftest import started_node

ROWS = 300


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "spark-stream", 3)
    c = n.client()
    c.create_table("feed", [{"name": "id", "type": "int64"}, {"name": "v", "type": "float64"},
                            {"name": "name", "type": "string"}], "id")
    c.close()
    yield n
    n.stop()


def api_changes(c, after: int, upto: int) -> list[tuple]:
    t = c._call("POST", "/v1/tables/feed/changes", {"after": after, "upto": upto}, arrow=True)
    return list(zip(t.column("commit_ts").to_pylist(), t.column("id").to_pylist(), t.column("op").to_pylist(),
                    t.column("v").to_pylist()))


def write_round(c, r: int) -> int:
    """Upserts (new keys and updates), then deletes; some of it sealed and offloaded."""
    c.upsert("feed", [{"id": i, "v": float(r), "name": f"r{r}"} for i in range(r * 100, r * 100 + ROWS)])
    c.upsert("feed", [{"id": i, "v": -float(r), "name": f"r{r}u"} for i in range(r * 100, r * 100 + 50)])
    if r % 2 == 0:
        c.admin("seal")
        c.admin("offload")
    return c.delete("feed", list(range(r * 100 + 60, r * 100 + 70)))["commit_ts"]


def last_offset(checkpoint: str, batch: int) -> int:
    with open(os.path.join(checkpoint, "offsets", str(batch))) as f:
        return json.loads(f.read().strip().splitlines()[-1])["ts"]


def test_stream_restarts_from_its_checkpoint_exactly_once(spark, node, tmp_path):
    c = node.client()
    checkpoint = str(tmp_path / "ck")
    batches: dict[int, list[tuple]] = {}
    fail_batch = {1}  # the first attempt of micro-batch 1 fails after Spark logged its offsets

    def sink(df, batch_id):
        rows = [(r.commit_ts, r.id, r.op, r.v) for r in df.collect()]  # one partition: commit order
        if batch_id in fail_batch:
            fail_batch.discard(batch_id)
            raise RuntimeError("injected sink failure")
        batches[batch_id] = rows  # idempotent by batch id, like any exactly-once sink

    def run():
        q = (spark.readStream.format("terrascale").option("endpoint", node.base).option("table", "feed")
             .option("change_feed", "true").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination()

    t0 = write_round(c, 0)
    run()
    assert sorted(batches) == [0] and batches[0] == api_changes(c, 0, last_offset(checkpoint, 0))
    assert last_offset(checkpoint, 0) >= t0
    write_round(c, 1)
    with pytest.raises(Exception, match="injected sink failure"):
        run()
    assert 1 not in batches and os.path.exists(os.path.join(checkpoint, "offsets", "1"))
    end1 = last_offset(checkpoint, 1)
    write_round(c, 2)  # arrives after batch 1's offsets were logged
    run()
    assert last_offset(checkpoint, 1) == end1 and 1 in batches  # batch 1 was re-run with its logged offsets
    run()  # availableNow after a recovered batch stops there; the next run takes what came since
    assert len(batches) == 3
    ends = [last_offset(checkpoint, b) for b in sorted(batches)]
    starts = [0] + ends[:-1]
    for b, (a, z) in enumerate(zip(starts, ends)):
        assert batches[b] == api_changes(c, a, z), b  # exactly the changes in (previous, new offset]
    every = [row for b in sorted(batches) for row in batches[b]]
    assert every == api_changes(c, 0, ends[-1])  # each change once, in commit order
    assert len(every) == 3 * (ROWS + 50 + 10) and {r[2] for r in every} == {"upsert", "delete"}
    assert [r[0] for r in every] == sorted(r[0] for r in every)
    c.close()


def test_stream_keeps_its_columns_across_schema_changes_and_the_feed_as_a_batch_read(spark, node, tmp_path):
    c = node.client()
    after = c._call("GET", "/v1/tables/feed/snapshot")["as_of"]
    stream = (spark.readStream.format("terrascale").option("endpoint", node.base).option("table", "feed")
              .option("change_feed", "true").option("starting_ts", after).load())  # columns of now
    c.add_column("feed", "extra", "int64")
    c.rename_column("feed", "name", "label")
    upto = c.upsert("feed", [{"id": 5000, "v": 1.0, "label": "renamed", "extra": 3}])["commit_ts"]
    end = c.delete("feed", [5000])["commit_ts"]
    got = []
    q = (stream.writeStream.foreachBatch(lambda df, _: got.extend(r.asDict() for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert stream.columns == ["id", "v", "name", "commit_ts", "op"]
    assert stream.schema["commit_ts"].dataType.simpleString() == "bigint" and not stream.schema["op"].nullable
    # matched by column id: the renamed column keeps its values, the added one is left out
    assert got[0] == {"id": 5000, "v": 1.0, "name": "renamed", "commit_ts": upto, "op": "upsert"}
    assert got[1] == {"id": 5000, "v": None, "name": None, "commit_ts": end, "op": "delete"} and len(got) == 2

    batch = (spark.read.format("terrascale").option("endpoint", node.base).option("table", "feed")
             .option("change_feed", "true").option("after", after).option("as_of", end).load())
    assert batch.columns == ["id", "v", "label", "extra", "commit_ts", "op"]  # the schema at as_of
    rows = [r.asDict() for r in batch.collect()]
    assert rows == [{"id": 5000, "v": 1.0, "label": "renamed", "extra": 3, "commit_ts": upto, "op": "upsert"},
                    {"id": 5000, "v": None, "label": None, "extra": None, "commit_ts": end, "op": "delete"}]
    with pytest.raises(Exception, match="change_feed"):
        spark.readStream.format("terrascale").option("endpoint", node.base).option("table", "feed").load() \
            .writeStream.format("console").start().awaitTermination(10)
    c.close()
