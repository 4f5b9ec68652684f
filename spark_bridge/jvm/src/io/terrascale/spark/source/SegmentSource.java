package io.terrascale.spark.source;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.ColumnarSegment;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.Schema;
import io.terrascale.spark.format.SealedObject;
import java.io.IOException;
import java.util.List;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/**
 * The rows one task reads from one offloaded segment, of either sealed format
 * (docs/format/segment.md §3 row-wise: {@link SegmentRows}; §7 columnar: {@link ColumnarRows}):
 * localids {@code [first, end)} that the plan's bitmap marks visible at T, not deletions,
 * matching the predicates, in localid order, into the output columns.
 */
interface SegmentSource {
    /** Fills {@code vectors} (the output columns) with up to {@code max} rows; returns how many. */
    int fill(WritableColumnVector[] vectors, int max) throws IOException;

    /** Whether rows remain to be looked at. */
    boolean more();

    long decodeNanos();

    /** The reader of {@code obj}'s segment, by the format its last bytes name. */
    static SegmentSource open(SealedObject obj, List<Column> output, List<Schema> versions, Predicates preds,
                              byte[] visibleBitmap, long first, long end) throws IOException {
        if (ColumnarSegment.is(obj)) return new ColumnarRows(obj, output, preds, visibleBitmap, first, end);
        return new SegmentRows(obj, output, versions, preds, visibleBitmap, first, end);
    }
}
