package io.terrascale.spark.format;

/**
 * One column's values for the rows of a page or a group of a columnar segment
 * (docs/format/segment.md §7.3), decoded into plain arrays: integer streams as 64-bit values
 * (sign- or zero-extended as the type is), float streams as doubles (a float32 widens exactly),
 * booleans, variable-width values as (start, length) into {@link #data}, uuids as 16 bytes each.
 */
public final class ColumnData {
    public final Kind kind;
    public final Kind elem;
    public final int rows;
    /** Null: every row has a value. */
    public final boolean[] valid;
    /** Per integer stream (ints, dates, timestamps; a range's bounds and flags). */
    public final long[][] ints;
    /** Per float stream (floats; a point's or box's coordinates; a float range's bounds). */
    public final double[][] reals;
    public final boolean[] bools;
    public final byte[] data;
    public final int[] starts;
    public final int[] lens;

    ColumnData(Kind kind, Kind elem, int rows, boolean[] valid, long[][] ints, double[][] reals, boolean[] bools,
               byte[] data, int[] starts, int[] lens) {
        this.kind = kind;
        this.elem = elem;
        this.rows = rows;
        this.valid = valid;
        this.ints = ints;
        this.reals = reals;
        this.bools = bools;
        this.data = data;
        this.starts = starts;
        this.lens = lens;
    }

    /** Every row null: a column no row of the group has. */
    static ColumnData nulls(Kind kind, Kind elem, int rows) {
        return new ColumnData(kind, elem, rows, new boolean[rows], null, null, null, null, null, null);
    }

    public boolean isNull(int i) {
        return valid != null && !valid[i];
    }

    /** Pages of one chunk, in order, as one. */
    static ColumnData concat(ColumnData[] parts, int rows) {
        if (parts.length == 1) return parts[0];
        ColumnData f = parts[0];
        boolean anyNull = false;
        int dataLen = 0;
        for (ColumnData p : parts) {
            anyNull |= p.valid != null;
            if (p.data != null) dataLen += p.data.length;
        }
        boolean[] valid = anyNull ? new boolean[rows] : null;
        long[][] ints = f.ints == null ? null : new long[f.ints.length][rows];
        double[][] reals = f.reals == null ? null : new double[f.reals.length][rows];
        boolean[] bools = f.bools == null ? null : new boolean[rows];
        byte[] data = f.data == null ? null : new byte[dataLen];
        int[] starts = f.starts == null ? null : new int[rows];
        int[] lens = f.lens == null ? null : new int[rows];
        int at = 0, dat = 0;
        for (ColumnData p : parts) {
            if (valid != null) {
                if (p.valid == null) java.util.Arrays.fill(valid, at, at + p.rows, true);
                else System.arraycopy(p.valid, 0, valid, at, p.rows);
            }
            if (ints != null) for (int k = 0; k < ints.length; k++) System.arraycopy(p.ints[k], 0, ints[k], at, p.rows);
            if (reals != null) for (int k = 0; k < reals.length; k++) System.arraycopy(p.reals[k], 0, reals[k], at, p.rows);
            if (bools != null) System.arraycopy(p.bools, 0, bools, at, p.rows);
            if (data != null) {
                System.arraycopy(p.data, 0, data, dat, p.data.length);
                for (int i = 0; i < p.rows; i++) starts[at + i] = p.starts[i] + dat;
                System.arraycopy(p.lens, 0, lens, at, p.rows);
                dat += p.data.length;
            }
            at += p.rows;
        }
        return new ColumnData(f.kind, f.elem, rows, valid, ints, reals, bools, data, starts, lens);
    }
}
