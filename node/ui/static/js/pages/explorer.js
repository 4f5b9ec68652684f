// Explorer: a query built from where terms, a bbox, columns and a limit, read as of a time
// chosen on a slider over the retained history; the rows in pages, and the same query as a
// curl command and a terrascale command. The Map page sets its bbox and runs it. "Live" keeps
// the result current: a subscription with the query's filter (live.js) says when a change
// touches it, and the query runs again as of the closed timestamp that covers the change — the
// rows shown are always exactly the query's answer at a T, never a client-side patch of it.
import { enc, get, post, stringify } from "../api.js";
import { fill, h, select, table } from "../dom.js";
import { subscribe } from "../live.js";

const PAGE = 50;
const OPS = ["=", "!=", "<", "<=", ">", ">="];

/** The shared query (ctx.state.query) the Map page also writes. */
export function query(ctx) {
  return (ctx.state.query ||= { table: null, where: [], bbox: null, columns: "", limit: 10000, asOfMs: null });
}

/** The body POST /v1/tables/{t}/query takes for `q` (as_of at the end of the chosen millisecond). */
export function body(q, closedTs) {
  const b = {};
  if (q.where.length) b.where = q.where.map(([c, op, v]) => [c, op, value(v)]);
  if (q.bbox) b.bbox = q.bbox;
  if (q.asOfMs !== null && closedTs !== undefined) {
    const t = (BigInt(q.asOfMs) << 16n) | 0xffffn;
    b.as_of = t < BigInt(closedTs) ? t : BigInt(closedTs);
  }
  const cols = q.columns.split(",").map((c) => c.trim()).filter(Boolean);
  if (cols.length) b.columns = cols;
  b.limit = q.limit;
  return b;
}

function value(text) {
  try { return JSON.parse(text); } catch { return text; } // 5, true, "x" as typed; anything else a string
}

/** Run the shared query now; the rows are kept for the Explorer to show. */
export async function run(ctx, closedTs) {
  const q = query(ctx);
  const b = body(q, closedTs);
  const res = await post(`/v1/tables/${enc(q.table)}/query`, b);
  ctx.state.result = { table: q.table, body: b, rows: res.rows, as_of: res.as_of, page: 0 };
  return ctx.state.result;
}

const quote = (s) => `'${String(s).replaceAll("'", "'\\''")}'`;

function commands(q, b) {
  const curl = `curl -s -X POST -H "Authorization: Bearer $TERRASCALE_TOKEN" -H 'Content-Type: application/json' ` +
    `${quote(`${location.origin}/v1/tables/${enc(q.table)}/query`)} -d ${quote(stringify(b))}`;
  const cli = ["terrascale", "--endpoint", location.origin, "query", q.table,
    ...(b.where || []).flatMap(([c, op, v]) => ["--where", `${c} ${op} ${typeof v === "string" ? v : stringify(v)}`]),
    ...(b.bbox ? ["--bbox", `${b.bbox.column}:${b.bbox.xmin},${b.bbox.ymin},${b.bbox.xmax},${b.bbox.ymax}`] : []),
    ...(b.as_of !== undefined ? ["--as-of", String(b.as_of)] : []),
    ...(b.columns ? ["--columns", b.columns.join(",")] : []), "--limit", String(b.limit)];
  return [curl, cli.map((a, i) => (i < 2 || /^[\w.:/,-]+$/.test(a) ? a : quote(a))).join(" ")];
}

