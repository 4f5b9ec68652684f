package io.terrascale.spark.source;

import java.util.Iterator;
import java.util.List;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** A partition whose batches are made up front: a count, or a tail's rows. */
final class BatchList implements PartitionReader<ColumnarBatch> {
    private final Iterator<ColumnarBatch> it;
    private ColumnarBatch cur;

    BatchList(List<ColumnarBatch> batches) {
        it = batches.iterator();
    }

    @Override
    public boolean next() {
        if (cur != null) cur.close();
        cur = it.hasNext() ? it.next() : null;
        return cur != null;
    }

    @Override
    public ColumnarBatch get() {
        return cur;
    }

    @Override
    public void close() {
        if (cur != null) cur.close();
        while (it.hasNext()) it.next().close();
    }
}
