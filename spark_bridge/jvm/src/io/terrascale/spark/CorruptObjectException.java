package io.terrascale.spark;

/**
 * An object (or a block of it) that fails a check of docs/format/: names the object and the
 * offset (the object's, or a logical offset inside the sealed file where the message says so).
 */
public class CorruptObjectException extends BridgeException {
    private static final long serialVersionUID = 1L;

    public CorruptObjectException(String where, long offset, String what) {
        super("corrupt object " + where + " at offset " + offset + ": " + what);
    }
}
