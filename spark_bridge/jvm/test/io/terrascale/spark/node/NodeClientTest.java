package io.terrascale.spark.node;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Op;
import java.io.IOException;
import java.math.BigInteger;
import java.net.ServerSocket;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The node client against a scripted node: what each call sends, which failures it retries (the
 * node unreachable, 502/503/504, a lost answer; racing renewals) and which it does not, and that
 * a plan's attempts share one request id while each plan has its own.
 */
class NodeClientTest {
    static final String SCHEMA = "{\"version\": 3, \"primary_key\": 1, \"next_column_id\": 4, \"columns\": ["
            + "{\"id\": 1, \"name\": \"id\", \"type\": \"int64\", \"nullable\": false},"
            + "{\"id\": 2, \"name\": \"s\", \"type\": \"string\", \"nullable\": true},"
            + "{\"id\": 3, \"name\": \"loc\", \"type\": \"point\", \"nullable\": true}]}";

    static String plan(String extra) {
        return "{\"version\": 1, \"as_of\": 77, \"table\": \"t\", \"table_id\": \"x\", \"schema\": " + quote(SCHEMA)
                + ", \"versions\": [" + quote(SCHEMA) + "], \"objects\": \"trfs:///data/objects\", \"encrypted\": false,"
                + " \"sealed\": [{\"segid\": 5, \"key\": \"seg/5\", \"object_size\": 1234, \"rows\": 10, \"visible\": \"OjAAAA==\","
                + " \"url\": \"http://s3/seg/5?sig\"}], \"tail\": [0, 2], \"lease\": \"L1\"" + extra + "}";
    }

    static String quote(String s) {
        return Wire.JSON.valueToTree(s).toString();
    }

    private final FakeNode node;
    private final List<Long> waits = new ArrayList<>();
    private final NodeClient client;

    NodeClientTest() throws IOException {
        node = new FakeNode();
        client = new NodeClient(node.endpoint("s3cret"), "my table", new Retry(waits::add, () -> 0.5));
    }

    @AfterEach
    void stop() {
        node.close();
    }

    private static PlanRequest request() {
        return new PlanRequest(77, false, 600, true, false,
                List.of(WhereTerm.text("s", Op.GE, "a b"), WhereTerm.integer("id", Op.LT, 9),
                        new WhereTerm("id", Op.NE, new WhereTerm.Int(BigInteger.ONE.shiftLeft(64))),
                        new WhereTerm("b", Op.EQ, new WhereTerm.Bool(true))),
                new BBoxTerm("loc", -1, -2, 3, 4.5));
    }

    @Test
    void aPlanIsAskedForTypedAndReadIntoRecords() {
        node.then(200, plan(""));
        ReadPlan p = client.plan(request());
        FakeNode.Request r = node.seen().get(0);
        assertEquals("POST", r.method());
        assertEquals("/v1/tables/my%20table/plan", r.path());
        assertEquals("Bearer s3cret", r.auth());
        JsonNode d = r.json();
        assertEquals(77, d.get("as_of").asLong());
        assertTrue(d.get("typed").asBoolean() && d.get("presign").asBoolean() && !d.get("keys").asBoolean());
        assertEquals("[[\"s\",\">=\",\"a b\"],[\"id\",\"<\",9],[\"id\",\"!=\",18446744073709551616],[\"b\",\"=\",true]]",
                d.get("where").toString());
        assertEquals("{\"column\":\"loc\",\"xmin\":-1.0,\"ymin\":-2.0,\"xmax\":3.0,\"ymax\":4.5}", d.get("bbox").toString());
        assertTrue(d.get("request_id").asText().matches("[A-Za-z0-9._~-]{1,64}"), d.get("request_id").asText());

        assertEquals(77, p.asOf());
        assertEquals(3, p.schema().version());
        assertEquals("L1", p.lease());
        assertEquals(List.of(0, 2), p.tail());
        ReadPlan.Sealed s = p.sealed().get(0);
        assertEquals(5, s.segid());
        assertEquals("http://s3/seg/5?sig", s.url());
        assertNull(s.dataKey());
        assertTrue(p.predicates().isEmpty());
    }

    @Test
    void aPlanWhoseAnswerWasLostIsAskedAgainUnderTheSameRequestId() {
        node.thenDrop().then(503, "{\"error\": {\"code\": \"unavailable\", \"message\": \"failing over\"}}").then(200, plan(""));
        client.plan(request());
        node.then(200, plan(""));
        client.plan(request());
        List<FakeNode.Request> seen = node.seen();
        assertEquals(4, seen.size());
        String first = seen.get(0).json().get("request_id").asText();
        for (int i = 1; i < 3; i++) assertEquals(first, seen.get(i).json().get("request_id").asText(), "attempt " + i);
        assertNotEquals(first, seen.get(3).json().get("request_id").asText(), "a new plan has a new id");
        assertEquals(2, waits.size());
    }

    @Test
    void anErrorAnswerIsNotRetriedAndKeepsItsCode() {
        node.then(404, "{\"error\": {\"code\": \"not_found\", \"message\": \"no table 'my table'\"}}");
        ApiError e = assertThrows(ApiError.class, () -> client.plan(request()));
        assertEquals(404, e.status());
        assertEquals("not_found", e.code());
        assertEquals("POST /v1/tables/my%20table/plan: the node answered 404 not_found: no table 'my table'", e.getMessage());
        assertEquals(1, node.seen().size());
        node.then(500, "<html>" + "x".repeat(500));
        ApiError html = assertThrows(ApiError.class, () -> client.snapshot(null));
        assertEquals("http_error", html.code());
        assertTrue(html.getMessage().length() < 300, html.getMessage());
    }

