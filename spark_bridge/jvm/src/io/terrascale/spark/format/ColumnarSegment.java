package io.terrascale.spark.format;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.CorruptObjectException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * A columnar sealed segment (version 2, docs/format/segment.md §7) inside a sealed object: the
 * 128-byte trailer, the metadata (column table, chunks with statistics, page directory) and the
 * pages of one column chunk at a time, decoded into {@link ColumnData}. Every constant below is
 * part of the format. A page that does not parse fails naming the segment and the column.
 */
public final class ColumnarSegment {
    static final byte[] MAGIC = "TRSEGCL2".getBytes(StandardCharsets.US_ASCII);
    static final int TRAILER = 128;
    static final int META_HEAD = 32, COLUMN = 8, VERSION_HEAD = 12, CHUNK = 84, PAGE = 24;
    static final int HAS_NULLS = 0x01;
    static final int PLAIN = 0, PLAIN_VAR = 1, DICT = 2, FOR = 3, DELTA = 4, BSS = 5, BITS = 6;
    /** The system columns' ids: commit_ts, flags (0x01 a deletion), schema version. */
    public static final int TS_ID = 0xFFFFFFF0, FLAGS_ID = 0xFFFFFFF1, VERSION_ID = 0xFFFFFFF2;
    public static final int FLAGS = 1; // the flags column's index (system columns come first)

    private final SealedObject obj;
    private final int segid;
    private final long rows;
    private final int groupRows;
    private final int[] ids;
    private final Kind[] kinds;
    private final Kind[] elems;
    private final int[] chunkFirst; // groups x columns
    private final int[] chunkPages;
    private final ByteBuffer meta; // the metadata: chunk statistics are read from it where skipping asks
    private final int chunksAt; // where the chunk entries start in it
    private final long[] pageOff;
    private final int[] pageLen;
    private final int[] pageRows;

    /** Whether the object's last bytes are a version-2 trailer's. */
    public static boolean is(SealedObject obj) throws IOException {
        long n = obj.logicalSize();
        return n >= TRAILER && Arrays.equals(obj.read(n - 8, n), MAGIC);
    }

    public ColumnarSegment(SealedObject obj) throws IOException {
        this.obj = obj;
        long at = obj.logicalSize() - TRAILER;
        ByteBuffer t = SealedObject.le(obj.read(at, obj.logicalSize()));
        if (!Arrays.equals(t.array(), 120, 128, MAGIC, 0, 8)) throw corrupt(at, "no columnar segment trailer (logical offset)");
        if (SealedObject.crc(t.array(), 0, 116) != t.getInt(116)) throw corrupt(at, "segment trailer checksum mismatch (logical offset)");
        if (t.getShort(112) != 2 || t.getShort(114) != TRAILER) throw corrupt(at, "unsupported segment version " + t.getShort(112));
        segid = t.getInt(0);
        int groups = t.getInt(4);
        rows = t.getLong(8);
        long metaOff = t.getLong(16);
        int metaLen = t.getInt(24);
        groupRows = t.getInt(60);
        if (metaOff + metaLen != at || rows < 0 || rows > Integer.MAX_VALUE || groupRows <= 0
                || groups != (int) ((rows + groupRows - 1) / groupRows)) {
            throw corrupt(at, "trailer sizes are inconsistent (logical offset)");
        }
        byte[] meta = obj.read(metaOff, at);
        if (SealedObject.crc(meta, 0, meta.length) != t.getInt(28)) throw corrupt(metaOff, "metadata checksum mismatch (logical offset)");
        ByteBuffer m = SealedObject.le(meta);
        int ncol = m.getInt(0), npage = m.getInt(8), nver = m.getInt(12);
        if (ncol != t.getInt(48) || m.getInt(4) != groups || npage != t.getInt(52) || nver != t.getInt(56)) {
            throw corrupt(metaOff, "metadata counts disagree with the trailer");
        }
        int p = META_HEAD;
        ids = new int[ncol];
        kinds = new Kind[ncol];
        elems = new Kind[ncol];
        Kind[] all = Kind.values();
        for (int c = 0; c < ncol; c++, p += COLUMN) {
            ids[c] = m.getInt(p);
            int code = m.get(p + 4) & 0xff, elem = m.get(p + 5) & 0xff;
            if (code < 1 || code > all.length || elem > all.length) throw corrupt(metaOff, "unknown type code " + code);
            kinds[c] = all[code - 1];
            elems[c] = elem == 0 ? null : all[elem - 1];
        }
        for (int v = 0; v < nver; v++) { // the version table: a reader of columns by id needs none of it
            int nc = m.getShort(p + 4) & 0xffff, nk = m.getShort(p + 6) & 0xffff;
            p += VERSION_HEAD + 4 * nc + 2 * nk;
        }
        chunkFirst = new int[groups * ncol];
        chunkPages = new int[groups * ncol];
        this.meta = m;
        chunksAt = p;
        for (int i = 0; i < groups * ncol; i++, p += CHUNK) {
            chunkFirst[i] = m.getInt(p);
            chunkPages[i] = m.getInt(p + 4);
            if ((long) chunkFirst[i] + chunkPages[i] > npage) throw corrupt(metaOff, "a chunk names pages past the directory");
        }
        pageOff = new long[npage];
        pageLen = new int[npage];
        pageRows = new int[npage];
        long expect = 0;
        for (int i = 0; i < npage; i++, p += PAGE) {
            pageOff[i] = m.getLong(p);
            pageLen[i] = m.getInt(p + 8);
            pageRows[i] = m.getInt(p + 16);
            if (pageOff[i] != expect || pageLen[i] < 0) throw corrupt(metaOff, "pages are not packed back to back");
            expect += pageLen[i];
        }
        if (expect != metaOff) throw corrupt(metaOff, "pages do not end at the metadata");
    }

