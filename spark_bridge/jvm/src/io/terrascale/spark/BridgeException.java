package io.terrascale.spark;

/** The one error type of the JVM reader: options, the node's answers, objects that fail checks. */
class BridgeException extends RuntimeException {
    BridgeException(String message) {
        super(message);
    }

    BridgeException(String message, Throwable cause) {
        super(message, cause);
    }
}

/** An object (or a block of it) that fails a check of docs/format/: names the object and offset. */
class CorruptObjectException extends BridgeException {
    CorruptObjectException(String where, long offset, String what) {
        super("corrupt object " + where + " at offset " + offset + ": " + what);
    }
}