    @Test
    void theNodeUnavailableIsRetriedThenReported() {
        node.always(503, "{\"error\": {\"code\": \"unavailable\", \"message\": \"starting\"}}");
        ApiError e = assertThrows(ApiError.class, () -> client.snapshot(5L));
        assertEquals(503, e.status());
        assertEquals(NodeClient.READ.attempts(), node.seen().size());
        assertEquals("/v1/tables/my%20table/snapshot?as_of=5", node.seen().get(0).path());
    }

    @Test
    void anUnreachableNodeIsNamed() throws IOException {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort(); // closed again: nothing listens there
        }
        NodeClient c = new NodeClient(new Endpoint("http://127.0.0.1:" + port, null, 5), "t", new Retry(waits::add, () -> 0.5));
        BridgeException e = assertThrows(BridgeException.class, () -> c.snapshot(null));
        assertTrue(e.getMessage().startsWith("cannot reach the Terrascale node http://127.0.0.1:" + port + ": "), e.getMessage());
        assertEquals(NodeClient.READ.attempts() - 1, waits.size());
    }

    @Test
    void aSnapshotIsReadIntoARecord() {
        node.then(200, "{\"as_of\": 42, \"table\": \"t\", \"table_id\": \"x\", \"schema\": " + quote(SCHEMA) + ", \"changed_ts\": 40}");
        Snapshot s = client.snapshot(null);
        assertEquals(42, s.asOf());
        assertEquals("loc", s.schema().byId(3).name());
        assertEquals("/v1/tables/my%20table/snapshot", node.seen().get(0).path());
    }

    @Test
    void renewalsRacingEachOtherAreRetriedAnExpiredLeaseIsNot() {
        node.then(409, "{\"error\": {\"code\": \"conflict\", \"message\": \"retry\"}}").then(200, "{\"renewed\": true}");
        client.renew("L/1", 30);
        assertEquals("/v1/leases/L%2F1/renew", node.seen().get(0).path());
        assertEquals(30.0, node.seen().get(1).json().get("ttl_s").asDouble());
        node.then(409, "{\"error\": {\"code\": \"lease_expired\", \"message\": \"expired at 5\"}}");
        LeaseExpiredException e = assertThrows(LeaseExpiredException.class, () -> client.renew("L/1", 30));
        assertTrue(e.getMessage().startsWith("LeaseExpiredError: the read lease L/1 expired"), e.getMessage());
        assertEquals(3, node.seen().size());
    }

    @Test
    void aTailSendsThePlansSegmentsAndPredicates() {
        node.then(200, "arrow bytes");
        byte[] out = client.tail(2, 77, List.of(WhereTerm.text("s", Op.EQ, "x")), null, new long[] {5, 9});
        assertEquals("arrow bytes", new String(out, java.nio.charset.StandardCharsets.UTF_8));
        JsonNode d = node.seen().get(0).json();
        assertEquals("{\"partition\":2,\"as_of\":77,\"sealed\":[5,9],\"where\":[[\"s\",\"=\",\"x\"]]}", d.toString());
        assertFalse(d.has("bbox"));
    }

    @Test
    void aPartialAsksForOnePartitionWithNanLargest() {
        node.then(503, "{\"error\": {\"code\": \"not_ready\", \"message\": \"x\"}}").then(200, "arrow bytes");
        List<String[]> aggs = List.of(new String[] {"count", null}, new String[] {"max", "v"});
        byte[] out = client.partial(3, 77, List.of(), new BBoxTerm("loc", 0, 0, 1, 1), List.of("s"), aggs);
        assertEquals("arrow bytes", new String(out, java.nio.charset.StandardCharsets.UTF_8));
        assertEquals(2, node.seen().size()); // a read: retried while the node is unavailable
        assertEquals("/v1/tables/my%20table/aggregate", node.seen().get(1).path());
        assertEquals("{\"as_of\":77,\"group_by\":[\"s\"],\"aggregates\":[{\"fn\":\"count\"},{\"fn\":\"max\",\"column\":\"v\"}],"
                + "\"bbox\":{\"column\":\"loc\",\"xmin\":0.0,\"ymin\":0.0,\"xmax\":1.0,\"ymax\":1.0},"
                + "\"partitions\":[3],\"nan\":\"largest\"}", node.seen().get(1).json().toString());
    }

    @Test
    void thePartitionCountIsReadFromTheTablesDescriptionAtT() {
        node.then(200, "{\"name\": \"my table\", \"partitions\": 6}").then(200, "{\"name\": \"my table\"}");
        assertEquals(6, client.partitions(77));
        assertEquals("/v1/tables/my%20table?as_of=77", node.seen().get(0).path());
        assertThrows(BridgeException.class, () -> client.partitions(77));
    }

    @Test
    void theTokenNeverShowsInTheEndpointsText() {
        assertFalse(node.endpoint("s3cret").toString().contains("s3cret"));
    }
}
