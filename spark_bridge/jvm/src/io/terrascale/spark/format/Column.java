package io.terrascale.spark.format;

import io.terrascale.spark.BridgeException;
import java.io.Serializable;
import java.util.Locale;

/**
 * One column of one schema version (rowstore/schema.py): its stable id, name, type text (e.g.
 * {@code range<int64>}), the type's kind and, for a range, its element kind.
 */
public record Column(int id, String name, String type, Kind kind, Kind elem, boolean nullable) implements Serializable {
    /** A column of type {@code type} (its text as the node writes it). */
    public static Column of(int id, String name, String type, boolean nullable) {
        String t = type.trim().toLowerCase(Locale.ROOT);
        try {
            if (t.startsWith("range<") && t.endsWith(">")) {
                Kind elem = Kind.valueOf(t.substring(6, t.length() - 1).trim().toUpperCase(Locale.ROOT));
                return new Column(id, name, type, Kind.RANGE, elem, nullable);
            }
            return new Column(id, name, type, Kind.valueOf(t.toUpperCase(Locale.ROOT)), null, nullable);
        } catch (IllegalArgumentException e) {
            throw new BridgeException("column '" + name + "' has type '" + type + "', which this reader does not know "
                    + "(a newer node?)", e);
        }
    }

    /** The kind values are compared in: a range's element kind, else the column's own. */
    public Kind valueKind() {
        return kind == Kind.RANGE ? elem : kind;
    }
}
