package io.terrascale.spark;

/**
 * An object (or a block of it) that fails a check of docs/format/: names the object and the
 * offset (the object's, or a logical offset inside the sealed file where the message says so).
 */
public class CorruptObjectException extends BridgeException {
    private static final long serialVersionUID = 1L;
    private final String where;
    private final long offset;
    private final String what;

    public CorruptObjectException(String where, long offset, String what) {
        super("corrupt object " + where + " at offset " + offset + ": " + what);
        this.where = where;
        this.offset = offset;
        this.what = what;
    }

    /** The same failure with {@code context} (which segment and column) after what failed. */
    public CorruptObjectException in(String context) {
        CorruptObjectException e = new CorruptObjectException(where, offset, what + " (" + context + ")");
        e.initCause(this);
        return e;
    }
}
