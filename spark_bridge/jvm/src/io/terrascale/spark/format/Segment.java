package io.terrascale.spark.format;

import io.terrascale.spark.CorruptObjectException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * A sealed segment (docs/format/segment.md §3) inside a sealed object: the 192-byte footer and
 * the leaf level of the B+ tree (every row's offset). Rows (§1) are read in runs of whole rows
 * (~8 MiB of logical bytes, one ranged read each); {@link #readRun} checks that a run's rows
 * chain exactly, as fsck does. Constants are part of the format.
 */
public final class Segment {
    static final byte[] SEG_MAGIC = "TRSEGSL1".getBytes(StandardCharsets.US_ASCII);
    static final int FOOTER_LEN = 192;
    static final int LEAF_CAP = 1022;
    /** row_len u32 | schema_ver u32 | commit_ts u64 | flags u8. */
    public static final int ROW_HEADER = 17;
    static final int DELETED = 0x01;
    static final long RUN = 8 << 20;

    private final SealedObject obj;
    private final long rows;
    private final long rowsLen;
    private final long[] offsets;

    public Segment(SealedObject obj) throws IOException {
        this.obj = obj;
        long at = obj.logicalSize() - FOOTER_LEN;
        if (at < 0) throw corrupt(0, "file too short for a segment footer");
        ByteBuffer f = SealedObject.le(obj.read(at, obj.logicalSize()));
        if (!Arrays.equals(f.array(), 0, 8, SEG_MAGIC, 0, 8)) throw corrupt(at, "bad segment magic (logical offset)");
        if (SealedObject.crc(f.array(), 0, 188) != f.getInt(188)) {
            throw corrupt(at, "segment footer checksum mismatch (logical offset)");
        }
        if (f.getShort(8) != 1 || f.getShort(10) != FOOTER_LEN) throw corrupt(at, "unsupported segment version " + f.getShort(8));
        rows = f.getLong(16);
        rowsLen = f.getLong(32);
        int indexCrc = f.getInt(156);
        if (rows < 0 || rows > Integer.MAX_VALUE || rowsLen < 0 || rowsLen > at) throw corrupt(at, "footer sizes out of range");
        byte[] index = obj.read(rowsLen, at);
        if (SealedObject.crc(index, 0, index.length) != indexCrc) {
            throw corrupt(rowsLen, "index pages do not match the footer's index_crc (logical offset)");
        }
        offsets = leafLevel(SealedObject.le(index), index.length / 4);
    }

    /** Row offsets from the leaf pages packed at the start of the index section ({@code u32 first | u32 count | u32 offset[count]}). */
    private long[] leafLevel(ByteBuffer words, int nwords) {
        long[] out = new long[(int) rows];
        int pos = 0;
        long expect = 0;
        boolean any = false;
        while (expect < rows || !any) {
            if (pos + 2 > nwords) throw corrupt(rowsLen + 4L * pos, "leaf level ends before the footer's row count");
            long first = words.getInt(4 * pos) & 0xffffffffL;
            long count = words.getInt(4 * pos + 4) & 0xffffffffL;
            if (first != expect || count > LEAF_CAP || pos + 2 + count > nwords || (count == 0 && rows > 0)) {
                throw corrupt(rowsLen + 4L * pos, "leaf page at localid " + first + " (expected " + expect + ") holding "
                        + count + " rows is inconsistent");
            }
            for (int i = 0; i < count && expect + i < rows; i++) out[(int) (expect + i)] = words.getInt(4 * (pos + 2 + i)) & 0xffffffffL;
            pos += 2 + (int) count;
            expect += count;
            any = true;
        }
        if (expect != rows) throw corrupt(rowsLen, "leaf counts do not add up to the row count");
        for (int i = 0; i < rows; i++) {
            if ((i == 0 && out[0] != 0) || (i > 0 && out[i] <= out[i - 1]) || out[i] >= rowsLen) {
                throw corrupt(rowsLen, "leaf offsets are not increasing inside the row section");
            }
        }
        return out;
    }

    public int rows() {
        return offsets.length;
    }

    /** The logical offset of row {@code i} (its localid), or the end of the rows for {@code i == rows()}. */
    public long offset(int i) {
        return i < offsets.length ? offsets[i] : rowsLen;
    }

    /** Where the run that starts at row {@code a} ends (exclusive): whole rows, about RUN bytes. */
    public int runEnd(int a) {
        long limit = offsets[a] + RUN;
        int lo = a + 1, hi = offsets.length;
        while (lo < hi) { // the first row at or past limit
            int mid = (lo + hi) >>> 1;
            if (offsets[mid] < limit) lo = mid + 1; else hi = mid;
        }
        return lo;
    }

    /** Rows {@code [a, b)} as one buffer (row {@code a} at 0), each checked to end where the next begins. */
    public ByteBuffer readRun(int a, int b) throws IOException {
        long lo = offsets[a];
        ByteBuffer buf = SealedObject.le(obj.read(lo, offset(b)));
        for (int i = a; i < b; i++) {
            long len = buf.getInt((int) (offsets[i] - lo)) & 0xffffffffL;
            if (len < ROW_HEADER || offsets[i] + len != offset(i + 1)) {
                throw corrupt(offsets[i], "row does not end where the next one begins (logical offset)");
            }
        }
        return buf;
    }

    /** Whether the row at {@code r} is a deletion (a tombstone: the key only). */
    public static boolean deleted(ByteBuffer b, int r) {
        return (b.get(r + 16) & DELETED) != 0;
    }

    public static int version(ByteBuffer b, int r) {
        return b.getInt(r + 4);
    }

    private CorruptObjectException corrupt(long offset, String what) {
        return new CorruptObjectException(obj.where(), offset, what);
    }
}
