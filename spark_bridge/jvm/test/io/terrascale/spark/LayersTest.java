package io.terrascale.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The reader's packages point down (as tests/structure/test_imports.py keeps the Python layers):
 * {@code format} (docs/format, no Spark, no HTTP) below {@code node} (the node's API, no Spark)
 * below {@code source} (the Spark data source); the errors at the root import none of them. And
 * Spark's internal Python data source class is reached from one file only.
 */
class LayersTest {
    private static final Map<String, List<String>> FORBIDDEN = Map.of(
            "", List.of("io.terrascale.spark.format", "io.terrascale.spark.node", "io.terrascale.spark.source", "org.apache.spark"),
            "format", List.of("io.terrascale.spark.node", "io.terrascale.spark.source", "org.apache.spark", "java.net.http"),
            "node", List.of("io.terrascale.spark.source", "org.apache.spark"),
            "source", List.of());

    private static Path src() {
        return Paths.get(System.getProperty("terrascale.src", "spark_bridge/jvm/src")).resolve("io/terrascale/spark");
    }

    @Test
    void packagesImportOnlyTheLayersBelowThem() throws IOException {
        List<String> bad = new ArrayList<>();
        int files = 0;
        for (Map.Entry<String, List<String>> e : FORBIDDEN.entrySet()) {
            Path dir = src().resolve(e.getKey());
            try (Stream<Path> s = Files.list(dir)) {
                for (Path f : (Iterable<Path>) s.filter(p -> p.toString().endsWith(".java"))::iterator) {
                    files++;
                    for (String line : Files.readAllLines(f)) {
                        for (String no : e.getValue()) {
                            if (line.startsWith("import " + no + ".") || line.startsWith("import static " + no + ".")) {
                                bad.add(src().relativize(f) + ": " + line);
                            }
                        }
                    }
                }
            }
        }
        assertTrue(files > 30, "found only " + files + " sources under " + src());
        assertEquals(List.of(), bad);
    }

    @Test
    void sparkInternalsAreReachedFromOneFile() throws IOException {
        List<String> users = new ArrayList<>();
        try (Stream<Path> s = Files.walk(src())) {
            for (Path f : (Iterable<Path>) s.filter(p -> p.toString().endsWith(".java"))::iterator) {
                if (Files.readString(f).contains("org.apache.spark.sql.execution.datasources")) users.add(f.getFileName().toString());
            }
        }
        assertEquals(List.of("PythonFallback.java"), users);
    }
}
