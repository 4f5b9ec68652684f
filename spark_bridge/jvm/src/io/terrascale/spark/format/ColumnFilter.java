package io.terrascale.spark.format;

import java.math.BigInteger;
import java.util.List;

/**
 * {@link Predicates} evaluated on a group's decoded columns ({@link ColumnData}), with the
 * semantics {@link RowFilter} has on row bytes: a null never matches; a range matches when it
 * overlaps the term's interval; a bbox holds points inside it and boxes overlapping it.
 */
public final class ColumnFilter {
    private static final int UNORDERED = 99; // a comparison with NaN

    private final List<Predicates.Term> terms;
    private final Predicates.BBox bbox;
    private final ColumnData[] termCols;
    private ColumnData boxCol;

    public ColumnFilter(Predicates preds) {
        terms = preds.terms();
        bbox = preds.bbox();
        termCols = new ColumnData[terms.size()];
    }

    public boolean isEmpty() {
        return terms.isEmpty() && bbox == null;
    }

    /** The columns a group's rows are tested on: {@code columnOf} gives a column's data. */
    public void bind(java.util.function.Function<Column, ColumnData> columnOf) {
        for (int i = 0; i < termCols.length; i++) termCols[i] = columnOf.apply(terms.get(i).column());
        boxCol = bbox == null ? null : columnOf.apply(bbox.column());
    }

    public boolean matches(int i) {
        for (int t = 0; t < termCols.length; t++) {
            if (!term(termCols[t], i, terms.get(t))) return false;
        }
        return bbox == null || inBox(boxCol, i);
    }

    private boolean inBox(ColumnData c, int i) {
        if (c.isNull(i)) return false;
        double[][] v = c.reals;
        if (c.kind == Kind.POINT) {
            double x = v[0][i], y = v[1][i];
            return x >= bbox.xmin() && x <= bbox.xmax() && y >= bbox.ymin() && y <= bbox.ymax();
        }
        return v[0][i] <= bbox.xmax() && v[2][i] >= bbox.xmin() && v[1][i] <= bbox.ymax() && v[3][i] >= bbox.ymin();
    }

    private static boolean term(ColumnData c, int i, Predicates.Term t) {
        if (c.isNull(i)) return false;
        Op op = t.op();
        switch (c.kind) {
            case STRING: case BINARY: case UUID:
                return op.holds(Predicates.compareBytes(c.data, c.starts[i], c.lens[i], ((Predicates.Bytes) t.value()).v()));
            case BOOL: return op.holds(Boolean.compare(c.bools[i], ((Predicates.Bool) t.value()).v()));
            case FLOAT32: case FLOAT64: return op.holds(c.reals[0][i], ((Predicates.Real) t.value()).v());
            case RANGE: return range(c, i, t);
            default: return op.holds(Predicates.compareInt(c.ints[0][i], c.kind.unsigned(), integer(t)));
        }
    }

    private static boolean range(ColumnData c, int i, Predicates.Term t) {
        int flags = (int) c.ints[c.ints.length - 1][i];
        int cl, ch;
        if (c.elem == Kind.FLOAT64) {
            double v = ((Predicates.Real) t.value()).v();
            cl = cmp(c.reals[0][i], v);
            ch = cmp(c.reals[1][i], v);
        } else {
            cl = Predicates.compareInt(c.ints[0][i], false, integer(t));
            ch = Predicates.compareInt(c.ints[1][i], false, integer(t));
        }
        if (ch == UNORDERED && (flags & Predicates.UPPER_UNB) == 0) ch = Integer.MIN_VALUE;
        if (cl == UNORDERED && (flags & Predicates.LOWER_UNB) == 0) cl = Integer.MAX_VALUE;
        return Predicates.rangeOverlaps(t.op(), ch, cl, flags);
    }

    private static int cmp(double x, double v) {
        return x < v ? -1 : x > v ? 1 : x == v ? 0 : UNORDERED;
    }

    private static BigInteger integer(Predicates.Term t) {
        return ((Predicates.Int) t.value()).v();
    }
}
