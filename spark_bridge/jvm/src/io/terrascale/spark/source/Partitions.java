package io.terrascale.spark.source;

import org.apache.spark.sql.connector.read.InputPartition;

/** The input partitions of a scan: what one task reads, shipped to it by Spark. */
final class Partitions {
    private Partitions() {}

    /**
     * Rows {@code [firstRow, endRow)} of one offloaded segment (several tasks share a large one):
     * {@code visible} is the plan's portable roaring bitmap of the localids visible at T; {@code url}
     * a presigned GET of the object, or null (read it from the store URI); {@code dataKey} the object's
     * data key from the plan (encrypted data, no key_file), or null.
     */
    record Segment(long segid, String key, long objectSize, byte[] visible, String url, long firstRow, long endRow,
                   byte[] dataKey) implements InputPartition {}

    /** {@code count()}: the visible rows of one offloaded segment, known from the plan. */
    record Count(long rows) implements InputPartition {}

    /** An aggregate the node answered whole at T (an Arrow IPC stream, fetched on the driver). */
    record Answer(byte[] stream) implements InputPartition {}

    /** The partial aggregate of one table partition at T, asked of the node by the task; Spark merges them. */
    record Partial(int partition, AggregatePushdown.Query query) implements InputPartition {}

    /** One table partition's unsealed tail, fetched from the node; -1: an empty plan (Spark still runs one task). */
    record Tail(int partition) implements InputPartition {}
}