    public int segid() {
        return segid;
    }

    public int rows() {
        return (int) rows;
    }

    public int groupRows() {
        return groupRows;
    }

    public int groups() {
        return chunkFirst.length / Math.max(ids.length, 1);
    }

    public int groupLen(int g) {
        return (int) Math.min(groupRows, rows - (long) g * groupRows);
    }

    /** The column index holding {@code c} (by id, kind and element kind), or -1: its rows are null. */
    public int indexOf(Column c) {
        for (int i = 3; i < ids.length; i++) {
            if (ids[i] == c.id() && kinds[i] == c.kind() && elems[i] == c.elem()) return i;
        }
        return -1;
    }

    /** Every row of group {@code g} null in {@code c}: a column the segment does not have. */
    public ColumnData nulls(Column c, int g) {
        return ColumnData.nulls(c.kind(), c.elem(), groupLen(g));
    }

    /**
     * Whether no row of group {@code g} can match {@code t} by the chunk's null count and bounds
     * (docs/format/segment.md §7.2); false when unsure. A column the segment lacks is null: it
     * matches nothing.
     */
    public boolean misses(int g, Predicates.Term t) {
        int ci = indexOf(t.column());
        if (ci < 0) return true;
        int at = chunksAt + (g * ids.length + ci) * CHUNK;
        if ((meta.getInt(at + 8) & 0xffffffffL) == groupLen(g)) return true; // every row null
        if ((meta.get(at + 16) & 1) == 0) return false;
        Op op = t.op();
        Kind k = kinds[ci];
        int lo, hi; // sign(bound - value)
        switch (k) {
            case STRING: case BINARY: case UUID: case JSON: {
                if (!(t.value() instanceof Predicates.Bytes v)) return false;
                byte[] arr = meta.array();
                int base = meta.arrayOffset();
                lo = Predicates.compareBytes(arr, base + at + 20, meta.get(at + 17) & 0xff, v.v());
                hi = Predicates.compareBytes(arr, base + at + 52, meta.get(at + 18) & 0xff, v.v());
                break;
            }
            case FLOAT32: case FLOAT64: {
                if (!(t.value() instanceof Predicates.Real v) || Double.isNaN(v.v())) return false;
                lo = Double.compare(meta.getDouble(at + 20), v.v());
                hi = Double.compare(meta.getDouble(at + 52), v.v());
                if (meta.getDouble(at + 20) == v.v()) lo = 0; // -0.0 == 0.0 as the predicates compare
                if (meta.getDouble(at + 52) == v.v()) hi = 0;
                break;
            }
            case POINT: case BOX: case RANGE: return false;
            default: {
                java.math.BigInteger v;
                if (t.value() instanceof Predicates.Int i) v = i.v();
                else if (t.value() instanceof Predicates.Bool b) v = java.math.BigInteger.valueOf(b.v() ? 1 : 0);
                else return false;
                lo = Predicates.compareInt(meta.getLong(at + 20), k.unsigned(), v);
                hi = Predicates.compareInt(meta.getLong(at + 52), k.unsigned(), v);
            }
        }
        switch (op) {
            case EQ: return lo > 0 || hi < 0;
            case LT: return lo >= 0;
            case LE: return lo > 0;
            case GT: return hi <= 0;
            case GE: return hi < 0;
            default: return lo == 0 && hi == 0;
        }
    }

