package io.terrascale.spark;

import java.io.IOException;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/**
 * A sealed segment (docs/format/segment.md §3) inside a sealed object: the 192-byte footer, the
 * leaf level of the B+ tree (every row's offset), and the rows (§1), decoded into Spark column
 * vectors by schema version, column by column id. Rows are read in runs of whole rows (~8 MiB of
 * logical bytes, one ranged read each) and every run's rows must chain exactly, as fsck checks.
 */
final class Segment {
    static final byte[] SEG_MAGIC = "TRSEGSL1".getBytes(StandardCharsets.US_ASCII);
    static final int FOOTER_LEN = 192;
    static final int LEAF_CAP = 1022;
    static final int HEADER = 17; // row_len u32, schema_ver u32, commit_ts u64, flags u8
    static final int DELETED = 0x01;
    static final long RUN = 8 << 20;
    static final int UNORDERED = 99; // a comparison with NaN

    final SealedObject obj;
    final String where;
    final long rows;
    final long rowsLen;
    final long[] offsets;
    long decodeNanos;

    Segment(SealedObject obj) throws IOException {
        this.obj = obj;
        this.where = obj.where;
        long at = obj.logicalSize - FOOTER_LEN;
        if (at < 0) throw new CorruptObjectException(where, 0, "file too short for a segment footer");
        ByteBuffer f = SealedObject.le(obj.read(at, obj.logicalSize));
        if (!Arrays.equals(Arrays.copyOfRange(f.array(), 0, 8), SEG_MAGIC)) {
            throw new CorruptObjectException(where, at, "bad segment magic (logical offset)");
        }
        if (SealedObject.crc(f.array(), 0, 188) != f.getInt(188)) {
            throw new CorruptObjectException(where, at, "segment footer checksum mismatch (logical offset)");
        }
        if (f.getShort(8) != 1 || f.getShort(10) != FOOTER_LEN) {
            throw new CorruptObjectException(where, at, "unsupported segment version " + f.getShort(8));
        }
        rows = f.getLong(16);
        rowsLen = f.getLong(32);
        int indexCrc = f.getInt(156);
        if (rows < 0 || rowsLen < 0 || rowsLen > at) throw new CorruptObjectException(where, at, "footer sizes out of range");
        byte[] index = obj.read(rowsLen, at);
        if (SealedObject.crc(index, 0, index.length) != indexCrc) {
            throw new CorruptObjectException(where, rowsLen, "index pages do not match the footer's index_crc (logical offset)");
        }
        offsets = leafLevel(SealedObject.le(index), index.length / 4);
    }

    /** Row offsets from the leaf pages packed at the start of the index section (``u32 first | u32 count | u32 offset[count]``). */
    private long[] leafLevel(ByteBuffer words, int nwords) {
        long[] out = new long[(int) rows];
        int pos = 0;
        long expect = 0;
        boolean any = false;
        while (expect < rows || !any) {
            if (pos + 2 > nwords) throw new CorruptObjectException(where, rowsLen + 4L * pos, "leaf level ends before the footer's row count");
            long first = words.getInt(4 * pos) & 0xffffffffL;
            long count = words.getInt(4 * pos + 4) & 0xffffffffL;
            if (first != expect || count > LEAF_CAP || pos + 2 + count > nwords || (count == 0 && rows > 0)) {
                throw new CorruptObjectException(where, rowsLen + 4L * pos, "leaf page at localid " + first + " (expected "
                        + expect + ") holding " + count + " rows is inconsistent");
            }
            for (int i = 0; i < count && expect + i < rows; i++) out[(int) (expect + i)] = words.getInt(4 * (pos + 2 + i)) & 0xffffffffL;
            pos += 2 + (int) count;
            expect += count;
            any = true;
        }
        if (expect != rows) throw new CorruptObjectException(where, rowsLen, "leaf counts do not add up to the row count");
        for (int i = 0; i < rows; i++) {
            if ((i == 0 && out[0] != 0) || (i > 0 && out[i] <= out[i - 1]) || out[i] >= rowsLen) {
                throw new CorruptObjectException(where, rowsLen, "leaf offsets are not increasing inside the row section");
            }
        }
        return out;
    }

