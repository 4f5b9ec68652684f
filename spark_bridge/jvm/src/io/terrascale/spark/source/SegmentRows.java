package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.RowDecoder;
import io.terrascale.spark.format.RowFilter;
import io.terrascale.spark.format.RowLayout;
import io.terrascale.spark.format.Schema;
import io.terrascale.spark.format.SealedObject;
import io.terrascale.spark.format.Segment;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.roaringbitmap.RoaringBitmap;

/**
 * The rows one task reads from one offloaded segment: localids {@code [first, end)} that the plan's
 * bitmap marks visible at T, not deletions, matching the predicates, in localid order, decoded into
 * the output columns (plus, for the predicates only, the columns they need).
 */
final class SegmentRows implements SegmentSource {
    private final Segment seg;
    private final boolean[] visible;
    private final RowDecoder dec;
    private final RowFilter filter;
    private final VectorWriter writer;
    private final int outputs;
    private final int end;
    private int row; // next localid to look at
    private int runEnd; // rows [.., runEnd) are in buf
    private ByteBuffer buf;
    private long base; // logical offset of buf[0]
    private long decodeNanos;

    SegmentRows(SealedObject obj, List<Column> output, List<Schema> versions, Predicates preds, byte[] visibleBitmap,
                long first, long end) throws IOException {
        seg = new Segment(obj);
        row = (int) Math.min(first, seg.rows());
        this.end = (int) Math.min(end, seg.rows());
        visible = new boolean[seg.rows()];
        RoaringBitmap bm = new RoaringBitmap();
        bm.deserialize(ByteBuffer.wrap(visibleBitmap));
        bm.forEach((int id) -> {
            if (id >= 0 && id < visible.length) visible[id] = true;
        });
        List<Column> want = new ArrayList<>(output);
        for (Predicates.Term t : preds.terms()) addColumn(want, t.column());
        if (preds.bbox() != null) addColumn(want, preds.bbox().column());
        dec = new RowDecoder(want, versions, obj.where());
        filter = new RowFilter(preds, dec);
        writer = new VectorWriter(dec);
        outputs = output.size();
    }

    private static void addColumn(List<Column> want, Column c) {
        for (Column x : want) if (x.id() == c.id()) return;
        want.add(c);
    }

    @Override
    public int fill(WritableColumnVector[] vectors, int max) throws IOException {
        if (vectors.length != outputs) throw new BridgeException("expected " + outputs + " column vectors, not " + vectors.length);
        int n = 0;
        long t0 = System.nanoTime();
        long loading = 0; // the runs' fetch, checks and decompression are timed by the object
        while (n < max && row < end) {
            if (row >= runEnd) {
                long t1 = System.nanoTime();
                loadRun();
                loading += System.nanoTime() - t1;
            }
            int r = (int) (seg.offset(row) - base);
            // a row invisible at T may be of a schema version newer than T: the plan need not know it
            if (visible[row] || dec.knows(Segment.version(buf, r))) {
                RowLayout l = dec.check(buf, r, base);
                if (visible[row] && !Segment.deleted(buf, r) && (filter.isEmpty() || filter.matches(buf, r, l))) {
                    for (int j = 0; j < outputs; j++) writer.put(buf, r, l, j, vectors[j], n);
                    n++;
                }
            }
            row++;
        }
        decodeNanos += System.nanoTime() - t0 - loading;
        return n;
    }

    @Override
    public boolean more() {
        return row < end;
    }

    @Override
    public long decodeNanos() {
        return decodeNanos;
    }

    private void loadRun() throws IOException {
        int b = Math.min(seg.runEnd(row), end);
        buf = seg.readRun(row, b);
        base = seg.offset(row);
        runEnd = b;
    }
}
