package io.terrascale.spark.format;

/**
 * The column types' kinds (docs/REFERENCE.md §4) and their storage in a row
 * (docs/format/segment.md §1). The widths are part of the format.
 */
public enum Kind {
    INT8(1), INT16(2), INT32(4), INT64(8), UINT8(1), UINT16(2), UINT32(4), UINT64(8),
    FLOAT32(4), FLOAT64(8), BOOL(1), STRING(-1), BINARY(-1), TIMESTAMP(8), DATE(4), UUID(16),
    JSON(-1), POINT(16), BOX(32), RANGE(17);

    private final int width;

    Kind(int width) {
        this.width = width;
    }

    /** Bytes of the fixed-width storage; -1 for the variable-width kinds. */
    public int width() {
        return width;
    }

    public boolean variable() {
        return width < 0;
    }

    public boolean unsigned() {
        return this == UINT8 || this == UINT16 || this == UINT32 || this == UINT64;
    }
}