export function mount(el, ctx) {
  const q = query(ctx);
  const form = h("div", { class: "panel", id: "explorer-form" });
  const out = h("div", { id: "explorer-result" });
  const cmds = h("div", { id: "explorer-commands" });
  fill(el, h("h2", {}, "Explorer"), form, cmds, out);
  let tables = [], closedTs, horizon;
  const live = { on: false, sub: null, gen: 0, state: "", busy: false, again: null };

  const go = async () => {
    stopLive();
    try {
      await run(ctx, closedTs);
      ctx.error(null);
      if (live.on) startLive();
    } catch (e) { ctx.error(e); }
    draw();
  };

  function stopLive() {
    live.gen += 1;
    if (live.sub) live.sub.stop();
    live.sub = null;
  }

  /** Subscribe with the result's filter from its T; each change covered re-runs the query at the closed T. */
  function startLive() {
    const r = ctx.state.result, gen = live.gen;
    const { where, bbox, columns } = r.body;
    live.state = "connecting";
    live.sub = subscribe(r.table, { where, bbox, columns }, r.as_of, {
      changes: (list, closed) => {
        if (gen !== live.gen) return;
        if (list.length) rerun(gen, closed);
        else { live.closed = closed; drawLive(); }
      },
      state: (text) => { if (gen === live.gen) { live.state = text; drawLive(); } },
      error: (e) => { if (gen === live.gen) { live.state = `ended: ${e.message}`; drawLive(); ctx.error(e); } },
    });
  }

  async function rerun(gen, T) {
    if (live.busy) { live.again = T; return; } // one query at a time: the newest T next
    live.busy = true;
    try {
      for (let at = T; at !== null && gen === live.gen; at = live.again) {
        live.again = null;
        const r = ctx.state.result;
        const b = { ...r.body, as_of: at };
        const res = await post(`/v1/tables/${enc(r.table)}/query`, b);
        if (gen !== live.gen) return;
        Object.assign(r, { rows: res.rows, as_of: res.as_of });
        live.closed = at;
        drawResult(out, ctx);
        drawLive();
      }
    } catch (e) { ctx.error(e); } finally { live.busy = false; }
  }

  function drawLive() {
    const el = document.getElementById("q-live-state");
    if (el) el.textContent = live.on ? `live (${live.state})${live.closed ? `, up to commit ${live.closed}` : ""}` : "";
  }

  function draw() {
    if (live.on && q.asOfMs !== null) { live.on = false; stopLive(); } // a time in the past: nothing to follow
    const d = tables.find((t) => t.name === q.table);
    const cols = d ? d.columns : [];
    fill(form,
      h("label", {}, "Table ", select("q-table", tables.map((t) => t.name), q.table, (e) => {
        q.table = e.target.value; q.where = []; q.bbox = null; draw();
      })), " ",
      h("label", {}, "Columns ", h("input", { id: "q-columns", value: q.columns, placeholder: "all", onchange: (e) => { q.columns = e.target.value; } })), " ",
      h("label", {}, "Limit ", h("input", { id: "q-limit", type: "number", min: 1, value: q.limit,
        onchange: (e) => { q.limit = Math.max(1, Number(e.target.value) || 1); } })),
      whereEditor(q, cols, draw), bboxEditor(q, cols, draw), asOfSlider(q, horizon, closedTs, draw),
      h("button", { id: "q-run", type: "button", onclick: go }, "Run query"), " ",
      h("button", { id: "q-live", type: "button", "aria-pressed": String(live.on), disabled: q.asOfMs !== null || null,
        title: "Keep the rows current as changes commit (the latest time only)",
        onclick: () => { live.on = !live.on; if (!live.on) stopLive(); draw(); if (live.on) go(); } },
      live.on ? "Live: on" : "Live"), " ", h("span", { id: "q-live-state", class: "muted" }));
    drawLive();
    const b = body(q, closedTs);
    fill(cmds, q.table ? [h("h3", {}, "The same query"), commands(q, b).map((c) => h("pre", { class: "cmd" }, c))] : null);
    drawResult(out, ctx);
  }

  async function refresh() {
    const [list, st] = await Promise.all([get("/v1/tables"), get("/v1/admin/status")]);
    tables = list.tables;
    closedTs = st.closed_ts; horizon = st.history_horizon;
    if (!tables.some((t) => t.name === q.table)) q.table = tables.length ? tables[0].name : null;
    if (!form.firstChild || !form.contains(document.activeElement)) draw();
  }
  return { refresh, every: 5000, stop: stopLive };
}

