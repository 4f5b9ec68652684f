package io.terrascale.spark;

import static io.terrascale.spark.TerrascaleScan.BATCH_ROWS;
import static io.terrascale.spark.TerrascaleScan.CountPart;
import static io.terrascale.spark.TerrascaleScan.SegmentPart;
import static io.terrascale.spark.TerrascaleScan.TailPart;
import static io.terrascale.spark.TerrascaleScan.countBatch;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.roaringbitmap.RoaringBitmap;

/**
 * The executors' side of a JVM read (docs/spark.md, "Readers"): the reader factory Spark ships
 * with each task, the reader of one offloaded segment (straight from its object), and the one of
 * a tail (the node's Arrow stream) or of a count known from the plan.
 */
final class Readers {
    private Readers() {}

    static final class Factory implements PartitionReaderFactory {
        final Opts opts;
        final long asOf;
        final String lease;
        final String objects;
        final List<Types.Schema> versions;
        final Types.Schema target;
        final List<Types.Col> output;
        final Predicates preds;
        final List<Object[]> where;
        final long[] sealed;
        final boolean countOnly;

        Factory(Opts opts, long asOf, String lease, String objects, List<Types.Schema> versions, Types.Schema target,
                List<Types.Col> output, Predicates preds, List<Object[]> where, long[] sealed, boolean countOnly) {
            this.countOnly = countOnly;
            this.opts = opts;
            this.asOf = asOf;
            this.lease = lease;
            this.objects = objects;
            this.versions = versions;
            this.target = target;
            this.output = output;
            this.preds = preds;
            this.where = where;
            this.sealed = sealed;
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
            StructType schema = Types.sparkSchema(output);
            if (partition instanceof CountPart) {
                List<ColumnarBatch> one = new ArrayList<>();
                one.add(countBatch(((CountPart) partition).rows));
                return new ListReader(one);
            }
            if (partition instanceof SegmentPart) {
                try {
                    return new SegmentReader(this, (SegmentPart) partition, schema);
                } catch (IOException e) {
                    throw new BridgeException("reading segment " + ((SegmentPart) partition).segid + " ("
                            + objects + "/" + ((SegmentPart) partition).key + "): " + e, e);
                }
            }
            TailPart t = (TailPart) partition;
            if (t.partition < 0) {
                List<ColumnarBatch> none = new ArrayList<>();
                if (countOnly) none.add(countBatch(0));
                return new ListReader(none);
            }
            byte[] stream = new NodeClient(opts).tail(t.partition, asOf, where, sealed);
            try {
                if (countOnly) {
                    List<ColumnarBatch> one = new ArrayList<>();
                    one.add(countBatch(ArrowRows.count(stream)));
                    return new ListReader(one);
                }
                return new ListReader(ArrowRows.read(stream, output, schema));
            } catch (IOException e) {
                throw new BridgeException("the node's tail of partition " + t.partition + " is not an Arrow stream: " + e, e);
            }
        }
    }

    static final class ListReader implements PartitionReader<ColumnarBatch> {
        private final Iterator<ColumnarBatch> it;
        private ColumnarBatch cur;

