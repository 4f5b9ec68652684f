// Map: a table's point (or box) column on a world outline (Natural Earth 1:110m land, shipped
// in vendor/), with pan (drag) and zoom (wheel). "Draw box" drags a rectangle that becomes the
// Explorer's bbox and runs its query. The density layer counts points per cell with the
// histogram endpoint where the node serves it, else the page draws a sample of the points.
// "Live" keeps the points in view current: the view's rows read once, then every change to them
// as it commits, from a subscription over the view's bbox (live.js) that restarts when the view
// moves.
import { ApiError, call, enc, get, post, stringify } from "../api.js";
import { fill, h, select } from "../dom.js";
import { subscribe } from "../live.js";
import { query, run } from "./explorer.js";

const SAMPLE = 5000; // points drawn at most
const CELLS = [72, 36];
let land = null; // the outline, loaded once per page load

async function outline() {
  if (!land) {
    const topo = await call("GET", "vendor/land-110m.json");
    land = globalThis.topojson.feature(topo, topo.objects.land);
  }
  return land;
}

export function mount(el, ctx) {
  const canvas = h("canvas", { id: "map-canvas", width: 1000, height: 500 });
  const controls = h("div", { class: "panel", id: "map-controls" });
  const info = h("div", { id: "map-info" });
  fill(el, h("h2", {}, "Map"), controls, canvas, info);
  const view = { cx: 0, cy: 0, k: canvas.width / 360 };
  const st = { tables: [], table: null, column: null, layer: "points", boxMode: false, drag: null, box: null,
    points: [], cells: null, histogram: true, note: "", view: null,
    live: false, sub: null, gen: 0, rows: new Map(), closed: null, liveState: "" };
  const g = canvas.getContext("2d");
  const toScreen = (x, y) => [(x - view.cx) * view.k + canvas.width / 2, (view.cy - y) * view.k + canvas.height / 2];
  const toWorld = (px, py) => [(px - canvas.width / 2) / view.k + view.cx, view.cy - (py - canvas.height / 2) / view.k];
  const extent = () => {
    const [x0, y1] = toWorld(0, 0), [x1, y0] = toWorld(canvas.width, canvas.height);
    return { xmin: Math.max(-180, x0), ymin: Math.max(-90, y0), xmax: Math.min(180, x1), ymax: Math.min(90, y1) };
  };

  function draw() {
    g.fillStyle = "#cfe3f5";
    g.fillRect(0, 0, canvas.width, canvas.height);
    drawGrid(g, toScreen);
    if (land) drawLand(g, land, toScreen);
    if (st.layer === "density" && st.cells) drawCells(g, st.cells, toScreen);
    else drawPoints(g, st.points, toScreen);
    const b = st.drag && st.drag.box ? st.drag : st.box;
    if (b) {
      const [ax, ay] = toScreen(b.xmin, b.ymax), [bx, by] = toScreen(b.xmax, b.ymin);
      g.strokeStyle = "#d62828"; g.lineWidth = 2; g.setLineDash([6, 4]);
      g.strokeRect(ax, ay, bx - ax, by - ay);
      g.setLineDash([]);
    }
  }

  function stopLive() {
    st.gen += 1; // a subscription's late frames are for a view no longer shown
    if (st.sub) st.sub.stop();
    st.sub = null;
  }

  async function load() {
    stopLive();
    if (!st.table || !st.column) { st.points = []; st.cells = null; draw(); return; }
    const e = extent();
    if (st.live) { await startLive(e); return; }
    if (st.layer === "density" && st.histogram) {
      try {
        const r = await post(`/v1/tables/${enc(st.table)}/histogram`, { column: st.column, bbox: e, cells: CELLS });
        st.cells = { bbox: e, counts: r.counts };
        st.view = e; // the extent these counts are for
        const total = r.counts.reduce((a, row) => a + row.reduce((b, n) => b + n, 0), 0);
        st.cells.total = total;
        st.note = `density: ${total} points in view, counted per cell by the histogram endpoint`;
        draw();
        drawInfo();
        return;
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404 && err.code === "not_found")) throw err;
        st.histogram = false; // this node has no histogram endpoint: sampled points instead
      }
    }
    st.cells = null;
    const r = await post(`/v1/tables/${enc(st.table)}/query`, { bbox: { column: st.column, ...e }, columns: [st.column], limit: SAMPLE });
    st.view = e; // the extent these points were read for
    st.points = r.rows.map((row) => row[st.column]).filter(Boolean);
    st.note = `${st.points.length}${st.points.length >= SAMPLE ? " (a sample)" : ""} points in view` +
      (st.layer === "density" ? " — this node serves no histogram endpoint, so the density layer shows sampled points" : "");
    draw();
    drawInfo();
  }

  /** The view's rows at T, then every change after T that touches the view (live.js). */
  async function startLive(e) {
    const gen = st.gen, table = st.table, column = st.column;
    const d = st.tables.find((t) => t.name === table);
    const keys = [].concat(d.primary_key);
    const bbox = { column, ...e };
    const r = await post(`/v1/tables/${enc(table)}/query`, { bbox, columns: [...keys, column], limit: SAMPLE });
    if (gen !== st.gen) return; // the view moved meanwhile: its own load is under way
    const keyOf = (row) => stringify(keys.map((k) => row[k]));
    st.rows = new Map(r.rows.filter((row) => row[column]).map((row) => [keyOf(row), row[column]]));
    Object.assign(st, { cells: null, view: e, closed: r.as_of, liveState: "connecting" });
    const shown = () => {
      st.points = [...st.rows.values()];
      st.note = `${st.points.length}${r.rows.length >= SAMPLE ? " (a sample, then every change)" : ""} points in ` +
        `view, live (${st.liveState}), up to commit ${st.closed}`;
      draw();
      drawInfo();
    };
    shown();
    st.sub = subscribe(table, { bbox, columns: [column] }, r.as_of, {
      changes: (list, closed) => {
        if (gen !== st.gen) return;
        for (const c of list) {
          const p = c.op === "upsert" ? c.row[column] : null;
          // a change matches on its new or its old version: one that left the view is removed
          if (p && inView(p, e)) st.rows.set(keyOf(c.row), p); else st.rows.delete(keyOf(c.row));
        }
        st.closed = closed;
        shown();
      },
      state: (s) => { if (gen === st.gen) { st.liveState = s; shown(); } },
      error: (err) => { if (gen === st.gen) { st.liveState = `ended: ${err.message}`; shown(); ctx.error(err); } },
    });
  }

  function drawInfo() {
    const r = ctx.state.result;
    const v = st.view;
    fill(info, h("p", { id: "map-note", "data-xmin": v && v.xmin, "data-ymin": v && v.ymin, "data-xmax": v && v.xmax,
      "data-ymax": v && v.ymax, "data-points": st.points.length,
      "data-cells": st.cells ? st.cells.total : null, "data-live": st.live ? String(st.closed) : null }, st.note),
      st.box ? h("p", {}, "Box ", h("span", { id: "map-bbox", "data-xmin": st.box.xmin, "data-ymin": st.box.ymin,
        "data-xmax": st.box.xmax, "data-ymax": st.box.ymax },
      `${st.box.xmin.toFixed(3)}, ${st.box.ymin.toFixed(3)} — ${st.box.xmax.toFixed(3)}, ${st.box.ymax.toFixed(3)}`),
      r ? [": ", h("span", { id: "map-box-count" }, String(r.rows.length)), " rows "] : " ",
      h("button", { id: "map-open-explorer", type: "button", onclick: () => ctx.go("explorer") }, "Open in Explorer")) : null);
  }

  function drawControls() {
    const d = st.tables.find((t) => t.name === st.table);
    const spatial = d ? d.columns.filter((c) => c.type === "point" || c.type === "box").map((c) => c.name) : [];
    fill(controls,
      h("label", {}, "Table ", select("map-table", st.tables.map((t) => t.name), st.table, (e) => {
        st.table = e.target.value; st.column = null; st.box = null; refresh().catch(ctx.error);
      })), " ",
      h("label", {}, "Column ", select("map-column", spatial, st.column, (e) => { st.column = e.target.value; load().catch(ctx.error); })), " ",
      h("label", {}, "Layer ", select("map-layer", ["points", "density"], st.layer, (e) => {
        st.layer = e.target.value; st.live = st.live && st.layer === "points"; drawControls(); load().catch(ctx.error);
      })), " ",
      h("button", { id: "map-live", type: "button", "aria-pressed": String(st.live), disabled: st.layer !== "points" || null,
        title: "Keep the points in view current as changes commit",
        onclick: () => { st.live = !st.live; drawControls(); load().catch(ctx.error); } }, st.live ? "Live: on" : "Live"), " ",
      h("button", { id: "map-box", type: "button", "aria-pressed": String(st.boxMode),
        onclick: () => { st.boxMode = !st.boxMode; canvas.style.cursor = st.boxMode ? "crosshair" : "grab"; drawControls(); } },
      st.boxMode ? "Drawing a box: drag on the map" : "Draw box"), " ",
      h("button", { id: "map-reset", type: "button", onclick: () => { Object.assign(view, { cx: 0, cy: 0, k: canvas.width / 360 }); load().catch(ctx.error); } }, "Whole world"),
      h("span", { class: "muted" }, " drag to pan, wheel to zoom"));
  }

  async function boxDrawn(b) {
    st.box = b;
    st.boxMode = false;
    canvas.style.cursor = "grab";
    const q = query(ctx);
    Object.assign(q, { table: st.table, bbox: { column: st.column, ...b } });
    drawControls();
    try { await run(ctx, (await get("/v1/admin/status")).closed_ts); } catch (e) { ctx.error(e); }
    draw();
    drawInfo();
  }

  const pos = (ev) => { const r = canvas.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; };
  canvas.addEventListener("pointerdown", (ev) => {
    canvas.setPointerCapture(ev.pointerId);
    st.drag = { at: pos(ev), box: st.boxMode, view: { ...view } };
  });
  canvas.addEventListener("pointermove", (ev) => {
    if (!st.drag) return;
    const [px, py] = pos(ev), [sx, sy] = st.drag.at;
    if (st.drag.box) {
      const [ax, ay] = toWorld(sx, sy), [bx, by] = toWorld(px, py);
      Object.assign(st.drag, { xmin: Math.min(ax, bx), xmax: Math.max(ax, bx), ymin: Math.min(ay, by), ymax: Math.max(ay, by) });
    } else {
      view.cx = st.drag.view.cx - (px - sx) / view.k;
      view.cy = st.drag.view.cy + (py - sy) / view.k;
    }
    draw();
  });
  canvas.addEventListener("pointerup", () => {
    const d = st.drag;
    st.drag = null;
    if (d && d.box && d.xmin !== undefined) boxDrawn({ xmin: d.xmin, ymin: d.ymin, xmax: d.xmax, ymax: d.ymax });
    else load().catch(ctx.error);
  });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const [px, py] = pos(ev), [wx, wy] = toWorld(px, py);
    view.k = Math.min(Math.max(view.k * (ev.deltaY < 0 ? 1.25 : 0.8), canvas.width / 720), 2000);
    view.cx = wx - (px - canvas.width / 2) / view.k;
    view.cy = wy + (py - canvas.height / 2) / view.k;
    draw();
    load().catch(ctx.error);
  }, { passive: false });

  async function refresh() {
    const [{ tables }] = await Promise.all([get("/v1/tables"), outline()]);
    st.tables = tables;
    if (!tables.some((t) => t.name === st.table)) { st.table = tables.length ? tables[0].name : null; st.column = null; }
    const d = tables.find((t) => t.name === st.table);
    const spatial = d ? d.columns.filter((c) => c.type === "point" || c.type === "box").map((c) => c.name) : [];
    if (!spatial.includes(st.column)) st.column = spatial[0] || null;
    if (!controls.contains(document.activeElement)) drawControls();
    if (!st.drag && !st.live) await load(); // live: the subscription keeps the view current
    else if (st.live && !st.sub) await load();
    drawInfo();
  }
  return { refresh, every: 5000, stop: stopLive };
}

