package io.terrascale.spark.node;

import io.terrascale.spark.BridgeException;

/**
 * A read lease the node refused to renew (409 {@code lease_expired}): from its expiry on, the
 * collector may have taken the snapshot's segments, so the task must not read them.
 */
public class LeaseExpiredException extends BridgeException {
    private static final long serialVersionUID = 1L;

    LeaseExpiredException(String lease, ApiError cause) {
        super("LeaseExpiredError: the read lease " + lease + " expired (or was released) before this task renewed it, "
                + "so the segments of the snapshot may have been garbage-collected; load the DataFrame again (option "
                + "lease_s sets how long the lease outlives the last read)", cause);
    }
}
