package io.terrascale.spark.source;

import io.terrascale.spark.format.StepNanos;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Where the JVM reader's time goes, summed over every segment task of this JVM (local mode runs
 * executors in the driver's JVM, so {@code python -m bench spark} reads it through py4j):
 * nanoseconds fetching object bytes, verifying checksums, decrypting, decompressing and decoding
 * rows, and the rows and segments read.
 */
public final class Timings {
    private Timings() {}

    private static final String[] NAMES = {"fetch", "verify", "decrypt", "decompress", "decode", "rows", "segments"};
    private static final AtomicLongArray SUMS = new AtomicLongArray(NAMES.length);

    static void add(StepNanos steps, long decodeNanos, long rows) {
        long[] v = {steps.fetch(), steps.verify(), steps.decrypt(), steps.decompress(), decodeNanos, rows, 1};
        for (int i = 0; i < v.length; i++) SUMS.addAndGet(i, v[i]);
    }

    /** {@code fetch=… verify=… decrypt=… decompress=… decode=…} (ns), {@code rows=… segments=…}. */
    public static String snapshot() {
        StringBuilder s = new StringBuilder();
        for (int i = 0; i < NAMES.length; i++) s.append(i == 0 ? "" : " ").append(NAMES[i]).append('=').append(SUMS.get(i));
        return s.toString();
    }

    public static void reset() {
        for (int i = 0; i < NAMES.length; i++) SUMS.set(i, 0);
    }
}
