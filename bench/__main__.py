"""`make bench`: run every benchmark and print its comparison table."""
import asyncio
import sys

from bench import (aggregate_bench, cluster_bench, column_pages_bench, columnar_node_bench, console_bench,
                   delete_bench, durability_bench,
                   gc_bench, gc_cluster_bench, keys_bench, leaderless_bench, membership_bench, memory_bench,
                   node_bench, raft_bench, retention_bench, rowcodec_bench, rowstore_bench, rowstore_read_bench,
                   segment_formats_bench, spark_bench, spark_floor_bench, subscribe_bench, table_bench, terrafs_bench,
                   tsagg_bench)

SUITES = {"terrafs": terrafs_bench.main, "rowcodec": rowcodec_bench.main,
          "rowstore": rowstore_bench.main, "rowstore_read": rowstore_read_bench.main,
          "table": table_bench.main, "raft": raft_bench.main,
          "node": node_bench.main, "node_points": node_bench.main_points, "spark": spark_bench.main,
          "spark_floor": spark_floor_bench.main,
          "gc": gc_bench.main, "gc_cluster": gc_cluster_bench.main, "cluster": cluster_bench.main,
          "leaderless": leaderless_bench.main, "durability": durability_bench.main,
          "console": console_bench.main, "aggregates": aggregate_bench.main, "keys": keys_bench.main,
          "segment_formats": segment_formats_bench.main, "columnar": columnar_node_bench.main,
          "subscribe": subscribe_bench.main, "tsagg": tsagg_bench.main,
          "retention": retention_bench.main, "membership": membership_bench.main,
          "delete": delete_bench.main, "memory": memory_bench.main,
          "column_pages": column_pages_bench.main}


def main(argv: list[str]) -> int:
    names = argv or list(SUITES)
    for n in names:
        if n not in SUITES:
            print(f"unknown benchmark {n!r}; known: {', '.join(SUITES)}", file=sys.stderr)
            return 2
        asyncio.run(SUITES[n]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
