package io.terrascale.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.terrascale.spark.format.ByteSource;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.Map;
import java.util.TreeMap;

/**
 * The golden objects of spark_bridge/jvm/testdata/ (written by tests/spark_bridge/golden.py from
 * the Python writer) and their manifest, golden.json: what a reader must find in each.
 */
public final class Golden {
    private Golden() {}

    private static final ObjectMapper JSON = new ObjectMapper();

    /** The folder (system property {@code terrascale.testdata}, set by {@code make jvm-test}). */
    public static Path dir() {
        return Paths.get(System.getProperty("terrascale.testdata", "spark_bridge/jvm/testdata"));
    }

    public static JsonNode manifest() {
        try {
            return JSON.readTree(dir().resolve("golden.json").toFile());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    public static JsonNode object(String name) {
        return manifest().get("objects").get(name);
    }

    /** How messages name the object: the manifest's store URI and the object's name. */
    public static String where(String name) {
        return manifest().get("store").asText() + "/" + name;
    }

    public static byte[] bytes(String name) {
        try {
            return Files.readAllBytes(dir().resolve(name));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    public static String kekFile() {
        return dir().resolve(manifest().get("kek_file").asText()).toString();
    }

    /** An object held in memory, so a test can damage a copy of it. */
    public static final class Bytes implements ByteSource {
        private final byte[] data;

        public Bytes(byte[] data) {
            this.data = data;
        }

        @Override
        public byte[] read(long offset, int length) throws IOException {
            if (offset < 0 || offset + length > data.length) throw new IOException("read past the end");
            return Arrays.copyOfRange(data, (int) offset, (int) offset + length);
        }

        @Override
        public void close() {}
    }

    /**
     * A value as the tests compare it: integers by value, floats by their double, objects by sorted
     * keys (so 5 and 5L, or a differently ordered struct, compare equal; 5 and 5.0 do not).
     */
    public static String canonical(JsonNode n) {
        if (n == null || n.isNull()) return "null";
        if (n.isIntegralNumber()) return n.bigIntegerValue().toString();
        if (n.isNumber()) return Double.toString(n.doubleValue());
        if (n.isTextual()) return JSON.valueToTree(n.asText()).toString();
        if (n.isArray()) {
            StringBuilder s = new StringBuilder("[");
            for (JsonNode x : n) s.append(s.length() > 1 ? "," : "").append(canonical(x));
            return s.append(']').toString();
        }
        if (n.isObject()) {
            Map<String, String> sorted = new TreeMap<>();
            for (Map.Entry<String, JsonNode> e : n.properties()) sorted.put(e.getKey(), canonical(e.getValue()));
            return sorted.toString();
        }
        return n.toString();
    }
}