        ListReader(List<ColumnarBatch> batches) {
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

    /** Local store path of a ``trfs://`` URI (terrafs/uri.py's local_path). */
    static String localPath(String uri) {
        java.net.URI u = java.net.URI.create(uri);
        if (!"trfs".equals(u.getScheme())) {
            throw new BridgeException("the JVM reader reads objects from trfs:// stores or through the presigned URLs "
                    + "a node puts in the plan, not from " + u.getScheme() + "://; leave option objects out "
                    + "(the node presigns S3 objects) or use option reader=python");
        }
        String path = (u.getRawAuthority() == null ? "" : u.getRawAuthority()) + (u.getRawPath() == null ? "" : u.getRawPath());
        return java.net.URLDecoder.decode(path, java.nio.charset.StandardCharsets.UTF_8);
    }

    static byte[] loadKek(String path) {
        byte[] raw;
        try {
            raw = Files.readAllBytes(Paths.get(path));
        } catch (IOException e) {
            throw new BridgeException("option key_file: cannot read " + path + ": " + e.getMessage(), e);
        }
        String text = new String(raw, java.nio.charset.StandardCharsets.ISO_8859_1).trim();
        if (text.length() == 64 && text.matches("[0-9a-fA-F]{64}")) {
            byte[] k = new byte[32];
            for (int i = 0; i < 32; i++) k[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
            return k;
        }
        if (raw.length == 32) return raw;
        throw new BridgeException("option key_file: " + path + " must hold 32 raw bytes or 64 hex chars");
    }

    /** One offloaded segment: its visible rows, matching the predicates, in localid order. */
    static final class SegmentReader implements PartitionReader<ColumnarBatch> {
        private final Lease lease;
        private final SealedObject obj;
        private final Segment seg;
        private final boolean[] visible;
        private final Segment.Decoder dec;
        private final OnHeapColumnVector[] vectors;
        private final ColumnVector[] out;
        private int row; // next localid to look at
        private final int total; // where this task stops
        private int runEnd; // rows [.., runEnd) are in buf
        private ByteBuffer buf;
        private long base; // logical offset of buf[0]
        private ColumnarBatch batch;
        private long rowsOut;

        SegmentReader(Factory f, SegmentPart p, StructType schema) throws IOException {
            lease = new Lease(f.opts, f.lease);
            try {
                String where = f.objects + "/" + p.key;
                SealedObject.Source src = p.url != null ? new SealedObject.UrlSource(p.url)
                        : new SealedObject.FileSource(Paths.get(localPath(f.objects), p.key).toString());
                obj = new SealedObject(where, src, p.objectSize, f.opts.keyFile == null ? null : loadKek(f.opts.keyFile),
                        p.dataKey);
                seg = new Segment(obj);
                row = (int) Math.min(p.firstRow, seg.offsets.length);
                total = (int) Math.min(p.endRow, seg.offsets.length);
                visible = new boolean[seg.offsets.length];
                RoaringBitmap bm = new RoaringBitmap();
                bm.deserialize(ByteBuffer.wrap(p.visible));
                bm.forEach((int id) -> {
                    if (id >= 0 && id < visible.length) visible[id] = true;
                });
                List<Types.Col> want = new ArrayList<>(f.output);
                for (Predicates.Term t : f.preds.terms) addCol(want, f.target.byId(t.columnId));
                if (f.preds.bboxColumn >= 0) addCol(want, f.target.byId(f.preds.bboxColumn));
                dec = new Segment.Decoder(want.toArray(new Types.Col[0]), f.output.size(),
                        Segment.versionMap(f.versions), f.preds, where);
                vectors = OnHeapColumnVector.allocateColumns(BATCH_ROWS, schema);
                out = new ColumnVector[vectors.length];
                System.arraycopy(vectors, 0, out, 0, vectors.length);
                batch = new ColumnarBatch(out);
            } catch (IOException | RuntimeException e) {
                lease.close();
                throw e;
            }
        }

        private static void addCol(List<Types.Col> want, Types.Col c) {
            for (Types.Col x : want) if (x.id == c.id) return;
            want.add(c);
        }

        @Override
        public boolean next() throws IOException {
            lease.check();
            for (OnHeapColumnVector v : vectors) v.reset();
            int n = 0;
            long t0 = System.nanoTime();
            long loading = 0; // the runs' fetch, checks and decompression are timed by the object
            while (n < BATCH_ROWS && row < total) {
                if (row >= runEnd) {
                    long t1 = System.nanoTime();
                    loadRun();
                    loading += System.nanoTime() - t1;
                }
                int r = (int) (seg.offsets[row] - base);
                // a row invisible at T may be of a schema version newer than T: the plan need not know it
                if (visible[row] || dec.knows(buf.getInt(r + 4))) {
                    Segment.Layout l = dec.check(buf, r, buf.getInt(r), base);
                    if (visible[row] && (buf.get(r + 16) & Segment.DELETED) == 0
                            && (dec.preds.isEmpty() || dec.matches(buf, r, l))) {
                        for (int j = 0; j < vectors.length; j++) dec.put(buf, r, l, j, vectors[j], n);
                        n++;
                    }
                }
                row++;
            }
            seg.decodeNanos += System.nanoTime() - t0 - loading;
            batch.setNumRows(n);
            rowsOut += n;
            return n > 0 || row < total;
        }

        /** Reads the next run of whole rows and checks that they chain exactly through it. */
        private void loadRun() throws IOException {
            int a = row;
            int b = Math.min(seg.runEnd(a), total);
            long lo = seg.offsets[a];
            long hi = seg.end(b);
            buf = SealedObject.le(obj.read(lo, hi));
            base = lo;
            for (int i = a; i < b; i++) {
                int r = (int) (seg.offsets[i] - lo);
                long len = buf.getInt(r) & 0xffffffffL;
                if (len < Segment.HEADER || seg.offsets[i] + len != seg.end(i + 1)) {
                    throw new CorruptObjectException(obj.where, seg.offsets[i], "row does not end where the next one begins (logical offset)");
                }
            }
            runEnd = b;
        }

        @Override
        public ColumnarBatch get() {
            return batch;
        }

        @Override
        public void close() throws IOException {
            lease.close();
            obj.close();
            Timings.add(obj.nanos, seg.decodeNanos, rowsOut);
            batch.close();
        }
    }
}
