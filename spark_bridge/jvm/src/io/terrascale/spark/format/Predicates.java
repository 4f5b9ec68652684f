package io.terrascale.spark.format;

import java.io.Serializable;
import java.math.BigInteger;
import java.util.List;

/**
 * The exact predicates of a read as the node typed them in the plan (docs/spark.md, "The plan
 * for the JVM reader"): each term's value in its column's storage domain. Their semantics are
 * rowstore/reads/predicates.py's; {@link RowFilter} evaluates them on row bytes.
 */
public record Predicates(List<Term> terms, BBox bbox) implements Serializable {
    public static final Predicates NONE = new Predicates(List.of(), null);

    public Predicates {
        terms = List.copyOf(terms);
    }

    public boolean isEmpty() {
        return terms.isEmpty() && bbox == null;
    }

    /** A term's value: an integer of any width (uint64, µs, days included), a float, a boolean, or bytes (UTF-8 text, binary, uuid). */
    public sealed interface Value extends Serializable permits Int, Real, Bool, Bytes {}

    public record Int(BigInteger v) implements Value {}

    public record Real(double v) implements Value {}

    public record Bool(boolean v) implements Value {}

    public record Bytes(byte[] v) implements Value {}

    /** {@code column op value}; for a range column, the range overlaps the values the comparison admits. */
    public record Term(Column column, Op op, Value value) implements Serializable {}

    /** Points inside the box, boxes overlapping it; edges inclusive. */
    public record BBox(Column column, double xmin, double ymin, double xmax, double ymax) implements Serializable {}

    /** sign(stored - value) for an integer stored as {@code v} ({@code unsigned}: as u64). */
    static int compareInt(long v, boolean unsigned, BigInteger value) {
        if (value.bitLength() < 64) {
            long w = value.longValue();
            if (!unsigned) return Long.compare(v, w);
            if (w < 0) return 1;
            return Long.compareUnsigned(v, w);
        }
        if (unsigned && value.signum() > 0 && value.bitLength() == 64) return Long.compareUnsigned(v, value.longValue());
        return -value.signum(); // the value is beyond every stored value
    }

    static int compareBytes(byte[] a, int off, int len, byte[] b) {
        int n = Math.min(len, b.length);
        for (int i = 0; i < n; i++) {
            int x = a[off + i] & 0xff;
            int y = b[i] & 0xff;
            if (x != y) return x < y ? -1 : 1;
        }
        return Integer.compare(len, b.length);
    }

    /** Range flags (part of the format, rowstore/types.py). */
    static final int LOWER_INC = 1, UPPER_INC = 2, LOWER_UNB = 4, UPPER_UNB = 8;

    /** Whether a range (its bounds compared to the value; {@code flags}: inclusiveness, unboundedness)
     * overlaps the term's interval: '=' [v, v]; '<' (-inf, v); '<=' (-inf, v]; '>' (v, inf); '>=' [v, inf). */
    static boolean rangeOverlaps(Op op, int cmpHiToValue, int cmpLoToValue, int flags) {
        boolean loInc = (flags & LOWER_INC) != 0, hiInc = (flags & UPPER_INC) != 0;
        boolean loUnb = (flags & LOWER_UNB) != 0, hiUnb = (flags & UPPER_UNB) != 0;
        boolean hasLo = op == Op.EQ || op == Op.GT || op == Op.GE;
        boolean hasHi = op == Op.EQ || op == Op.LT || op == Op.LE;
        boolean ok = true;
        if (hasLo) ok = hiUnb || cmpHiToValue > 0 || (cmpHiToValue == 0 && hiInc && op != Op.GT);
        if (ok && hasHi) ok = loUnb || cmpLoToValue < 0 || (cmpLoToValue == 0 && loInc && op != Op.LT);
        return ok;
    }
}