    /** Where the run that starts at row ``a`` ends (exclusive): whole rows, about RUN bytes. */
    int runEnd(int a) {
        long limit = offsets[a] + RUN;
        int lo = a + 1, hi = offsets.length;
        while (lo < hi) { // the first row at or past limit
            int mid = (lo + hi) >>> 1;
            if (offsets[mid] < limit) lo = mid + 1; else hi = mid;
        }
        return lo;
    }

    long end(int b) {
        return b < offsets.length ? offsets[b] : rowsLen;
    }

    // -- decoding rows ------------------------------------------------------------------

    /** How rows of one schema version yield the wanted columns (by column id). */
    static final class Layout {
        final int version;
        final int nulls = HEADER;
        final int vendOff;
        final int varArea;
        final int nvar;
        final int[] pos; // per wanted column: its position in the version (null bit), -1 if absent
        final int[] at; // per wanted column: fixed offset in the row, or var slot
        final boolean[] var;

        Layout(Types.Schema s, Types.Col[] want) {
            version = s.version;
            int nb = (s.columns.size() + 7) / 8;
            Map<Integer, Integer> fixedAt = new HashMap<>();
            Map<Integer, Integer> slot = new HashMap<>();
            int off = HEADER + nb;
            int v = 0;
            for (Types.Col c : s.columns) {
                if (c.kind.variable()) slot.put(c.id, v++);
                else {
                    fixedAt.put(c.id, off);
                    off += c.kind.width;
                }
            }
            vendOff = off;
            nvar = v;
            varArea = off + 4 * v;
            pos = new int[want.length];
            at = new int[want.length];
            var = new boolean[want.length];
            for (int j = 0; j < want.length; j++) {
                Types.Col w = want[j];
                pos[j] = -1;
                for (int i = 0; i < s.columns.size(); i++) {
                    Types.Col c = s.columns.get(i);
                    if (c.id == w.id && c.type.equals(w.type)) { // by id; a retyped column reads as null
                        pos[j] = i;
                        var[j] = c.kind.variable();
                        at[j] = var[j] ? slot.get(c.id) : fixedAt.get(c.id);
                    }
                }
            }
        }
    }

    /** Decodes rows of any version into the wanted columns and evaluates the predicates on them. */
    static final class Decoder {
        final Types.Col[] want; // output columns first, then the ones only predicates need
        final int outputs;
        final Map<Integer, Types.Schema> versions;
        final Map<Integer, Layout> layouts = new HashMap<>();
        final Predicates preds;
        final int[] termSlot; // per term: index into want
        final int bboxSlot;
        final String where;
        final byte[] hex = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);
        final byte[] uuid = new byte[36];

        Decoder(Types.Col[] want, int outputs, Map<Integer, Types.Schema> versions, Predicates preds, String where) {
            this.want = want;
            this.outputs = outputs;
            this.versions = versions;
            this.preds = preds;
            this.where = where;
            termSlot = new int[preds.terms.size()];
            for (int i = 0; i < termSlot.length; i++) termSlot[i] = slotOf(preds.terms.get(i).columnId);
            bboxSlot = preds.bboxColumn < 0 ? -1 : slotOf(preds.bboxColumn);
        }

        private int slotOf(int id) {
            for (int j = 0; j < want.length; j++) if (want[j].id == id) return j;
            throw new IllegalStateException("predicate column " + id + " is not decoded");
        }

        private int lastVersion = -1;
        private Layout last;

        boolean knows(int version) {
            return version == lastVersion || versions.containsKey(version);
        }

        Layout layout(int version, long offset) {
            if (version == lastVersion) return last; // rows of one version come in long runs
            Layout l = layouts.get(version);
            if (l == null) {
                Types.Schema s = versions.get(version);
                if (s == null) throw new CorruptObjectException(where, offset, "row names schema version " + version + " the plan does not know");
                l = new Layout(s, want);
                layouts.put(version, l);
            }
            lastVersion = version;
            last = l;
            return l;
        }

