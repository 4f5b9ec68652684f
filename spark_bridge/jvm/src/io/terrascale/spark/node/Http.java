package io.terrascale.spark.node;

import java.net.http.HttpClient;
import java.time.Duration;

/**
 * The one HttpClient of this JVM's reader, for the node's API and for presigned object GETs. An
 * HttpClient is thread-safe, pools connections and runs a selector thread of its own, so one
 * serves every task, lease and plan; a client per call would leave a thread and its connections
 * behind until the collector found them. HTTP/1.1: the node speaks it, and so does S3.
 */
final class Http {
    private Http() {}

    static HttpClient client() {
        return Holder.CLIENT;
    }

    private static final class Holder { // built on first use (class initialisation is thread-safe)
        static final HttpClient CLIENT = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(30))
                .version(HttpClient.Version.HTTP_1_1).build();
    }
}
