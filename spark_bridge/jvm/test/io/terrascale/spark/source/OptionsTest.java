package io.terrascale.spark.source;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Op;
import io.terrascale.spark.node.BBoxTerm;
import io.terrascale.spark.node.WhereTerm;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The options: spark_bridge/options.py's names, defaults and one-line messages (tests/spark_bridge/test_options_types.py holds both readers to them). */
class OptionsTest {
    private static Options parse(String... kv) {
        Map<String, String> m = new HashMap<>(Map.of("endpoint", "http://127.0.0.1:7400/", "table", "t"));
        for (int i = 0; i < kv.length; i += 2) m.put(kv[i], kv[i + 1]);
        return Options.parse(m);
    }

    private static String error(String... kv) {
        return assertThrows(BridgeException.class, () -> parse(kv)).getMessage();
    }

    @Test
    void defaults() {
        Options o = parse();
        assertEquals("http://127.0.0.1:7400", o.endpoint());
        assertNull(o.asOf());
        assertNull(o.columns());
        assertEquals(List.of(), o.where());
        assertEquals(600.0, o.leaseS());
        assertEquals(64L << 20, o.splitBytes());
        assertEquals("auto", o.reader());
    }

    @Test
    void whereTermsKeepTheirValuesAsText() {
        Options o = parse("WHERE", "speed > 30 and name = 'a and b' AND x<=-1.5");
        assertEquals(List.of(WhereTerm.text("speed", Op.GT, "30"), WhereTerm.text("name", Op.EQ, "a and b"),
                WhereTerm.text("x", Op.LE, "-1.5")), o.where());
        assertEquals(new BBoxTerm("loc", -1, -2, 3, 4), parse("bbox", "loc: -1,-2, 3,4").bbox());
        assertEquals(List.of("b", "A"), parse("columns", "b, A").columns());
    }

    @Test
    void badValuesAreRefusedWithOneLineNamingTheOption() {
        assertEquals("option where: 'speed >' is not 'col op value' with op in = != < <= > >= (join several terms with 'and')",
                error("where", "speed >"));
        assertEquals("option bbox: expected COL:XMIN,YMIN,XMAX,YMAX, not 'loc:1,2,3'", error("bbox", "loc:1,2,3"));
        assertEquals("option bbox: expected COL:XMIN,YMIN,XMAX,YMAX, not 'loc:1,2,3,inf'", error("bbox", "loc:1,2,3,inf"));
        assertEquals("option lease_s: seconds in (0, 86400], not '0'", error("lease_s", "0"));
        assertEquals("option as_of: expected a commit timestamp (a non-negative integer), not '-1'", error("as_of", "-1"));
        assertEquals("option sealed_only: true or false, not 'maybe'", error("sealed_only", "maybe"));
        assertEquals("option reader: auto, jvm or python, not 'scala'", error("reader", "scala"));
        assertEquals("option columns: distinct column names separated by commas, not 'a,A'", error("columns", "a,A"));
        assertEquals("option endpoint: expected http(s)://HOST:PORT of a Terrascale node, not 'ftp://x'", error("endpoint", "ftp://x"));
        assertEquals("option error: unknown option(s) colour; the options are: after, as_of, batch_rows, bbox, change_feed, "
                + "columns, endpoint, key_file, lease_s, objects, reader, sealed_only, split_mib, starting_ts, table, "
                + "timeout_s, token, where", error("colour", "red"));
    }

    @Test
    void theTokenNeverShowsInTheOptionsText() {
        Options o = parse("token", "s3cret");
        assertEquals("s3cret", o.node().token());
        assertFalse(o.toString().contains("s3cret") || o.node().toString().contains("s3cret"));
    }

    @Test
    void s3ObjectsGoToThePythonReaderUnlessTheJvmOneIsAskedFor() {
        assertEquals(true, TerrascaleProvider.toPython(parse("objects", "trs3://bucket/p")));
        assertEquals(false, TerrascaleProvider.toPython(parse("objects", "trfs:///data/objects")));
        assertEquals(true, TerrascaleProvider.toPython(parse("change_feed", "true")));
        BridgeException e = assertThrows(BridgeException.class,
                () -> TerrascaleProvider.toPython(parse("objects", "trs3://bucket/p", "reader", "jvm")));
        assertEquals("option objects: the JVM reader reads S3 objects through the URLs the node presigns in the plan; "
                + "leave option objects out, or use option reader=python", e.getMessage());
    }
}
