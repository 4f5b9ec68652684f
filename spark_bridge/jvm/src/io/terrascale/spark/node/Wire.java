package io.terrascale.spark.node;

import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Op;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.Schema;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Optional;

/**
 * The node API's JSON (docs/openapi.yaml, tag {@code bridge}): requests written and answers read
 * into records, the one place their field names appear. A field the reader needs and the answer
 * lacks fails with a line naming it.
 */
public final class Wire {
    private Wire() {}

    // NaN and infinities may appear in a float term's value (Python's json writes them bare)
    static final ObjectMapper JSON = JsonMapper.builder().enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS).build();

    static JsonNode parse(byte[] body, String what) {
        try {
            return JSON.readTree(body);
        } catch (IOException e) {
            throw new BridgeException(what + ": the node's answer is not JSON: " + e.getMessage(), e);
        }
    }

    // -- requests ------------------------------------------------------------------------

    static ObjectNode plan(PlanRequest r, String requestId) {
        ObjectNode d = JSON.createObjectNode();
        d.put("as_of", r.asOf());
        d.put("sealed_only", r.sealedOnly());
        d.put("lease_s", r.leaseS());
        d.put("typed", true);
        d.put("presign", r.presign());
        d.put("keys", r.keys());
        d.put("request_id", requestId);
        predicates(d, r.where(), r.bbox());
        return d;
    }

    static ObjectNode tail(int partition, long asOf, List<WhereTerm> where, BBoxTerm bbox, long[] sealed) {
        ObjectNode d = JSON.createObjectNode();
        d.put("partition", partition);
        d.put("as_of", asOf);
        ArrayNode s = d.putArray("sealed");
        for (long x : sealed) s.add(x);
        predicates(d, where, bbox);
        return d;
    }

    /** An aggregate (docs/rfcs/0012-aggregates.md): {@code aggregates} are {fn, column or null}. */
    static ObjectNode aggregate(long asOf, List<WhereTerm> where, BBoxTerm bbox, List<String> groupBy,
                                List<String[]> aggregates) {
        ObjectNode d = JSON.createObjectNode();
        d.put("as_of", asOf);
        ArrayNode g = d.putArray("group_by");
        for (String c : groupBy) g.add(c);
        ArrayNode a = d.putArray("aggregates");
        for (String[] f : aggregates) {
            ObjectNode o = a.addObject().put("fn", f[0]);
            if (f[1] != null) o.put("column", f[1]);
        }
        predicates(d, where, bbox);
        return d;
    }

    static ObjectNode renew(double ttlS) {
        return JSON.createObjectNode().put("ttl_s", ttlS);
    }

    private static void predicates(ObjectNode d, List<WhereTerm> where, BBoxTerm bbox) {
        if (!where.isEmpty()) {
            ArrayNode w = d.putArray("where");
            for (WhereTerm t : where) {
                ArrayNode a = w.addArray().add(t.column()).add(t.op().symbol());
                if (t.value() instanceof WhereTerm.Text v) a.add(v.v());
                else if (t.value() instanceof WhereTerm.Int v) a.add(v.v());
                else a.add(((WhereTerm.Bool) t.value()).v());
            }
        }
        if (bbox != null) {
            d.putObject("bbox").put("column", bbox.column()).put("xmin", bbox.xmin()).put("ymin", bbox.ymin())
                    .put("xmax", bbox.xmax()).put("ymax", bbox.ymax());
        }
    }

    // -- answers -------------------------------------------------------------------------

    static Snapshot snapshot(JsonNode d) {
        return new Snapshot(req(d, "as_of", "snapshot").asLong(), Schema.parse(req(d, "schema", "snapshot").asText()));
    }

    /** An error answer's {@code {"error": {"code", "message"}}}, or the body's start when it is not one. */
    static ApiError error(String what, int status, byte[] body) {
        try {
            JsonNode err = JSON.readTree(body).get("error");
            if (err != null && err.hasNonNull("code")) return new ApiError(what, status, err.get("code").asText(), err.path("message").asText());
        } catch (IOException e) {
            // not JSON: a proxy's page, say; shown as it is below
        }
        String text = new String(body, StandardCharsets.UTF_8);
        return new ApiError(what, status, "http_error", text.length() > 200 ? text.substring(0, 200) : text);
    }

    static ReadPlan plan(JsonNode d) {
        int version = d.path("version").asInt(1);
        if (version != ReadPlan.VERSION) {
            throw new BridgeException("read plan version " + version + " is not " + ReadPlan.VERSION
                    + ": the JVM reader and the node are of different releases");
        }
        Schema schema = Schema.parse(req(d, "schema", "plan").asText());
        List<Schema> versions = new ArrayList<>();
        for (JsonNode v : req(d, "versions", "plan")) versions.add(Schema.parse(v.asText()));
        List<ReadPlan.Sealed> sealed = new ArrayList<>();
        int i = 0;
        for (JsonNode s : req(d, "sealed", "plan")) sealed.add(sealed(s, "plan sealed[" + i++ + "]"));
        List<Integer> tail = new ArrayList<>();
        for (JsonNode t : req(d, "tail", "plan")) tail.add(t.asInt());
        JsonNode p = d.get("predicates");
        Optional<Predicates> preds = p == null || p.isNull() ? Optional.empty() : Optional.of(predicates(p, schema));
        return new ReadPlan(req(d, "as_of", "plan").asLong(), schema, versions, req(d, "objects", "plan").asText(),
                req(d, "encrypted", "plan").asBoolean(), sealed, tail, req(d, "lease", "plan").asText(), preds);
    }

    private static ReadPlan.Sealed sealed(JsonNode s, String what) {
        return new ReadPlan.Sealed(req(s, "segid", what).asLong(), req(s, "key", what).asText(),
                req(s, "object_size", what).asLong(), req(s, "rows", what).asLong(), base64(req(s, "visible", what)),
                s.hasNonNull("url") ? s.get("url").asText() : null,
                s.hasNonNull("data_key") ? base64(s.get("data_key")) : null);
    }

    /** The plan's {@code predicates}: each value typed by its column's kind (the plan's convention). */
    public static Predicates predicates(JsonNode p, Schema schema) {
        List<Predicates.Term> terms = new ArrayList<>();
        for (JsonNode t : p.path("terms")) {
            Column c = column(schema, req(t, "column_id", "plan predicate"));
            terms.add(new Predicates.Term(c, Op.of(req(t, "op", "plan predicate").asText()), value(c, req(t, "value", "plan predicate"))));
        }
        JsonNode b = p.path("bbox");
        Predicates.BBox box = null;
        if (!b.isMissingNode() && !b.isNull()) {
            box = new Predicates.BBox(column(schema, req(b, "column_id", "plan bbox")), req(b, "xmin", "plan bbox").asDouble(),
                    req(b, "ymin", "plan bbox").asDouble(), req(b, "xmax", "plan bbox").asDouble(), req(b, "ymax", "plan bbox").asDouble());
        }
        return new Predicates(terms, box);
    }

    private static Column column(Schema schema, JsonNode id) {
        Column c = schema.byId(id.asInt());
        if (c == null) throw new BridgeException("the plan's predicate names column id " + id + " the schema lacks");
        return c;
    }

    private static Predicates.Value value(Column c, JsonNode v) {
        switch (c.valueKind()) {
            case FLOAT32: case FLOAT64: return new Predicates.Real(v.asDouble());
            case BOOL: return new Predicates.Bool(v.asBoolean());
            case STRING: return new Predicates.Bytes(v.asText().getBytes(StandardCharsets.UTF_8));
            case BINARY: case UUID: return new Predicates.Bytes(Base64.getDecoder().decode(v.asText()));
            default: return new Predicates.Int(v.bigIntegerValue()); // integers of any width, µs, days
        }
    }

    private static JsonNode req(JsonNode d, String field, String what) {
        JsonNode v = d.get(field);
        if (v == null || v.isNull()) {
            throw new BridgeException("the node's " + what + " has no '" + field + "' (a node of another release?)");
        }
        return v;
    }

    private static byte[] base64(JsonNode v) {
        return Base64.getDecoder().decode(v.asText());
    }
}
