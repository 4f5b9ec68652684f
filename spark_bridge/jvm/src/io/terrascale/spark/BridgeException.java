package io.terrascale.spark;

/**
 * The JVM reader's error (as spark_bridge/errors.py is the Python side's): bad options, the
 * node's refusals, objects that fail a check. Every layer throws it or a subclass, with one line
 * that says what to do.
 */
public class BridgeException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public BridgeException(String message) {
        super(message);
    }

    public BridgeException(String message, Throwable cause) {
        super(message, cause);
    }
}
