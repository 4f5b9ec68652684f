package io.terrascale.spark.node;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.terrascale.spark.BridgeException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.function.Predicate;

/**
 * The node endpoints the JVM reader calls (node/http/routes/bridge.py, docs/openapi.yaml tag
 * {@code bridge}): snapshot, plan, tail and lease renewal, for one table. Immutable, so one client
 * serves any number of threads (over the JVM's one HttpClient).
 *
 * <p>Every call is safe to repeat, so each is retried while the node cannot be reached or answers
 * 502/503/504 (spark_bridge/remote.py does the same): a snapshot and a tail are reads; a plan
 * carries a request id chosen once for all its attempts, so a repeat shares the first attempt's
 * lease instead of taking a second; a renewal sets an expiry, and renewals racing each other (409
 * {@code conflict}) are retried too. An expired lease is told by its code, never by the message.
 */
public final class NodeClient {
    static final List<Integer> UNAVAILABLE = List.of(502, 503, 504); // down, starting or failing over
    static final String ARROW = "application/vnd.apache.arrow.stream";
    static final Retry.Policy READ = new Retry.Policy(4, 200, 5_000);
    static final Retry.Policy RENEW = new Retry.Policy(9, 20, 1_000); // tasks of one job renew at the same moments

    private final Endpoint node;
    private final String table;
    private final String t; // the table, URL-encoded
    private final Retry retry;

    public NodeClient(Endpoint node, String table) {
        this(node, table, Retry.SYSTEM);
    }

    NodeClient(Endpoint node, String table, Retry retry) {
        this.node = node;
        this.table = table;
        this.t = encode(table);
        this.retry = retry;
    }

    public Snapshot snapshot(Long asOf) {
        String q = asOf == null ? "" : "?as_of=" + asOf;
        return Wire.snapshot(Wire.parse(call("GET", "/v1/tables/" + t + "/snapshot" + q, null, READ, NodeClient::unavailable),
                "snapshot of table '" + table + "'"));
    }

    /** The read plan (docs/spark.md, "The plan for the JVM reader"), under a fresh request id. */
    public ReadPlan plan(PlanRequest r) {
        ObjectNode body = Wire.plan(r, UUID.randomUUID().toString().replace("-", ""));
        return Wire.plan(Wire.parse(call("POST", "/v1/tables/" + t + "/plan", body, READ, NodeClient::unavailable),
                "plan of table '" + table + "'"));
    }

    /** One partition's rows at T that are not in {@code sealed} (the plan's segments): an Arrow IPC stream. */
    public byte[] tail(int partition, long asOf, List<WhereTerm> where, BBoxTerm bbox, long[] sealed) {
        return call("POST", "/v1/tables/" + t + "/tail", Wire.tail(partition, asOf, where, bbox, sealed), READ,
                NodeClient::unavailable);
    }

    /** Aggregates at T answered by the node (docs/rfcs/0012-aggregates.md): an Arrow IPC stream, a row per group. */
    public byte[] aggregate(long asOf, List<WhereTerm> where, BBoxTerm bbox, List<String> groupBy,
                            List<String[]> aggregates) {
        return call("POST", "/v1/tables/" + t + "/aggregate", Wire.aggregate(asOf, where, bbox, groupBy, aggregates),
                READ, NodeClient::unavailable, ARROW);
    }

    /** The partial aggregate of one table partition at T (docs/spark.md, "Aggregates"): {@code "partitions": [p]},
     * NaN above every number in min and max ({@code "nan": "largest"}, Spark's order); an Arrow IPC stream. */
    public byte[] partial(int partition, long asOf, List<WhereTerm> where, BBoxTerm bbox, List<String> groupBy,
                          List<String[]> aggregates) {
        ObjectNode body = Wire.aggregate(asOf, where, bbox, groupBy, aggregates);
        body.putArray("partitions").add(partition);
        body.put("nan", "largest");
        return call("POST", "/v1/tables/" + t + "/aggregate", body, READ, NodeClient::unavailable, ARROW);
    }

    /** How many partitions the table has at T ({@code GET /v1/tables/{t}?as_of=T}). */
    public int partitions(long asOf) {
        JsonNode d = Wire.parse(call("GET", "/v1/tables/" + t + "?as_of=" + asOf, null, READ, NodeClient::unavailable),
                "table '" + table + "'");
        if (!d.path("partitions").canConvertToInt() || d.path("partitions").asInt() < 1) {
            throw new BridgeException("table '" + table + "': the node's description has no partition count");
        }
        return d.path("partitions").asInt();
    }

    /** Extends the lease to {@code ttlS} from now, or throws LeaseExpiredException when the node refuses for good. */
    public void renew(String lease, double ttlS) {
        try {
            call("POST", "/v1/leases/" + encode(lease) + "/renew", Wire.renew(ttlS), RENEW, e -> unavailable(e) || racing(e));
        } catch (ApiError e) {
            if (e.status() == 409 && "lease_expired".equals(e.code())) throw new LeaseExpiredException(lease, e);
            throw e;
        }
    }

    static boolean unavailable(Exception e) {
        return e instanceof IOException || (e instanceof ApiError a && UNAVAILABLE.contains(a.status()));
    }

    private static boolean racing(Exception e) {
        return e instanceof ApiError a && a.status() == 409 && "conflict".equals(a.code());
    }

    private byte[] call(String method, String path, ObjectNode body, Retry.Policy policy, Predicate<Exception> retryable) {
        return call(method, path, body, policy, retryable, null);
    }

    private byte[] call(String method, String path, ObjectNode body, Retry.Policy policy, Predicate<Exception> retryable,
                        String accept) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(node.url() + path))
                .timeout(Duration.ofMillis((long) (node.timeoutS() * 1000)));
        if (accept != null) b.header("Accept", accept);
        if (node.token() != null) b.header("Authorization", "Bearer " + node.token());
        if (body != null) {
            b.header("Content-Type", "application/json").method(method, HttpRequest.BodyPublishers.ofString(body.toString()));
        } else {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        }
        HttpRequest req = b.build();
        String what = method + " " + path;
        try {
            return retry.call(policy, () -> send(req, what), retryable);
        } catch (IOException e) {
            throw new BridgeException("cannot reach the Terrascale node " + node.url() + ": " + e, e);
        }
    }

    private static byte[] send(HttpRequest req, String what) throws IOException {
        HttpClient http = Http.client();
        HttpResponse<byte[]> r;
        try {
            r = http.send(req, HttpResponse.BodyHandlers.ofByteArray());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            InterruptedIOException out = new InterruptedIOException("interrupted during " + what);
            out.initCause(e);
            throw out;
        }
        if (r.statusCode() >= 400) throw Wire.error(what, r.statusCode(), r.body());
        return r.body();
    }

    private static String encode(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }
}
