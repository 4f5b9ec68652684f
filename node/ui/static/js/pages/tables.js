// Tables: the list, and for the one chosen its schema history (walked back through describe
// as_of), indexes, cluster_by, partitions with replicas and watermarks, segments by state with
// sizes and garbage ratio, and each segment's cluster range.
import { enc, get } from "../api.js";
import { bytes, fill, h, num, table } from "../dom.js";

const HISTORY = 20; // schema versions shown at most
const SEGMENTS = 200; // segment rows listed at most (the totals count them all)

export function mount(el, ctx) {
  const list = h("div", { class: "list panel", id: "table-list" });
  const detail = h("div", { id: "table-detail" });
  fill(el, h("h2", {}, "Tables"), h("div", { class: "row" }, list, detail));
  let history = { name: null, ts: null, versions: [] };

  async function refresh() {
    const { tables } = await get("/v1/tables");
    if (!ctx.state.table || !tables.some((t) => t.name === ctx.state.table)) ctx.state.table = tables.length ? tables[0].name : null;
    fill(list, h("strong", {}, `${tables.length} tables`), tables.map((t) => h("a", {
      class: t.name === ctx.state.table ? "active" : "", "data-table": t.name,
      onclick: () => { ctx.state.table = t.name; refresh().catch(ctx.error); },
    }, t.name)));
    if (!ctx.state.table) { fill(detail, h("p", { class: "muted" }, "No tables yet.")); return; }
    const name = ctx.state.table;
    const [d, segs] = await Promise.all([get(`/v1/tables/${enc(name)}`), get(`/v1/admin/segments?table=${enc(name)}`)]);
    if (history.name !== name || history.ts !== d.ts) history = { name, ts: d.ts, versions: await schemaHistory(name, d) };
    fill(detail, describe(d, history.versions, segs.segments));
  }
  return { refresh, every: 5000 };
}

/** The table's definitions, newest first: describe as of one before each version's commit. */
async function schemaHistory(name, d) {
  const out = [d];
  while (out.length < HISTORY && out[out.length - 1].schema_version > 1) {
    try {
      out.push(await get(`/v1/tables/${enc(name)}?as_of=${BigInt(out[out.length - 1].ts) - 1n}`));
    } catch { break; } // history_purged (older than the retention) or not there
  }
  return out;
}

function describe(d, versions, segments) {
  const replicas = d.placement ? Math.max(...d.placement.map((p) => p.replicas.length)) : 1;
  return h("div", { "data-table": d.name },
    h("h3", {}, d.name),
    table(["primary key", "indexes", "cluster_by", "partitions", "replicas", "schema version", "table id"],
      [[d.primary_key, d.indexes.join(", ") || "—", d.cluster_by, num(d.partitions, "partitions"), num(replicas, "replicas"),
        num(d.schema_version, "version"), d.table_id]], () => ({}), { id: "table-summary" }),
    h("h3", {}, "Schema history"),
    table(["version", "commit ts", "columns"], versions.map((v) => [num(v.schema_version), String(v.ts),
      v.columns.map((c) => `${c.name} ${c.type}${c.nullable ? "" : " not null"}`).join(", ")]), () => ({}), { id: "schema-history" }),
    h("h3", {}, "Partitions"),
    d.placement ? table(["partition", "leader", "replicas", "epoch", "watermark"], d.placement.map((p) =>
      [num(p.partition), p.leader, p.replicas.join(", "), num(p.epoch), p.watermark === null ? "—" : String(p.watermark)]),
    () => ({}), { id: "table-partitions" }) : h("p", { class: "muted" }, "One node: no placement."),
    h("h3", {}, "Segments by state"), byState(segments),
    h("h3", {}, `Segments (${Math.min(segments.length, SEGMENTS)} of ${segments.length})`), segmentTable(segments));
}

function byState(segments) {
  const s = {};
  for (const g of segments) {
    const t = (s[g.state] ||= { n: 0, rows: 0, live_rows: 0, bytes: 0, live_bytes: 0 });
    t.n += 1; t.rows += g.rows; t.live_rows += g.live_rows; t.bytes += g.bytes; t.live_bytes += g.live_bytes;
  }
  const rows = Object.entries(s).map(([state, t]) => [state, num(t.n, `n-${state}`), num(t.rows, `rows-${state}`),
    num(t.live_rows), { text: bytes(t.bytes), class: "num", k: `bytes-${state}` }, { text: bytes(t.live_bytes), class: "num" },
    num(t.rows && state !== "active" ? Math.round((1 - t.live_rows / t.rows) * 1e4) / 1e4 : 0)]);
  return table(["state", "segments", "rows", "live rows", "bytes", "live bytes", "garbage ratio"], rows,
    (r) => ({ "data-state": r[0] }), { id: "segment-states" });
}

function segmentTable(segments) {
  const shown = [...segments].sort((a, b) => a.partition - b.partition || a.segid - b.segid).slice(0, SEGMENTS);
  return table(["segid", "partition", "state", "owner", "rows", "bytes", "garbage ratio", "cluster range"], shown.map((g) =>
    [String(g.segid), num(g.partition), g.state, g.owner ?? "—", num(g.rows), { text: bytes(g.bytes), class: "num" },
      num(g.garbage_ratio), g.cluster === null || g.cluster === undefined ? "—" : JSON.stringify(g.cluster)]),
  () => ({}), { id: "segments" });
}
