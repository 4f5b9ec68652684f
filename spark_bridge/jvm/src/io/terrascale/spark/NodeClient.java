package io.terrascale.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;

/**
 * The node endpoints the reader calls (node/http/routes/bridge.py, docs/openapi.yaml tag ``bridge``):
 * snapshot, plan, tail and lease renewal. Requests that are safe to repeat are retried when the
 * node cannot be reached or answers 502/503/504.
 */
final class NodeClient {
    /** A 4xx/5xx answer: status, the documented error code and message. */
    static final class ApiError extends BridgeException {
        final int status;
        final String code;
        final String detail;

        ApiError(String what, int status, String code, String detail) {
            super(what + ": the node answered " + status + " " + code + ": " + detail);
            this.status = status;
            this.code = code;
            this.detail = detail;
        }
    }

    private final Opts opts;
    private final HttpClient http;
    private final String t;

    NodeClient(Opts opts) {
        this.opts = opts;
        this.http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(30)).version(HttpClient.Version.HTTP_1_1)
                .build();
        this.t = URLEncoder.encode(opts.table, StandardCharsets.UTF_8).replace("+", "%20");
    }

    JsonNode snapshot(Long asOf) {
        return json(call("GET", "/v1/tables/" + t + "/snapshot" + (asOf == null ? "" : "?as_of=" + asOf), null, 3));
    }

    /** The read plan (docs/spark.md, "The plan"); ``presign`` asks for per-object URLs when the store is S3. */
    JsonNode plan(long asOf, List<Object[]> where, boolean sealedOnly) {
        ObjectNode d = Types.JSON.createObjectNode();
        d.put("as_of", asOf);
        d.put("sealed_only", sealedOnly);
        d.put("lease_s", opts.leaseS);
        d.put("typed", true);
        d.put("presign", opts.objects == null);
        d.put("keys", opts.keyFile == null); // encrypted objects: their data keys, unless the executors have the KEK
        putPredicates(d, where);
        return json(call("POST", "/v1/tables/" + t + "/plan", d.toString(), 3));
    }

    byte[] tail(int partition, long asOf, List<Object[]> where, long[] sealed) {
        ObjectNode d = Types.JSON.createObjectNode();
        d.put("partition", partition);
        d.put("as_of", asOf);
        ArrayNode s = d.putArray("sealed");
        for (long x : sealed) s.add(x);
        putPredicates(d, where);
        return call("POST", "/v1/tables/" + t + "/tail", d.toString(), 3);
    }

    void renew(String lease, double ttl) {
        ObjectNode d = Types.JSON.createObjectNode();
        d.put("ttl_s", ttl);
        call("POST", "/v1/leases/" + URLEncoder.encode(lease, StandardCharsets.UTF_8) + "/renew", d.toString(), 2);
    }

    private void putPredicates(ObjectNode d, List<Object[]> where) {
        if (where != null && !where.isEmpty()) {
            ArrayNode w = d.putArray("where");
            for (Object[] term : where) {
                ArrayNode a = w.addArray().add((String) term[0]).add((String) term[1]);
                Object v = term[2];
                if (v instanceof String) a.add((String) v);
                else if (v instanceof Boolean) a.add((Boolean) v);
                else if (v instanceof java.math.BigInteger) a.add((java.math.BigInteger) v);
                else if (v instanceof Double || v instanceof Float) a.add(((Number) v).doubleValue());
                else a.add(((Number) v).longValue());
            }
        }
        if (opts.bbox != null) {
            ObjectNode b = d.putObject("bbox");
            b.put("column", opts.bboxColumn);
            b.put("xmin", opts.bbox[0]).put("ymin", opts.bbox[1]).put("xmax", opts.bbox[2]).put("ymax", opts.bbox[3]);
        }
    }

    private static JsonNode json(byte[] body) {
        try {
            return Types.JSON.readTree(body);
        } catch (IOException e) {
            throw new BridgeException("the node's answer is not JSON: " + e.getMessage(), e);
        }
    }

    private byte[] call(String method, String path, String body, int retries) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(opts.endpoint + path))
                .timeout(Duration.ofMillis((long) (opts.timeoutS * 1000)));
        if (opts.token != null) b.header("Authorization", "Bearer " + opts.token);
        if (body != null) {
            b.header("Content-Type", "application/json");
            b.method(method, HttpRequest.BodyPublishers.ofString(body));
        } else {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        }
        HttpRequest req = b.build();
        for (int attempt = 0; ; attempt++) {
            HttpResponse<byte[]> r;
            try {
                r = http.send(req, HttpResponse.BodyHandlers.ofByteArray());
            } catch (IOException e) {
                if (attempt < retries) {
                    backoff(attempt);
                    continue;
                }
                throw new BridgeException("cannot reach the Terrascale node " + opts.endpoint + ": " + e, e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new BridgeException("interrupted while calling the node " + opts.endpoint, e);
            }
            int st = r.statusCode();
            if ((st == 502 || st == 503 || st == 504) && attempt < retries) {
                backoff(attempt);
                continue;
            }
            if (st >= 400) {
                String code = "http_error";
                String msg = new String(r.body(), StandardCharsets.UTF_8);
                try {
                    JsonNode err = Types.JSON.readTree(r.body()).get("error");
                    code = err.get("code").asText();
                    msg = err.get("message").asText();
                } catch (IOException | RuntimeException e) {
                    msg = msg.length() > 200 ? msg.substring(0, 200) : msg;
                }
                throw new ApiError(method + " " + path, st, code, msg);
            }
            return r.body();
        }
    }

    private static void backoff(int attempt) {
        try {
            Thread.sleep(Math.min(200L << attempt, 5000L));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