        /** Checks a row's length against its fields (the rows chain is checked by the caller). */
        Layout check(ByteBuffer b, int r, int len, long base) {
            Layout l = layout(b.getInt(r + 4), base + r);
            int expect = l.varArea;
            int prev = 0;
            for (int k = 0; k < l.nvar; k++) {
                int e = b.getInt(r + l.vendOff + 4 * k);
                if (e < prev) throw new CorruptObjectException(where, base + r, "row length disagrees with its fields (logical offset)");
                prev = e;
            }
            if ((long) expect + prev != len) throw new CorruptObjectException(where, base + r, "row length disagrees with its fields (logical offset)");
            return l;
        }

        boolean isNull(ByteBuffer b, int r, Layout l, int j) {
            int p = l.pos[j];
            return p < 0 || ((b.get(r + HEADER + (p >> 3)) >> (p & 7)) & 1) != 0;
        }

        int varStart(ByteBuffer b, int r, Layout l, int slot) {
            return r + l.varArea + (slot == 0 ? 0 : b.getInt(r + l.vendOff + 4 * (slot - 1)));
        }

        int varLen(ByteBuffer b, int r, Layout l, int slot) {
            int end = b.getInt(r + l.vendOff + 4 * slot);
            return end - (slot == 0 ? 0 : b.getInt(r + l.vendOff + 4 * (slot - 1)));
        }

        boolean matches(ByteBuffer b, int r, Layout l) {
            for (int i = 0; i < termSlot.length; i++) {
                if (!term(b, r, l, termSlot[i], preds.terms.get(i))) return false;
            }
            if (bboxSlot >= 0) {
                if (isNull(b, r, l, bboxSlot)) return false;
                int a = l.at[bboxSlot];
                if (!preds.bboxIsBox) {
                    double x = b.getDouble(a + r), y = b.getDouble(a + r + 8);
                    return x >= preds.xmin && x <= preds.xmax && y >= preds.ymin && y <= preds.ymax;
                }
                return b.getDouble(r + a) <= preds.xmax && b.getDouble(r + a + 16) >= preds.xmin
                        && b.getDouble(r + a + 8) <= preds.ymax && b.getDouble(r + a + 24) >= preds.ymin;
            }
            return true;
        }

        private boolean term(ByteBuffer b, int r, Layout l, int j, Predicates.Term t) {
            if (isNull(b, r, l, j)) return false;
            int a = r + l.at[j];
            switch (t.kind) {
                case STRING: case BINARY: {
                    int s = varStart(b, r, l, l.at[j]);
                    return Predicates.holds(t.op, Predicates.compareBytes(b.array(), s, varLen(b, r, l, l.at[j]), t.bytes));
                }
                case UUID: return Predicates.holds(t.op, Predicates.compareBytes(b.array(), a, 16, t.bytes));
                case BOOL: return Predicates.holds(t.op, Boolean.compare(b.get(a) != 0, t.bool));
                case FLOAT32: return Predicates.holdsDouble(t.op, b.getFloat(a), t.dbl);
                case FLOAT64: return Predicates.holdsDouble(t.op, b.getDouble(a), t.dbl);
                case RANGE: {
                    int flags = b.get(a + 16);
                    int cl, ch;
                    if (t.elem == Types.Kind.FLOAT64) {
                        cl = cmpD(b.getDouble(a), t.dbl);
                        ch = cmpD(b.getDouble(a + 8), t.dbl);
                    } else {
                        cl = Predicates.compareInt(b.getLong(a), false, t.big);
                        ch = Predicates.compareInt(b.getLong(a + 8), false, t.big);
                    }
                    return rangeOverlaps(t, ch, cl, flags);
                }
                default:
                    return Predicates.holds(t.op, Predicates.compareInt(intValue(b, a, t.kind), unsigned(t.kind), t.big));
            }
        }

        private static boolean rangeOverlaps(Predicates.Term t, int ch, int cl, int flags) {
            if (ch == UNORDERED && (flags & 8) == 0) ch = Integer.MIN_VALUE; // NaN bound: fails the checks it takes part in
            if (cl == UNORDERED && (flags & 4) == 0) cl = Integer.MAX_VALUE;
            return Predicates.rangeOverlaps(t, ch, cl, flags);
        }

