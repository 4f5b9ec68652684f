package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.ByteSource;
import io.terrascale.spark.format.FileSource;
import io.terrascale.spark.format.Kek;
import io.terrascale.spark.format.SealedObject;
import io.terrascale.spark.node.Lease;
import io.terrascale.spark.node.NodeClient;
import io.terrascale.spark.node.UrlSource;
import java.io.IOException;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.Arrays;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * One task's read of one offloaded segment, straight from its object, in batches of
 * {@value #BATCH_ROWS} rows; the read's lease is renewed while it runs (node.Lease).
 */
final class SegmentReader implements PartitionReader<ColumnarBatch> {
    static final int BATCH_ROWS = 4096;

    private final Lease lease;
    private final SealedObject obj;
    private final SegmentSource rows;
    private final OnHeapColumnVector[] vectors;
    private final ColumnarBatch batch;
    private long rowsOut;

    SegmentReader(ReadSpec spec, Partitions.Segment p) throws IOException {
        lease = new Lease(new NodeClient(spec.opts().node(), spec.opts().table()), spec.lease(), spec.opts().leaseS());
        SealedObject o = null;
        try {
            Kek kek = spec.opts().keyFile() == null ? null : Kek.load(spec.opts().keyFile());
            o = new SealedObject(spec.objects() + "/" + p.key(), source(spec.objects(), p), p.objectSize(), kek, p.dataKey());
            rows = SegmentSource.open(o, spec.output(), spec.versions(), spec.preds(), p.visible(), p.firstRow(),
                    p.endRow());
            vectors = OnHeapColumnVector.allocateColumns(BATCH_ROWS, SparkTypes.sparkSchema(spec.output()));
            batch = new ColumnarBatch(Arrays.copyOf(vectors, vectors.length, ColumnVector[].class));
        } catch (IOException | RuntimeException e) {
            lease.close();
            if (o != null) o.close();
            throw e;
        }
        obj = o;
    }

    private static ByteSource source(String objects, Partitions.Segment p) throws IOException {
        if (p.url() != null) return new UrlSource(p.url());
        return new FileSource(Paths.get(localPath(objects), p.key()).toString());
    }

    /** The local store path of a {@code trfs://} URI (terrafs/uri.py's local_path). */
    static String localPath(String uri) {
        URI u = URI.create(uri);
        if (!"trfs".equals(u.getScheme())) {
            throw new BridgeException("the JVM reader reads objects from trfs:// stores or through the presigned URLs "
                    + "a node puts in the plan, not from " + u.getScheme() + "://; leave option objects out "
                    + "(the node presigns S3 objects) or use option reader=python");
        }
        String path = (u.getRawAuthority() == null ? "" : u.getRawAuthority()) + (u.getRawPath() == null ? "" : u.getRawPath());
        return URLDecoder.decode(path, StandardCharsets.UTF_8);
    }

    @Override
    public boolean next() throws IOException {
        lease.check();
        for (OnHeapColumnVector v : vectors) v.reset();
        int n = rows.fill(vectors, BATCH_ROWS);
        batch.setNumRows(n);
        rowsOut += n;
        return n > 0 || rows.more();
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        lease.close();
        obj.close();
        Timings.add(obj.nanos(), rows.decodeNanos(), rowsOut);
        batch.close();
    }
}