function inView(p, e) {
  if (p.x !== undefined) return p.x >= e.xmin && p.x <= e.xmax && p.y >= e.ymin && p.y <= e.ymax;
  return p.xmin <= e.xmax && p.xmax >= e.xmin && p.ymin <= e.ymax && p.ymax >= e.ymin;
}

function drawGrid(g, toScreen) {
  g.strokeStyle = "#b3cde3"; g.lineWidth = 1;
  for (let x = -180; x <= 180; x += 30) { const [a, b] = toScreen(x, 90), [c, d] = toScreen(x, -90); line(g, a, b, c, d); }
  for (let y = -90; y <= 90; y += 30) { const [a, b] = toScreen(-180, y), [c, d] = toScreen(180, y); line(g, a, b, c, d); }
}

function line(g, a, b, c, d) { g.beginPath(); g.moveTo(a, b); g.lineTo(c, d); g.stroke(); }

function drawLand(g, fc, toScreen) {
  g.fillStyle = "#f4f1e8"; g.strokeStyle = "#9c9580"; g.lineWidth = 0.7;
  g.beginPath();
  for (const f of fc.features) {
    const polys = f.geometry.type === "Polygon" ? [f.geometry.coordinates] : f.geometry.coordinates;
    for (const poly of polys) for (const ring of poly) {
      // a ring that crosses the antimeridian jumps 360 degrees: a gap there, not a line across the map
      ring.forEach(([x, y], i) => {
        const [px, py] = toScreen(x, y);
        if (i && Math.abs(x - ring[i - 1][0]) < 180) g.lineTo(px, py); else g.moveTo(px, py);
      });
      g.closePath();
    }
  }
  g.fill("evenodd"); g.stroke();
}

