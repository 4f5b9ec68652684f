"""A node is a storage engine, not a Spark job: it runs where pyspark is not installed
(pyspark is the ``spark`` extra, for the bridge)."""
from bench.node_proc import NodeProc


def test_a_node_serves_with_pyspark_absent(tmp_path):
    blocked = tmp_path / "no-pyspark" / "pyspark"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text('raise ImportError("pyspark is not installed (this test hides it)")\n')
    node = NodeProc(tmp_path).start(env={"PYTHONPATH": str(blocked.parent)})
    try:
        c = node.client()
        c.create_table("t", [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}], "id",
                       indexes=["v"])
        c.upsert("t", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
        assert c.get("t", 2)["v"] == "b"
        assert c.query("t", where=[["v", "=", "a"]]).column("id").to_pylist() == [1]
        c.close()
    finally:
        rc, log = node.stop()
    assert rc == 0 and "pyspark" not in log, log
