package io.terrascale.spark.format;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.terrascale.spark.BridgeException;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;

/**
 * A schema version (rowstore/schema.py ``SchemaVersion``): its number, primary key (its column ids
 * in key order: one for a key of one column, several for a composite key, docs/format/keys.md) and
 * columns in order — rows of the version are laid out in this order (docs/format/segment.md §1).
 */
public record Schema(int version, List<Integer> primaryKey, List<Column> columns) implements Serializable {
    private static final ObjectMapper JSON = new ObjectMapper();

    public Schema {
        primaryKey = List.copyOf(primaryKey);
        columns = List.copyOf(columns);
    }

    /** The node's JSON text of a schema version ({@code SchemaVersion.to_json}). */
    public static Schema parse(String text) {
        try {
            JsonNode d = JSON.readTree(text);
            List<Column> cols = new ArrayList<>();
            for (JsonNode c : required(d, "columns")) {
                cols.add(Column.of(required(c, "id").asInt(), required(c, "name").asText(), required(c, "type").asText(),
                        required(c, "nullable").asBoolean()));
            }
            JsonNode pk = required(d, "primary_key");
            List<Integer> keys = new ArrayList<>();
            if (pk.isArray()) {
                for (JsonNode k : pk) keys.add(k.asInt());
            } else {
                keys.add(pk.asInt());  // a key of one column, as schemas were written before composite keys
            }
            return new Schema(required(d, "version").asInt(), keys, cols);
        } catch (IOException e) {
            throw new BridgeException("the node sent a schema that is not JSON: " + e.getMessage(), e);
        }
    }

    private static JsonNode required(JsonNode d, String field) {
        JsonNode v = d.get(field);
        if (v == null || v.isNull()) throw new BridgeException("the node sent a schema without '" + field + "': " + d);
        return v;
    }

    public Column byId(int id) {
        for (Column c : columns) {
            if (c.id() == id) return c;
        }
        return null;
    }

    public Column byName(String name) {
        for (Column c : columns) {
            if (c.name().equals(name)) return c;
        }
        return null;
    }

    public Column byNameIgnoreCase(String name) {
        for (Column c : columns) {
            if (c.name().equalsIgnoreCase(name)) return c;
        }
        return null;
    }
}
