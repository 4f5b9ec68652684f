package io.terrascale.spark;

/**
 * Keeps a read's lease alive while a task reads a segment (docs/spark.md, "Leases"): renewed on
 * start (an expired lease fails the task before it reads anything), then every third of its
 * time to live by a daemon thread; {@link #check()} fails the reading thread once a renewal was
 * refused for good.
 */
final class Lease implements AutoCloseable {
    private final Opts opts;
    private final String id;
    private final Thread thread;
    private volatile BridgeException failed;
    private volatile boolean stop;

    Lease(Opts opts, String id) {
        this.opts = opts;
        this.id = id;
        renew(new NodeClient(opts));
        thread = new Thread(this::run, "terrascale-lease-" + id);
        thread.setDaemon(true);
        thread.start();
    }

    private void renew(NodeClient c) {
        for (int attempt = 0; ; attempt++) {
            try {
                c.renew(id, opts.leaseS);
                return;
            } catch (NodeClient.ApiError e) {
                if (e.status != 409) throw e;
                if ("lease_expired".equals(e.code)) {
                    throw new BridgeException("LeaseExpiredError: the read lease " + id + " expired (or was released) "
                            + "before this task renewed it, so the segments of the snapshot may have been "
                            + "garbage-collected; load the DataFrame again (option lease_s sets how long the lease "
                            + "outlives the last read)");
                }
                if (attempt >= 8) throw e;
                sleep(10L * (attempt + 1)); // another task renewed it at the same moment
            }
        }
    }

    private void run() {
        NodeClient c = new NodeClient(opts);
        long every = (long) (opts.leaseS * 1000 / 3);
        while (!stop) {
            sleep(every);
            if (stop) return;
            try {
                renew(c);
            } catch (NodeClient.ApiError e) {
                // the node is briefly unhappy: the lease still has two thirds to run
            } catch (BridgeException e) {
                if (e.getMessage().startsWith("LeaseExpiredError")) {
                    failed = e;
                    return;
                }
            }
        }
    }

    void check() {
        if (failed != null) throw failed;
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    @Override
    public void close() {
        stop = true;
        thread.interrupt();
    }
}