        private static int cmpD(double x, double v) {
            return x < v ? -1 : x > v ? 1 : x == v ? 0 : UNORDERED;
        }

        static boolean unsigned(Types.Kind k) {
            return k == Types.Kind.UINT8 || k == Types.Kind.UINT16 || k == Types.Kind.UINT32 || k == Types.Kind.UINT64;
        }

        static long intValue(ByteBuffer b, int a, Types.Kind k) {
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

        /** Writes wanted column ``j`` of the row at ``r`` into ``v`` at ``i``. */
        void put(ByteBuffer b, int r, Layout l, int j, WritableColumnVector v, int i) {
            Types.Col c = want[j];
            if (isNull(b, r, l, j)) {
                v.putNull(i);
                if (c.kind == Types.Kind.POINT || c.kind == Types.Kind.BOX || c.kind == Types.Kind.RANGE) {
                    int n = c.kind == Types.Kind.POINT ? 2 : 4;
                    for (int k = 0; k < n; k++) v.getChild(k).putNull(i);
                }
                return;
            }
            v.putNotNull(i);
            int a = r + l.at[j];
            byte[] arr = b.array();
            switch (c.kind) {
                case INT8: v.putByte(i, b.get(a)); break;
                case INT16: v.putShort(i, b.getShort(a)); break;
                case INT32: case DATE: v.putInt(i, b.getInt(a)); break;
                case INT64: case TIMESTAMP: v.putLong(i, b.getLong(a)); break;
                case UINT8: v.putShort(i, (short) (b.get(a) & 0xff)); break;
                case UINT16: v.putInt(i, b.getShort(a) & 0xffff); break;
                case UINT32: v.putLong(i, b.getInt(a) & 0xffffffffL); break;
                case UINT64: {
                    long u = b.getLong(a);
                    BigInteger bi = BigInteger.valueOf(u);
                    if (u < 0) bi = bi.add(BigInteger.ONE.shiftLeft(64));
                    v.putByteArray(i, bi.toByteArray()); // decimal(20, 0): the unscaled value's two's complement
                    break;
                }
                case FLOAT32: v.putFloat(i, b.getFloat(a)); break;
                case FLOAT64: v.putDouble(i, b.getDouble(a)); break;
                case BOOL: v.putBoolean(i, b.get(a) != 0); break;
                case STRING: case BINARY: case JSON: {
                    int slot = l.at[j];
                    v.putByteArray(i, arr, varStart(b, r, l, slot), varLen(b, r, l, slot));
                    break;
                }
                case UUID: {
                    int o = 0;
                    for (int k = 0; k < 16; k++) {
                        if (k == 4 || k == 6 || k == 8 || k == 10) uuid[o++] = '-';
                        uuid[o++] = hex[(arr[a + k] >> 4) & 15];
                        uuid[o++] = hex[arr[a + k] & 15];
                    }
                    v.putByteArray(i, uuid, 0, 36);
                    break;
                }
                case POINT:
                    v.getChild(0).putDouble(i, b.getDouble(a));
                    v.getChild(1).putDouble(i, b.getDouble(a + 8));
                    break;
                case BOX:
                    for (int k = 0; k < 4; k++) v.getChild(k).putDouble(i, b.getDouble(a + 8 * k));
                    break;
                case RANGE: {
                    int flags = b.get(a + 16);
                    for (int k = 0; k < 2; k++) {
                        WritableColumnVector e = v.getChild(k);
                        if ((flags & (k == 0 ? 4 : 8)) != 0) e.putNull(i);
                        else if (c.elem == Types.Kind.FLOAT64) e.putDouble(i, b.getDouble(a + 8 * k));
                        else e.putLong(i, b.getLong(a + 8 * k));
                    }
                    v.getChild(2).putBoolean(i, (flags & 1) != 0);
                    v.getChild(3).putBoolean(i, (flags & 2) != 0);
                    break;
                }
                default: throw new IllegalStateException(c.kind.toString());
            }
        }
    }

    static Map<Integer, Types.Schema> versionMap(List<Types.Schema> versions) {
        Map<Integer, Types.Schema> m = new HashMap<>();
        for (Types.Schema s : versions) m.put(s.version, s);
        return m;
    }
}
