package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.ColumnData;
import io.terrascale.spark.format.ColumnFilter;
import io.terrascale.spark.format.ColumnarSegment;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.SealedObject;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.roaringbitmap.RoaringBitmap;

/**
 * A columnar segment's rows for one task (docs/format/segment.md §7): group by group, only the
 * chunks of the output columns, the predicates' columns and the deletion flags are read and
 * decoded; a group with no visible row in the task's range is not read at all.
 */
final class ColumnarRows implements SegmentSource {
    private final ColumnarSegment seg;
    private final boolean[] visible;
    private final List<Column> output;
    private final List<Column> want;
    private final ColumnFilter filter;
    private final Predicates preds;
    private final ColumnWriter writer = new ColumnWriter();
    private final int end;
    private int row; // next localid to look at
    private int group = -1; // the group loaded
    private ColumnData[] cols; // the group's data per wanted column
    private ColumnData flags;
    private long decodeNanos;
    private int skipped; // groups the statistics ruled out
    private int[] sel = new int[0]; // the rows of the group a fill outputs

    ColumnarRows(SealedObject obj, List<Column> output, Predicates preds, byte[] visibleBitmap, long first, long end)
            throws IOException {
        seg = new ColumnarSegment(obj);
        row = (int) Math.min(first, seg.rows());
        this.end = (int) Math.min(end, seg.rows());
        visible = new boolean[seg.rows()];
        RoaringBitmap bm = new RoaringBitmap();
        bm.deserialize(ByteBuffer.wrap(visibleBitmap));
        bm.forEach((int id) -> {
            if (id >= 0 && id < visible.length) visible[id] = true;
        });
        this.output = output;
        want = new ArrayList<>(output);
        for (Predicates.Term t : preds.terms()) addColumn(want, t.column());
        if (preds.bbox() != null) addColumn(want, preds.bbox().column());
        filter = new ColumnFilter(preds);
        this.preds = preds;
    }

    private static void addColumn(List<Column> want, Column c) {
        for (Column x : want) if (x.id() == c.id()) return;
        want.add(c);
    }

    @Override
    public int fill(WritableColumnVector[] vectors, int max) throws IOException {
        if (vectors.length != output.size()) {
            throw new BridgeException("expected " + output.size() + " column vectors, not " + vectors.length);
        }
        int n = 0;
        long t0 = System.nanoTime();
        long loading = 0;
        int gr = seg.groupRows();
        if (sel.length < max) sel = new int[max];
        while (n < max && row < end) {
            int g = row / gr;
            int gEnd = Math.min(end, (g + 1) * gr);
            if (g != group) {
                boolean ruledOut = anyVisible(row, gEnd) && misses(g);
                if (ruledOut) skipped++;
                if (ruledOut || !anyVisible(row, gEnd)) { // nothing of this group to read
                    row = gEnd;
                    continue;
                }
                long t1 = System.nanoTime();
                load(g);
                loading += System.nanoTime() - t1;
            }
            // the group's rows to output, then each column's values of them in one loop
            int base = g * gr, m = 0;
            long[] del = flags.ints[0];
            boolean all = filter.isEmpty();
            for (; row < gEnd && n + m < max; row++) {
                int k = row - base;
                if (visible[row] && (del[k] & 1) == 0 && (all || filter.matches(k))) sel[m++] = k;
            }
            for (int j = 0; j < vectors.length; j++) writer.putMany(cols[j], sel, m, vectors[j], n);
            n += m;
        }
        decodeNanos += System.nanoTime() - t0 - loading;
        return n;
    }

    /** Whether the group's statistics show that no row of it matches the predicates. */
    private boolean misses(int g) {
        for (Predicates.Term t : preds.terms()) if (seg.misses(g, t)) return true;
        return preds.bbox() != null && seg.misses(g, preds.bbox());
    }

    private boolean anyVisible(int a, int b) {
        for (int i = a; i < b; i++) if (visible[i]) return true;
        return false;
    }

    /** Group {@code g}'s chunks of the wanted columns (a column the segment lacks: all null). */
    private void load(int g) throws IOException {
        Map<Integer, ColumnData> byId = new HashMap<>();
        cols = new ColumnData[want.size()];
        for (int j = 0; j < want.size(); j++) {
            Column c = want.get(j);
            int ci = seg.indexOf(c);
            cols[j] = ci < 0 ? seg.nulls(c, g) : seg.read(g, ci);
            byId.put(c.id(), cols[j]);
        }
        flags = seg.read(g, ColumnarSegment.FLAGS);
        filter.bind(c -> byId.get(c.id()));
        group = g;
    }

    /** Groups whose statistics showed no row could match (not read). */
    int skipped() {
        return skipped;
    }

    @Override
    public boolean more() {
        return row < end;
    }

    @Override
    public long decodeNanos() {
        return decodeNanos;
    }
}