    /** Whether no point or box of group {@code g} lies in (overlaps) the bbox, by the chunk's extent. */
    public boolean misses(int g, Predicates.BBox box) {
        int ci = indexOf(box.column());
        if (ci < 0) return true;
        int at = chunksAt + (g * ids.length + ci) * CHUNK;
        if ((meta.getInt(at + 8) & 0xffffffffL) == groupLen(g)) return true;
        if ((meta.get(at + 16) & 1) == 0) return false;
        return box.xmax() < meta.getDouble(at + 20) || box.ymax() < meta.getDouble(at + 28)
                || box.xmin() > meta.getDouble(at + 52) || box.ymin() > meta.getDouble(at + 60);
    }

    /** Group {@code g}'s values of column index {@code ci}: its pages with one read, decoded. */
    public ColumnData read(int g, int ci) throws IOException {
        int k = g * ids.length + ci;
        int a = chunkFirst[k], b = a + chunkPages[k];
        int n = groupLen(g);
        if (a == b) return ColumnData.nulls(kinds[ci], elems[ci], n);
        long lo = pageOff[a];
        byte[] raw;
        try {
            raw = obj.read(lo, pageOff[b - 1] + pageLen[b - 1]);
        } catch (CorruptObjectException e) { // a block of its pages: say whose
            throw e.in("segment " + segid + " column " + columnName(ids[ci]));
        }
        ColumnData[] parts = new ColumnData[b - a];
        int total = 0;
        for (int p = a; p < b; p++) {
            parts[p - a] = page(raw, (int) (pageOff[p] - lo), pageLen[p], ci, pageOff[p]);
            if (parts[p - a].rows != pageRows[p]) throw columnCorrupt(ci, pageOff[p], "page holds " + parts[p - a].rows + " rows, not " + pageRows[p]);
            total += pageRows[p];
        }
        if (total != n) throw columnCorrupt(ci, lo, "chunk of group " + g + " holds " + total + " rows, not " + n);
        return ColumnData.concat(parts, n);
    }

    private ColumnData page(byte[] raw, int off, int len, int ci, long logical) {
        try {
            return decodePage(ByteBuffer.wrap(raw, off, len).slice().order(java.nio.ByteOrder.LITTLE_ENDIAN), kinds[ci], elems[ci]);
        } catch (PageException e) {
            throw columnCorrupt(ci, logical + e.at, e.getMessage());
        } catch (IndexOutOfBoundsException | IllegalArgumentException | NegativeArraySizeException e) {
            throw columnCorrupt(ci, logical, "page does not parse: " + e);
        }
    }

