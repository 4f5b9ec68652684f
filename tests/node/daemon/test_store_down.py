"""The object store goes away (a TCP proxy in front of moto's server cut): writes go on and are
acknowledged from the local log; a query that needs offloaded rows and `admin offload`
answer 503 `unavailable` naming the store — a dependency that is down is "retry later", never
a 500 — and everything works again, nothing lost, once the store is back."""
import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from node.errors import ApiError
from tests.fixtures.moto import make_bucket, s3_uri
from tests.fixtures.proxy import Proxy
from tests.node.proc import eventually


def rows(lo: int, hi: int, v: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64()), "v": pa.array([v] * (hi - lo), pa.int64())})


def test_object_store_down_is_503_and_nothing_is_lost(tmp_path, moto_server):
    port = int(moto_server.rsplit(":", 1)[1])
    proxy = Proxy(port)
    node = NodeProc(tmp_path, extra='[jobs]\noffload_every = "0s"\n')
    endpoint = f"http://127.0.0.1:{proxy.port}"
    uri = s3_uri(endpoint, make_bucket(moto_server), max_attempts=3, backoff_base=0.05)
    node.config.write_text(node.config.read_text().replace(f'objects = "trfs://{node.data}/objects"',
                                                           f'objects = "{uri}"'))
    try:
        node.start()
        c = node.client(timeout=120)
        c.create_table("t", [("id", "int64"), ("v", "int64")], "id", partitions=2)
        c.upsert("t", rows(0, 200, 1))
        c.admin("seal")
        c.admin("offload")
        c.close()
        node.stop()
        node.start()  # the block cache starts empty: offloaded rows come from the store
        c = node.client(timeout=120)
        proxy.cut()
        with pytest.raises(ApiError) as ei:
            c.query("t", limit=10_000)
        assert ei.value.status == 503 and ei.value.code == "unavailable", ei.value
        assert f"127.0.0.1:{proxy.port}" in ei.value.message or "trs3://" in ei.value.message, ei.value.message
        c.upsert("t", rows(200, 300, 2))  # writes go on: acknowledged once in the local log
        c.admin("seal")
        with pytest.raises(ApiError) as ei:
            c.admin("offload")
        assert ei.value.status == 503 and ei.value.code == "unavailable", ei.value
        proxy.restore()
        eventually(lambda: c.admin("offload"), 60)
        t = eventually(lambda: c.query("t", limit=10_000), 60)
        assert t.num_rows == 300
        assert sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist())) == \
            [(i, 1) for i in range(200)] + [(i, 2) for i in range(200, 300)]
        assert "event=request_crashed" not in node.log()
        c.close()
    finally:
        node.ensure_stopped()
        proxy.close()
