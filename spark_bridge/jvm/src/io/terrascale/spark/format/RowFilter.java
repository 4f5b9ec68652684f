package io.terrascale.spark.format;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.List;

/**
 * {@link Predicates} bound to a {@link RowDecoder}'s columns, evaluated on row bytes: a null never
 * matches; a range matches when it overlaps the term's interval; a bbox holds points inside it
 * and boxes overlapping it, edges inclusive.
 */
public final class RowFilter {
    private static final int UNORDERED = 99; // a comparison with NaN

    private final RowDecoder dec;
    private final List<Predicates.Term> terms;
    private final int[] termSlot; // per term: its column's index among the decoded ones
    private final Predicates.BBox bbox;
    private final int bboxSlot;

    public RowFilter(Predicates preds, RowDecoder dec) {
        this.dec = dec;
        this.terms = preds.terms();
        this.termSlot = new int[terms.size()];
        for (int i = 0; i < termSlot.length; i++) termSlot[i] = dec.slotOf(terms.get(i).column().id());
        this.bbox = preds.bbox();
        this.bboxSlot = bbox == null ? -1 : dec.slotOf(bbox.column().id());
    }

    public boolean isEmpty() {
        return terms.isEmpty() && bbox == null;
    }

    public boolean matches(ByteBuffer b, int r, RowLayout l) {
        for (int i = 0; i < termSlot.length; i++) {
            if (!term(b, r, l, termSlot[i], terms.get(i))) return false;
        }
        return bbox == null || inBox(b, r, l);
    }

    private boolean inBox(ByteBuffer b, int r, RowLayout l) {
        if (dec.isNull(b, r, l, bboxSlot)) return false;
        int a = dec.at(r, l, bboxSlot);
        if (bbox.column().kind() == Kind.POINT) {
            double x = b.getDouble(a), y = b.getDouble(a + 8);
            return x >= bbox.xmin() && x <= bbox.xmax() && y >= bbox.ymin() && y <= bbox.ymax();
        }
        return b.getDouble(a) <= bbox.xmax() && b.getDouble(a + 16) >= bbox.xmin()
                && b.getDouble(a + 8) <= bbox.ymax() && b.getDouble(a + 24) >= bbox.ymin();
    }

    private boolean term(ByteBuffer b, int r, RowLayout l, int j, Predicates.Term t) {
        if (dec.isNull(b, r, l, j)) return false;
        int a = dec.at(r, l, j);
        Kind kind = t.column().kind();
        Op op = t.op();
        switch (kind) {
            case STRING: case BINARY:
                return op.holds(Predicates.compareBytes(b.array(), dec.varStart(b, r, l, j), dec.varLen(b, r, l, j), bytes(t)));
            case UUID: return op.holds(Predicates.compareBytes(b.array(), a, 16, bytes(t)));
            case BOOL: return op.holds(Boolean.compare(b.get(a) != 0, ((Predicates.Bool) t.value()).v()));
            case FLOAT32: return op.holds(b.getFloat(a), real(t));
            case FLOAT64: return op.holds(b.getDouble(a), real(t));
            case RANGE: return range(b, a, t);
            default: return op.holds(Predicates.compareInt(RowDecoder.intValue(b, a, kind), kind.unsigned(), integer(t)));
        }
    }

    private static boolean range(ByteBuffer b, int a, Predicates.Term t) {
        int flags = b.get(a + 16);
        int cl, ch;
        if (t.column().elem() == Kind.FLOAT64) {
            cl = cmp(b.getDouble(a), real(t));
            ch = cmp(b.getDouble(a + 8), real(t));
        } else {
            cl = Predicates.compareInt(b.getLong(a), false, integer(t));
            ch = Predicates.compareInt(b.getLong(a + 8), false, integer(t));
        }
        // a NaN bound fails the checks it takes part in
        if (ch == UNORDERED && (flags & Predicates.UPPER_UNB) == 0) ch = Integer.MIN_VALUE;
        if (cl == UNORDERED && (flags & Predicates.LOWER_UNB) == 0) cl = Integer.MAX_VALUE;
        return Predicates.rangeOverlaps(t.op(), ch, cl, flags);
    }

    private static int cmp(double x, double v) {
        return x < v ? -1 : x > v ? 1 : x == v ? 0 : UNORDERED;
    }

    private static byte[] bytes(Predicates.Term t) {
        return ((Predicates.Bytes) t.value()).v();
    }

    private static double real(Predicates.Term t) {
        return ((Predicates.Real) t.value()).v();
    }

    private static BigInteger integer(Predicates.Term t) {
        return ((Predicates.Int) t.value()).v();
    }
}
