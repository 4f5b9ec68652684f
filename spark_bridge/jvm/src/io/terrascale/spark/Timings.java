package io.terrascale.spark;

import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Where the JVM reader's time goes, summed over every segment task of this JVM (local mode runs
 * executors in the driver's JVM, so ``python -m bench spark`` reads it through py4j): nanoseconds
 * fetching object bytes, verifying checksums, decrypting, decompressing and decoding rows, and the
 * rows and bytes read.
 */
public final class Timings {
    private Timings() {}

    static final String[] NAMES = {"fetch", "verify", "decrypt", "decompress", "decode", "rows", "segments"};
    private static final AtomicLongArray SUMS = new AtomicLongArray(NAMES.length);

    static void add(long[] objNanos, long decodeNanos, long rows) {
        for (int i = 0; i < 4; i++) SUMS.addAndGet(i, objNanos[i]);
        SUMS.addAndGet(4, decodeNanos);
        SUMS.addAndGet(5, rows);
        SUMS.addAndGet(6, 1);
    }

    /** ``fetch=… verify=… decrypt=… decompress=… decode=…`` (ns), ``rows=… segments=…``. */
    public static String snapshot() {
        StringBuilder s = new StringBuilder();
        for (int i = 0; i < NAMES.length; i++) s.append(i == 0 ? "" : " ").append(NAMES[i]).append('=').append(SUMS.get(i));
        return s.toString();
    }

    public static void reset() {
        for (int i = 0; i < NAMES.length; i++) SUMS.set(i, 0);
    }
}