function whereEditor(q, cols, redraw) {
  const names = cols.map((c) => c.name);
  return h("fieldset", { id: "q-where" }, h("legend", {}, "Where (all must hold)"),
    q.where.map((t, i) => h("div", {},
      select(`q-where-col-${i}`, names, t[0], (e) => { t[0] = e.target.value; }),
      select(`q-where-op-${i}`, OPS, t[1], (e) => { t[1] = e.target.value; }),
      h("input", { id: `q-where-val-${i}`, value: t[2], onchange: (e) => { t[2] = e.target.value; } }),
      h("button", { type: "button", onclick: () => { q.where.splice(i, 1); redraw(); } }, "×"))),
    h("button", { id: "q-where-add", type: "button", disabled: !names.length,
      onclick: () => { q.where.push([names[0], "=", ""]); redraw(); } }, "+ term"));
}

function bboxEditor(q, cols, redraw) {
  const spatial = cols.filter((c) => c.type === "point" || c.type === "box").map((c) => c.name);
  if (!spatial.length) return null;
  const b = q.bbox;
  const edge = (k) => h("input", { id: `q-bbox-${k}`, type: "number", step: "any", value: b ? b[k] : "",
    onchange: (e) => { b[k] = Number(e.target.value); } });
  return h("fieldset", { id: "q-bbox" }, h("legend", {}, "Bounding box (edges inclusive)"),
    h("label", {}, h("input", { id: "q-bbox-on", type: "checkbox", checked: Boolean(b), onchange: (e) => {
      q.bbox = e.target.checked ? { column: spatial[0], xmin: -180, ymin: -90, xmax: 180, ymax: 90 } : null; redraw();
    } }), " on "),
    b ? [select("q-bbox-col", spatial, b.column, (e) => { b.column = e.target.value; }),
      " xmin ", edge("xmin"), " ymin ", edge("ymin"), " xmax ", edge("xmax"), " ymax ", edge("ymax")] : null);
}

function asOfSlider(q, horizon, closedTs, redraw) {
  if (closedTs === undefined || closedTs === null) return null;
  const max = Number(BigInt(closedTs) >> 16n);
  const min = horizon ? Math.max(0, Number(BigInt(horizon) >> 16n)) : max - 3600e3;
  const at = q.asOfMs === null ? max : Math.min(Math.max(q.asOfMs, min), max);
  const label = h("span", { id: "q-asof-label" }, q.asOfMs === null ? "latest" : new Date(at).toISOString());
  return h("fieldset", {}, h("legend", {}, "As of (retained history)"),
    h("input", { id: "q-asof", type: "range", min, max, step: 1, value: at,
      oninput: (e) => { q.asOfMs = Number(e.target.value); label.textContent = new Date(q.asOfMs).toISOString(); },
      onchange: () => redraw() }), " ", label, " ",
    h("button", { type: "button", onclick: () => { q.asOfMs = null; redraw(); } }, "latest"));
}

function cell(v) {
  if (v === null || v === undefined) return "null";
  return typeof v === "object" ? stringify(v) : String(v);
}

function drawResult(out, ctx) {
  const r = ctx.state.result;
  if (!r) { fill(out, h("p", { class: "muted" }, "Run a query to see rows.")); return; }
  const pages = Math.max(1, Math.ceil(r.rows.length / PAGE));
  r.page = Math.min(r.page, pages - 1);
  const cols = r.body.columns || [...new Set(r.rows.flatMap((x) => Object.keys(x)))];
  const shown = r.rows.slice(r.page * PAGE, (r.page + 1) * PAGE);
  const turn = (d) => () => { r.page = Math.min(Math.max(0, r.page + d), pages - 1); drawResult(out, ctx); };
  fill(out, h("h3", {}, "Rows"),
    h("p", {}, h("span", { id: "row-count" }, String(r.rows.length)), ` rows from ${r.table} as of `,
      h("span", { id: "result-asof" }, String(r.as_of)),
      r.rows.length >= r.body.limit ? " (the limit: there may be more)" : ""),
    h("div", {}, h("button", { id: "page-prev", type: "button", onclick: turn(-1), disabled: r.page === 0 }, "‹ prev"),
      ` page ${r.page + 1} of ${pages} `,
      h("button", { id: "page-next", type: "button", onclick: turn(1), disabled: r.page >= pages - 1 }, "next ›")),
    table(cols, shown.map((row) => cols.map((c) => cell(row[c]))), () => ({}), { id: "rows" }));
}

