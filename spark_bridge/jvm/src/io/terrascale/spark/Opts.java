package io.terrascale.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The data source's options (docs/spark.md), parsed once with one-line errors: the same names,
 * defaults and messages as spark_bridge/options.py, so both readers take the same options.
 */
final class Opts implements Serializable {
    static final List<String> KNOWN = Arrays.asList("endpoint", "table", "token", "as_of", "sealed_only", "columns",
            "where", "bbox", "key_file", "objects", "lease_s", "timeout_s", "batch_rows", "change_feed", "after",
            "starting_ts", "reader", "split_mib", "path");
    private static final Pattern TERM = Pattern.compile("^\\s*([A-Za-z_][A-Za-z0-9_]*)\\s*(!=|<=|>=|=|<|>)\\s*(.*?)\\s*$");
    private static final Pattern AND = Pattern.compile("\\s+and(?:\\s+|$)", Pattern.CASE_INSENSITIVE);

    String endpoint;
    String table;
    String token;
    Long asOf;
    boolean sealedOnly;
    List<String> columns; // null: every column
    List<Object[]> where = new ArrayList<>(); // [col, op, value] as the HTTP API takes them
    double[] bbox; // xmin, ymin, xmax, ymax
    String bboxColumn;
    String keyFile;
    String objects;
    double leaseS = 600;
    double timeoutS = 300;
    boolean changeFeed;
    String reader = "auto";
    long splitBytes = 64L << 20;

    static Opts parse(Map<String, String> raw) {
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
        Opts p = new Opts();
        String endpoint = nonEmpty(o.get("endpoint"), System.getenv("TERRASCALE_ENDPOINT"));
        if (endpoint == null || !endpoint.matches("^https?://[^/\\s]+/?$")) {
            throw new BridgeException("option endpoint: expected http(s)://HOST:PORT of a Terrascale node, not '"
                    + endpoint + "'");
        }
        p.endpoint = endpoint.replaceAll("/+$", "");
        p.table = nonEmpty(o.get("table"), o.get("path"));
        if (p.table == null) {
            throw new BridgeException("option table: name the table to read or write (.option('table', NAME))");
        }
        p.token = nonEmpty(o.get("token"), System.getenv("TERRASCALE_TOKEN"));
        p.asOf = integer(o, "as_of");
        p.sealedOnly = bool(o, "sealed_only");
        p.changeFeed = bool(o, "change_feed");
        p.columns = columns(o.get("columns"));
        if (nonEmpty(o.get("where"), null) != null) p.where = parseWhere(o.get("where"));
        if (nonEmpty(o.get("bbox"), null) != null) p.parseBbox(o.get("bbox"));
        p.keyFile = nonEmpty(o.get("key_file"), null);
        p.objects = nonEmpty(o.get("objects"), null);
        p.leaseS = number(o, "lease_s", 600, 86_400, "seconds");
        p.timeoutS = number(o, "timeout_s", 300, 86_400, "seconds");
        String reader = nonEmpty(o.get("reader"), "auto").toLowerCase(Locale.ROOT);
        if (!Arrays.asList("auto", "jvm", "python").contains(reader)) {
            throw new BridgeException("option reader: auto, jvm or python, not '" + o.get("reader") + "'");
        }
        p.reader = reader;
        p.splitBytes = Math.max(1, (long) (number(o, "split_mib", 64, 1 << 20, "MiB") * (1 << 20)));
        return p;
    }

    /** The option's where text -> [[col, op, value], ...] (values stay text: the node types them). */
    static List<Object[]> parseWhere(String text) {
        List<Object[]> out = new ArrayList<>();
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
            out.add(new Object[] {m.group(1), m.group(2), v});
        }
        return out;
    }

    private static List<String> splitAnd(String text) {
        List<String> parts = new ArrayList<>();
        StringBuilder cur = new StringBuilder();
        Character quote = null;
        int i = 0;
        while (i < text.length()) {
            char ch = text.charAt(i);
            if (quote != null) {
                if (ch == quote) quote = null;
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
        String s = cur.toString().replaceAll("\\s+$", "");
        return s.isEmpty() || "=<>!".indexOf(s.charAt(s.length() - 1)) >= 0;
    }

    private void parseBbox(String text) {
        int colon = text.indexOf(':');
        double[] nums = null;
        if (colon > 0) {
            String[] xs = text.substring(colon + 1).split(",", -1);
            if (xs.length == 4) {
                try {
                    nums = new double[4];
                    for (int i = 0; i < 4; i++) {
                        nums[i] = Double.parseDouble(xs[i].trim());
                        if (!Double.isFinite(nums[i])) nums = null;
                        if (nums == null) break;
                    }
                } catch (NumberFormatException e) {
                    nums = null;
                }
            }
        }
        if (nums == null || text.substring(0, colon).trim().isEmpty()) {
            throw new BridgeException("option bbox: expected COL:XMIN,YMIN,XMAX,YMAX, not '" + text + "'");
        }
        bboxColumn = text.substring(0, colon).trim();
        bbox = nums;
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
        throw new BridgeException("option " + key + ": expected a commit timestamp (a non-negative integer), not '"
                + v + "'");
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
