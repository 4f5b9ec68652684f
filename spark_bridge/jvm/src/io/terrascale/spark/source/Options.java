package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Op;
import io.terrascale.spark.node.BBoxTerm;
import io.terrascale.spark.node.Endpoint;
import io.terrascale.spark.node.WhereTerm;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The data source's options (docs/spark.md "Options"), parsed once with one-line errors: the same
 * names, defaults and messages as spark_bridge/options.py, so both readers take the same options.
 * {@code columns} and {@code bbox} are null when not given.
 */
public record Options(String endpoint, String table, String token, Long asOf, boolean sealedOnly, List<String> columns,
                      List<WhereTerm> where, BBoxTerm bbox, String keyFile, String objects, double leaseS, double timeoutS,
                      boolean changeFeed, String reader, long splitBytes) implements Serializable {
    static final List<String> KNOWN = List.of("endpoint", "table", "token", "as_of", "sealed_only", "columns", "where",
            "bbox", "key_file", "objects", "lease_s", "timeout_s", "batch_rows", "change_feed", "after", "starting_ts",
            "reader", "split_mib", "path");
    private static final List<String> READERS = List.of("auto", "jvm", "python");
    private static final Pattern TERM = Pattern.compile("^\\s*([A-Za-z_][A-Za-z0-9_]*)\\s*(!=|<=|>=|=|<|>)\\s*(.*?)\\s*$");
    private static final Pattern AND = Pattern.compile("\\s+and(?:\\s+|$)", Pattern.CASE_INSENSITIVE);

    public Options {
        columns = columns == null ? null : List.copyOf(columns);
        where = List.copyOf(where);
    }

    public static Options parse(Map<String, String> raw) {
        Map<String, String> o = new HashMap<>();
        for (Map.Entry<String, String> e : raw.entrySet()) o.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        TreeSet<String> unknown = new TreeSet<>(o.keySet());
        unknown.removeAll(KNOWN);
        if (!unknown.isEmpty()) {
            TreeSet<String> names = new TreeSet<>(KNOWN);
            names.remove("path");
            throw new BridgeException("option error: unknown option(s) " + String.join(", ", unknown)
                    + "; the options are: " + String.join(", ", names));
        }
        String endpoint = nonEmpty(o.get("endpoint"), System.getenv("TERRASCALE_ENDPOINT"));
        if (endpoint == null || !endpoint.matches("^https?://[^/\\s]+/?$")) {
            throw new BridgeException("option endpoint: expected http(s)://HOST:PORT of a Terrascale node, not '"
                    + endpoint + "'");
        }
        String table = nonEmpty(o.get("table"), o.get("path"));
        if (table == null) throw new BridgeException("option table: name the table to read or write (.option('table', NAME))");
        String token = nonEmpty(o.get("token"), System.getenv("TERRASCALE_TOKEN"));
        Long asOf = integer(o, "as_of");
        boolean sealedOnly = bool(o, "sealed_only");
        boolean changeFeed = bool(o, "change_feed");
        List<String> columns = columns(o.get("columns"));
        List<WhereTerm> where = nonEmpty(o.get("where"), null) == null ? List.of() : parseWhere(o.get("where"));
        BBoxTerm bbox = nonEmpty(o.get("bbox"), null) == null ? null : parseBbox(o.get("bbox"));
        double leaseS = number(o, "lease_s", 600, 86_400, "seconds");
        double timeoutS = number(o, "timeout_s", 300, 86_400, "seconds");
        String reader = nonEmpty(o.get("reader"), "auto").toLowerCase(Locale.ROOT);
        if (!READERS.contains(reader)) throw new BridgeException("option reader: auto, jvm or python, not '" + o.get("reader") + "'");
        long splitBytes = Math.max(1, (long) (number(o, "split_mib", 64, 1 << 20, "MiB") * (1 << 20)));
        return new Options(endpoint.replaceAll("/+$", ""), table, token, asOf, sealedOnly, columns, where, bbox,
                nonEmpty(o.get("key_file"), null), nonEmpty(o.get("objects"), null), leaseS, timeoutS, changeFeed, reader,
                splitBytes);
    }

    /** The node this read talks to. */
    public Endpoint node() {
        return new Endpoint(endpoint, token, timeoutS);
    }

    @Override
    public String toString() {
        return "Options[table=" + table + ", endpoint=" + endpoint + "]"; // never the token
    }

    /** The option's where text as terms (values stay text: the node types them). */
    static List<WhereTerm> parseWhere(String text) {
        List<WhereTerm> out = new ArrayList<>();
        for (String part : splitAnd(text)) {
            Matcher m = TERM.matcher(part);
            if (!m.matches() || m.group(3).isEmpty()) {
                throw new BridgeException("option where: '" + part.trim() + "' is not 'col op value' with op in "
                        + "= != < <= > >= (join several terms with 'and')");
            }
            String v = m.group(3);
            if (v.length() >= 2 && v.charAt(0) == v.charAt(v.length() - 1) && (v.charAt(0) == '\'' || v.charAt(0) == '"')) {
                v = v.substring(1, v.length() - 1);
            }
            out.add(WhereTerm.text(m.group(1), Op.of(m.group(2)), v));
        }
        return out;
    }

    /** Splits on {@code and} outside quoted values (a value may contain " and "). */
    private static List<String> splitAnd(String text) {
        List<String> parts = new ArrayList<>();
        StringBuilder cur = new StringBuilder();
        char quote = 0;
        int i = 0;
        while (i < text.length()) {
            char ch = text.charAt(i);
            if (quote != 0) {
                if (ch == quote) quote = 0;
            } else if ((ch == '\'' || ch == '"') && (cur.length() == 0 || endsWithOp(cur))) {
                quote = ch;
            } else {
                Matcher m = AND.matcher(text);
                m.region(i, text.length());
                if (m.lookingAt()) {
                    parts.add(cur.toString());
                    cur.setLength(0);
                    i = m.end();
                    continue;
                }
            }
            cur.append(ch);
            i++;
        }
        parts.add(cur.toString());
        return parts;
    }

    private static boolean endsWithOp(StringBuilder cur) {
        String s = cur.toString().stripTrailing();
        return s.isEmpty() || "=<>!".indexOf(s.charAt(s.length() - 1)) >= 0;
    }

    private static BBoxTerm parseBbox(String text) {
        int colon = text.indexOf(':');
        String[] xs = colon > 0 ? text.substring(colon + 1).split(",", -1) : new String[0];
        if (xs.length == 4 && !text.substring(0, colon).trim().isEmpty()) {
            try {
                double[] v = new double[4];
                boolean finite = true;
                for (int i = 0; i < 4; i++) {
                    v[i] = Double.parseDouble(xs[i].trim());
                    finite &= Double.isFinite(v[i]);
                }
                if (finite) return new BBoxTerm(text.substring(0, colon).trim(), v[0], v[1], v[2], v[3]);
            } catch (NumberFormatException e) {
                // below
            }
        }
        throw new BridgeException("option bbox: expected COL:XMIN,YMIN,XMAX,YMAX, not '" + text + "'");
    }

    private static String nonEmpty(String v, String dflt) {
        return v == null || v.isEmpty() ? dflt : v;
    }

    private static boolean bool(Map<String, String> o, String key) {
        String v = o.get(key);
        if (v == null || v.isEmpty()) return false;
        String s = v.toLowerCase(Locale.ROOT);
        if (s.equals("true") || s.equals("1") || s.equals("yes")) return true;
        if (s.equals("false") || s.equals("0") || s.equals("no")) return false;
        throw new BridgeException("option " + key + ": true or false, not '" + v + "'");
    }

    private static Long integer(Map<String, String> o, String key) {
        String v = o.get(key);
        if (v == null || v.isEmpty()) return null;
        try {
            long n = Long.parseLong(v.trim());
            if (n >= 0) return n;
        } catch (NumberFormatException e) {
            // below
        }
        throw new BridgeException("option " + key + ": expected a commit timestamp (a non-negative integer), not '" + v + "'");
    }

    private static double number(Map<String, String> o, String key, double dflt, double most, String unit) {
        String v = o.get(key);
        if (v == null || v.isEmpty()) return dflt;
        double s;
        try {
            s = Double.parseDouble(v);
        } catch (NumberFormatException e) {
            s = Double.NaN;
        }
        if (!(s > 0 && s <= most)) {
            throw new BridgeException("option " + key + ": " + unit + " in (0, " + (long) most + "], not '" + v + "'");
        }
        return s;
    }

    private static List<String> columns(String v) {
        if (v == null || v.isEmpty()) return null;
        List<String> names = new ArrayList<>();
        TreeSet<String> seen = new TreeSet<>();
        for (String x : v.split(",", -1)) {
            String n = x.trim();
            if (n.isEmpty() || !seen.add(n.toLowerCase(Locale.ROOT))) {
                throw new BridgeException("option columns: distinct column names separated by commas, not '" + v + "'");
            }
            names.add(n);
        }
        return names;
    }
}
