package io.terrascale.spark.source;

import io.terrascale.spark.node.Snapshot;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The snapshot a DataFrame reads (docs/spark.md, "Reads: snapshot and visibility"): pinned by
 * {@code load()} (the provider's inferSchema), or by the first scan when the schema was given with
 * {@code .schema(...)}; every scan of the DataFrame reads at it. Spark may plan the DataFrame's
 * actions on other threads than the one that loaded it, so the pin is published atomically.
 */
final class SnapshotPin {
    private final AtomicReference<Snapshot> pinned = new AtomicReference<>();

    Snapshot get() {
        return pinned.get();
    }

    /** {@code load()}: the snapshot it took. */
    void set(Snapshot s) {
        pinned.set(s);
    }

    /** The pinned snapshot, or {@code s} if none was pinned yet (then it is). */
    Snapshot pinIfUnset(Snapshot s) {
        return pinned.compareAndSet(null, s) ? s : pinned.get();
    }
}