    /** A page's values (docs/format/segment.md §7.3). */
    static ColumnData decodePage(ByteBuffer b, Kind kind, Kind elem) {
        int n = b.getInt(0);
        int flags = b.get(4) & 0xff, streams = b.get(5) & 0xff;
        String[] kinds = streams(kind, elem);
        if (n < 0 || streams != kinds.length || (flags & ~HAS_NULLS) != 0) throw new PageException(0, "page header names " + streams + " streams (flags " + flags + "); the type has " + kinds.length);
        int at = 8;
        boolean[] valid = null;
        if ((flags & HAS_NULLS) != 0) {
            valid = new boolean[n];
            for (int i = 0; i < n; i++) valid[i] = (b.get(at + (i >> 3)) >> (i & 7) & 1) != 0;
            at += (n + 7) / 8;
        }
        int ni = 0, nr = 0;
        for (String s : kinds) {
            if (s.startsWith("i") || s.startsWith("u")) ni++;
            else if (s.startsWith("f")) nr++;
        }
        long[][] ints = ni == 0 ? null : new long[ni][];
        double[][] reals = nr == 0 ? null : new double[nr][];
        boolean[] bools = null;
        byte[] data = null;
        int[] starts = null, lens = null;
        ni = 0;
        nr = 0;
        for (String s : kinds) {
            if (at + 8 > b.limit()) throw new PageException(at, "stream header past the end of the page");
            int enc = b.get(at) & 0xff, width = b.get(at + 1) & 0xff;
            int len = b.getInt(at + 4);
            int body = at + 8;
            if (len < 0 || body + len > b.limit()) throw new PageException(at, "stream past the end of the page");
            switch (s) {
                case "bits": {
                    if (enc != BITS || len != (n + 7) / 8) throw new PageException(at, "bool stream encoding " + enc + " of " + len + " bytes");
                    bools = new boolean[n];
                    for (int i = 0; i < n; i++) bools[i] = (b.get(body + (i >> 3)) >> (i & 7) & 1) != 0;
                    break;
                }
                case "b16": {
                    if (enc != PLAIN || width != 16 || len != 16 * n) throw new PageException(at, "uuid stream encoding " + enc + " of " + len + " bytes");
                    data = new byte[len];
                    b.get(body, data, 0, len);
                    starts = new int[n];
                    lens = new int[n];
                    for (int i = 0; i < n; i++) {
                        starts[i] = 16 * i;
                        lens[i] = 16;
                    }
                    break;
                }
                case "var": {
                    Object[] v = var(b, body, len, enc, width, n, at);
                    data = (byte[]) v[0];
                    starts = (int[]) v[1];
                    lens = (int[]) v[2];
                    break;
                }
                case "f4": case "f8": {
                    int w = s.equals("f4") ? 4 : 8;
                    if (enc != BSS || width != w || len != n * w) throw new PageException(at, "float stream encoding " + enc + " width " + width + " of " + len + " bytes");
                    double[] out = new double[n];
                    for (int i = 0; i < n; i++) {
                        long bits = 0;
                        for (int k = 0; k < w; k++) bits |= (long) (b.get(body + k * n + i) & 0xff) << (8 * k);
                        out[i] = w == 4 ? Float.intBitsToFloat((int) bits) : Double.longBitsToDouble(bits);
                    }
                    reals[nr++] = out;
                    break;
                }
                default:
                    ints[ni++] = integers(b, body, len, enc, width, n, s, at);
            }
            at = body + len;
        }
        if (at != b.limit()) throw new PageException(at, (b.limit() - at) + " bytes after the last stream");
        return new ColumnData(kind, elem, n, valid, ints, reals, bools, data, starts, lens);
    }

    /** The streams of a type: "i1".."i8" / "u1".."u8" integers, "f4" / "f8" floats, "bits", "b16", "var". */
    static String[] streams(Kind kind, Kind elem) {
        switch (kind) {
            case INT8: case INT16: case INT32: case INT64: case DATE: case TIMESTAMP: return new String[] {"i" + kind.width()};
            case UINT8: case UINT16: case UINT32: case UINT64: return new String[] {"u" + kind.width()};
            case FLOAT32: return new String[] {"f4"};
            case FLOAT64: return new String[] {"f8"};
            case BOOL: return new String[] {"bits"};
            case UUID: return new String[] {"b16"};
            case STRING: case BINARY: case JSON: return new String[] {"var"};
            case POINT: return new String[] {"f8", "f8"};
            case BOX: return new String[] {"f8", "f8", "f8", "f8"};
            default: return elem == Kind.FLOAT64 ? new String[] {"f8", "f8", "u1"} : new String[] {"i8", "i8", "u1"};
        }
    }

    private static long[] integers(ByteBuffer b, int body, int len, int enc, int width, int n, String s, int at) {
        int w = s.charAt(1) - '0';
        boolean signed = s.charAt(0) == 'i';
        long[] out = new long[n];
        if (enc == PLAIN) {
            if (width != w || len != n * w) throw new PageException(at, "plain stream of " + len + " bytes for " + n + " values");
            for (int i = 0; i < n; i++) out[i] = packed(b, body + i * w, w, signed);
            return out;
        }
        if (width != 0 && width != 1 && width != 2 && width != 4 && width != 8) throw new PageException(at, "integer stream width " + width);
        if (enc == FOR) {
            if (len != 8 + width * n) throw new PageException(at, "frame-of-reference stream width " + width + " of " + len + " bytes");
            long base = b.getLong(body);
            for (int i = 0; i < n; i++) out[i] = base + (width == 0 ? 0 : packed(b, body + 8 + i * width, width, false));
            return out;
        }
        if (enc == DELTA) {
            if (n == 0 || len != 16 + width * (n - 1)) throw new PageException(at, "delta stream width " + width + " of " + len + " bytes");
            long v = b.getLong(body), step = b.getLong(body + 8);
            out[0] = v;
            for (int i = 1; i < n; i++) {
                v += step + (width == 0 ? 0 : packed(b, body + 16 + (i - 1) * width, width, false));
                out[i] = v;
            }
            return out;
        }
        throw new PageException(at, "unknown integer encoding " + enc);
    }

