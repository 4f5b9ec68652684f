package io.terrascale.spark.format;

/**
 * Nanoseconds one reader spent per step of reading an object (the benchmark's breakdown,
 * docs/spark.md "Performance"). Owned by the one thread that reads the object.
 */
public final class StepNanos {
    long fetch;
    long verify;
    long decrypt;
    long decompress;

    public long fetch() {
        return fetch;
    }

    public long verify() {
        return verify;
    }

    public long decrypt() {
        return decrypt;
    }

    public long decompress() {
        return decompress;
    }
}
