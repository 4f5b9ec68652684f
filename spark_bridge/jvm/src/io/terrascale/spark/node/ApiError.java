package io.terrascale.spark.node;

import io.terrascale.spark.BridgeException;

/** The node's error answer (docs/openapi.yaml ``Error``): the HTTP status, the documented code and message. */
public class ApiError extends BridgeException {
    private static final long serialVersionUID = 1L;

    private final int status;
    private final String code;

    public ApiError(String what, int status, String code, String detail) {
        super(what + ": the node answered " + status + " " + code + ": " + detail);
        this.status = status;
        this.code = code;
    }

    public int status() {
        return status;
    }

    /** The error code; callers go by it, never by the message. */
    public String code() {
        return code;
    }
}