    /** A little-endian integer of {@code w} bytes, sign- or zero-extended to 64 bits. */
    private static long packed(ByteBuffer b, int a, int w, boolean signed) {
        switch (w) {
            case 1: return signed ? b.get(a) : b.get(a) & 0xffL;
            case 2: return signed ? b.getShort(a) : b.getShort(a) & 0xffffL;
            case 4: return signed ? b.getInt(a) : b.getInt(a) & 0xffffffffL;
            default: return b.getLong(a);
        }
    }

    /** (data, starts, lengths) of a variable-width stream, PLAIN_VAR or DICT. */
    private static Object[] var(ByteBuffer b, int body, int len, int enc, int width, int n, int at) {
        int[] starts = new int[n], lens = new int[n];
        if (enc == PLAIN_VAR) {
            int dataAt = body + 4 * (n + 1);
            if (4 * (n + 1) > len) throw new PageException(at, "offsets past the end of the stream");
            int size = len - 4 * (n + 1);
            int prev = b.getInt(body);
            if (prev != 0) throw new PageException(at, "value offsets are not increasing from 0 to the stream's end");
            for (int i = 0; i < n; i++) {
                int next = b.getInt(body + 4 * (i + 1));
                if (next < prev || next > size) throw new PageException(at, "value offsets are not increasing from 0 to the stream's end");
                starts[i] = prev;
                lens[i] = next - prev;
                prev = next;
            }
            if (prev != size) throw new PageException(at, "value offsets are not increasing from 0 to the stream's end");
            byte[] data = new byte[size];
            b.get(dataAt, data, 0, size);
            return new Object[] {data, starts, lens};
        }
        if (enc == DICT) {
            if (width != 1 && width != 2 && width != 4) throw new PageException(at, "dictionary index width " + width);
            int count = b.getInt(body);
            int idxAt = body + len - width * n;
            int dataAt = body + 4 + 4 * (count + 1);
            if (count < 0 || dataAt > idxAt) throw new PageException(at, "dictionary past the end of the stream");
            int size = idxAt - dataAt;
            int[] doffs = new int[count + 1];
            for (int i = 0; i <= count; i++) {
                doffs[i] = b.getInt(body + 4 + 4 * i);
                if ((i == 0 && doffs[0] != 0) || (i > 0 && doffs[i] < doffs[i - 1]) || doffs[i] > size) {
                    throw new PageException(at, "value offsets are not increasing from 0 to the stream's end");
                }
            }
            if (doffs[count] != size) throw new PageException(at, "value offsets are not increasing from 0 to the stream's end");
            for (int i = 0; i < n; i++) {
                long k = packed(b, idxAt + i * width, width, false);
                if (k >= count) throw new PageException(at, "a dictionary index past the dictionary");
                starts[i] = doffs[(int) k];
                lens[i] = doffs[(int) k + 1] - doffs[(int) k];
            }
            byte[] data = new byte[size];
            b.get(dataAt, data, 0, size);
            return new Object[] {data, starts, lens};
        }
        throw new PageException(at, "unknown string encoding " + enc);
    }

    private CorruptObjectException corrupt(long offset, String what) {
        return new CorruptObjectException(obj.where(), offset, what);
    }

    private CorruptObjectException columnCorrupt(int ci, long logical, String what) {
        return new CorruptObjectException(obj.where(), logical, what + " (logical offset; segment " + segid + " column "
                + columnName(ids[ci]) + ")");
    }

    static String columnName(int id) {
        switch (id) {
            case TS_ID: return "commit_ts";
            case FLAGS_ID: return "flags";
            case VERSION_ID: return "schema_version";
            default: return "id " + id;
        }
    }

    /** A page that does not parse, at byte {@link #at} of the page. */
    static final class PageException extends BridgeException {
        private static final long serialVersionUID = 1L;
        final int at;

        PageException(int at, String what) {
            super(what);
            this.at = at;
        }
    }
}
