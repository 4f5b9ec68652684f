package io.terrascale.spark.node;

import com.fasterxml.jackson.databind.JsonNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Deque;
import java.util.List;

/**
 * A node on loopback (the JDK's HttpServer) that answers from a script: each request takes the
 * next answer — a status and body, or a dropped connection — and is recorded.
 */
final class FakeNode implements AutoCloseable {
    /** What the node saw: method, path with query, headers of interest, body. */
    record Request(String method, String path, String auth, String body) {
        JsonNode json() {
            return Wire.parse(body.getBytes(StandardCharsets.UTF_8), "request");
        }
    }

    private record Answer(int status, String body) {}

    private static final int DROP = -1;

    private final HttpServer server;
    private final Deque<Answer> script = new ArrayDeque<>();
    private final List<Request> seen = Collections.synchronizedList(new ArrayList<>());
    private Answer otherwise = new Answer(500, "{\"error\": {\"code\": \"unscripted\", \"message\": \"no answer left\"}}");

    FakeNode() throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", this::handle);
        server.start();
    }

    Endpoint endpoint(String token) {
        return new Endpoint("http://127.0.0.1:" + server.getAddress().getPort(), token, 10);
    }

    FakeNode then(int status, String body) {
        synchronized (script) {
            script.add(new Answer(status, body));
        }
        return this;
    }

    FakeNode thenDrop() {
        return then(DROP, "");
    }

    /** The answer to every request once the script is used up. */
    FakeNode always(int status, String body) {
        synchronized (script) {
            otherwise = new Answer(status, body);
        }
        return this;
    }

    List<Request> seen() {
        synchronized (seen) {
            return List.copyOf(seen);
        }
    }

    private void handle(HttpExchange x) throws IOException {
        String body = new String(x.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
        seen.add(new Request(x.getRequestMethod(), x.getRequestURI().toString(), x.getRequestHeaders().getFirst("Authorization"), body));
        Answer a;
        synchronized (script) {
            a = script.isEmpty() ? otherwise : script.poll();
        }
        if (a.status() == DROP) { // the connection ends without an answer: a node that died mid-request
            x.close();
            return;
        }
        byte[] out = a.body().getBytes(StandardCharsets.UTF_8);
        x.getResponseHeaders().add("Content-Type", a.body().startsWith("{") ? "application/json" : "application/octet-stream");
        x.sendResponseHeaders(a.status(), out.length == 0 ? -1 : out.length);
        x.getResponseBody().write(out);
        x.close();
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
