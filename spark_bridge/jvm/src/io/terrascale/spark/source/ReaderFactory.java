package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.node.NodeClient;
import java.io.IOException;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The executors' side of a JVM read (docs/spark.md, "Readers"), shipped by Spark with each task:
 * a reader of one offloaded segment (straight from its object), of a tail (the node's Arrow
 * stream), of a count known from the plan, of an aggregate the node answered, or of one table
 * partition's partial aggregate (asked of the node by the task).
 */
final class ReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    private final ReadSpec spec;

    ReaderFactory(ReadSpec spec) {
        this.spec = spec;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException("terrascale reads are columnar");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        if (partition instanceof Partitions.Count c) return new BatchList(List.of(countBatch(c.rows())));
        if (partition instanceof Partitions.Answer a) {
            try {
                return new BatchList(ArrowRows.read(a.stream(), spec.output(), SparkTypes.sparkSchema(spec.output())));
            } catch (IOException e) {
                throw new BridgeException("the node's aggregate answer is not an Arrow stream: " + e, e);
            }
        }
        if (partition instanceof Partitions.Partial p) {
            AggregatePushdown.Query q = p.query();
            byte[] stream = new NodeClient(spec.opts().node(), spec.opts().table()).partial(p.partition(), spec.asOf(),
                    spec.where(), spec.opts().bbox(), q.groupBy(), q.aggregates());
            try {
                return new BatchList(ArrowRows.read(stream, q.output(), SparkTypes.sparkSchema(q.output())));
            } catch (IOException e) {
                throw new BridgeException("the node's partial aggregate of partition " + p.partition()
                        + " is not an Arrow stream: " + e, e);
            }
        }
        if (partition instanceof Partitions.Segment s) {
            try {
                return new SegmentReader(spec, s);
            } catch (IOException e) {
                throw new BridgeException("reading segment " + s.segid() + " (" + spec.objects() + "/" + s.key() + "): " + e, e);
            }
        }
        Partitions.Tail t = (Partitions.Tail) partition;
        if (t.partition() < 0) return new BatchList(spec.countOnly() ? List.of(countBatch(0)) : List.of());
        byte[] stream = new NodeClient(spec.opts().node(), spec.opts().table())
                .tail(t.partition(), spec.asOf(), spec.where(), spec.opts().bbox(), spec.sealed());
        try {
            if (spec.countOnly()) return new BatchList(List.of(countBatch(ArrowRows.count(stream))));
            return new BatchList(ArrowRows.read(stream, spec.output(), SparkTypes.sparkSchema(spec.output())));
        } catch (IOException e) {
            throw new BridgeException("the node's tail of partition " + t.partition() + " is not an Arrow stream: " + e, e);
        }
    }

    static ColumnarBatch countBatch(long n) {
        OnHeapColumnVector[] v = OnHeapColumnVector.allocateColumns(1, TerrascaleScan.COUNT_SCHEMA);
        v[0].putLong(0, n);
        return new ColumnarBatch(new ColumnVector[] {v[0]}, 1);
    }
}
