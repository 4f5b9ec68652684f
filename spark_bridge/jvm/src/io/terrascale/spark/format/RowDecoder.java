package io.terrascale.spark.format;

import io.terrascale.spark.CorruptObjectException;
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Finds the wanted columns' fields in rows of any schema version the plan names, by column id
 * (docs/format/segment.md §1). One per reading thread: it caches the layout of the version last
 * seen, since rows of one version come in long runs.
 */
public final class RowDecoder {
    private final List<Column> want;
    private final Map<Integer, Schema> versions = new HashMap<>();
    private final Map<Integer, RowLayout> layouts = new HashMap<>();
    private final String where;
    private int lastVersion = -1;
    private RowLayout last;

    /** Decodes {@code want} (by id) from rows of {@code versions}; {@code where} names the object in errors. */
    public RowDecoder(List<Column> want, List<Schema> versions, String where) {
        this.want = List.copyOf(want);
        for (Schema s : versions) this.versions.put(s.version(), s);
        this.where = where;
    }

    public List<Column> want() {
        return want;
    }

    /** The index of column {@code id} among the wanted ones. */
    public int slotOf(int id) {
        for (int j = 0; j < want.size(); j++) {
            if (want.get(j).id() == id) return j;
        }
        throw new IllegalArgumentException("column id " + id + " is not decoded");
    }

    /** Whether rows of {@code version} can be decoded (a row invisible at T may be of a newer version). */
    public boolean knows(int version) {
        return version == lastVersion || versions.containsKey(version);
    }

    private RowLayout layout(int version, long offset) {
        if (version == lastVersion) return last;
        RowLayout l = layouts.get(version);
        if (l == null) {
            Schema s = versions.get(version);
            if (s == null) throw new CorruptObjectException(where, offset, "row names schema version " + version + " the plan does not know");
            l = new RowLayout(s, want);
            layouts.put(version, l);
        }
        lastVersion = version;
        last = l;
        return l;
    }

    /** The layout of the row at {@code r} (logical offset {@code base + r}), its length checked against its fields. */
    public RowLayout check(ByteBuffer b, int r, long base) {
        RowLayout l = layout(Segment.version(b, r), base + r);
        int prev = 0;
        for (int k = 0; k < l.nvar; k++) {
            int e = b.getInt(r + l.vendOff + 4 * k);
            if (e < prev) throw new CorruptObjectException(where, base + r, "row length disagrees with its fields (logical offset)");
            prev = e;
        }
        if ((long) l.varArea + prev != b.getInt(r)) {
            throw new CorruptObjectException(where, base + r, "row length disagrees with its fields (logical offset)");
        }
        return l;
    }

    public boolean isNull(ByteBuffer b, int r, RowLayout l, int j) {
        int p = l.pos[j];
        return p < 0 || ((b.get(r + Segment.ROW_HEADER + (p >> 3)) >> (p & 7)) & 1) != 0;
    }

    /** Where wanted column {@code j}'s fixed-width field starts in the buffer. */
    public int at(int r, RowLayout l, int j) {
        return r + l.at[j];
    }

    /** Where wanted column {@code j}'s variable-width bytes start in the buffer. */
    public int varStart(ByteBuffer b, int r, RowLayout l, int j) {
        int slot = l.at[j];
        return r + l.varArea + (slot == 0 ? 0 : b.getInt(r + l.vendOff + 4 * (slot - 1)));
    }

    public int varLen(ByteBuffer b, int r, RowLayout l, int j) {
        int slot = l.at[j];
        return b.getInt(r + l.vendOff + 4 * slot) - (slot == 0 ? 0 : b.getInt(r + l.vendOff + 4 * (slot - 1)));
    }

    /** An integer field of kind {@code k} (dates are days, timestamps µs), widened to a long; uint64 as its bits. */
    public static long intValue(ByteBuffer b, int a, Kind k) {
        switch (k) {
            case INT8: return b.get(a);
            case INT16: return b.getShort(a);
            case INT32: case DATE: return b.getInt(a);
            case UINT8: return b.get(a) & 0xffL;
            case UINT16: return b.getShort(a) & 0xffffL;
            case UINT32: return b.getInt(a) & 0xffffffffL;
            default: return b.getLong(a); // int64, uint64 (compared unsigned), timestamp
        }
    }
}
