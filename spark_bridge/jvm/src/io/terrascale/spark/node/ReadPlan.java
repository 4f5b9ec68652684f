package io.terrascale.spark.node;

import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.Schema;
import java.util.List;
import java.util.Optional;

/**
 * A read plan (rowstore/reads/plan.py ``ReadPlan``, docs/openapi.yaml): at {@code asOf}, the
 * table's schema, every schema version rows may be written with, the object store, each offloaded
 * segment to read from it, the partitions whose rows are still on the node ({@code tail}), the
 * lease that keeps the segments, and the typed predicates when they were asked for.
 */
public record ReadPlan(long asOf, Schema schema, List<Schema> versions, String objects, boolean encrypted,
                       List<Sealed> sealed, List<Integer> tail, String lease, Optional<Predicates> predicates) {
    /** The plan format this reader reads (rowstore/reads/plan.py ``PLAN_VERSION``). */
    public static final int VERSION = 1;

    public ReadPlan {
        versions = List.copyOf(versions);
        sealed = List.copyOf(sealed);
        tail = List.copyOf(tail);
    }

    /**
     * One offloaded segment: its object, its rows, and the portable roaring bitmap of the localids
     * visible at T; {@code url} (a presigned GET) and {@code dataKey} (the object's data key) are
     * null unless asked for and applicable.
     */
    public record Sealed(long segid, String key, long objectSize, long rows, byte[] visible, String url, byte[] dataKey) {}
}