function drawPoints(g, points, toScreen) {
  g.fillStyle = "rgba(214, 40, 40, 0.75)"; g.strokeStyle = "rgba(214, 40, 40, 0.75)";
  for (const p of points) {
    if (p.x !== undefined) { const [x, y] = toScreen(p.x, p.y); g.fillRect(x - 1.5, y - 1.5, 3, 3); }
    else { const [a, b] = toScreen(p.xmin, p.ymax), [c, d] = toScreen(p.xmax, p.ymin); g.strokeRect(a, b, c - a, d - b); }
  }
}

function drawCells(g, { bbox, counts }, toScreen) {
  const ny = counts.length, nx = ny ? counts[0].length : 0;
  const max = Math.max(1, ...counts.flat().map(Number));
  const w = (bbox.xmax - bbox.xmin) / nx, hgt = (bbox.ymax - bbox.ymin) / ny;
  for (let j = 0; j < ny; j++) for (let i = 0; i < nx; i++) {
    const n = Number(counts[j][i]);
    if (!n) continue;
    const [a, b] = toScreen(bbox.xmin + i * w, bbox.ymin + (j + 1) * hgt), [c, d] = toScreen(bbox.xmin + (i + 1) * w, bbox.ymin + j * hgt);
    g.fillStyle = `rgba(214, 40, 40, ${0.15 + 0.75 * Math.log1p(n) / Math.log1p(max)})`;
    g.fillRect(a, b, c - a, d - b);
  }
}
