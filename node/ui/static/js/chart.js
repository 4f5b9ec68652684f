// A small line chart on a canvas (no library): the last points of one series, its axis labels as text.
import { h } from "./dom.js";

export function chart(id, title, points, unit = "") {
  const c = h("canvas", { width: 420, height: 160, id });
  const g = c.getContext("2d");
  const W = c.width, H = c.height, L = 56, B = 22;
  g.fillStyle = "#fff"; g.fillRect(0, 0, W, H);
  g.strokeStyle = "#d8dde6"; g.strokeRect(L, 6, W - L - 6, H - B - 6);
  g.fillStyle = "#667085"; g.font = "11px system-ui, sans-serif";
  const last = points.length ? points[points.length - 1][1] : null;
  if (points.length === 1) points = [points[0], points[0]]; // one sample so far: a flat line
  if (!points.length) {
    g.fillText("collecting samples…", L + 10, H / 2);
  } else {
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    const vmax = Math.max(...points.map((p) => p[1]), 1e-9), vmin = Math.min(0, ...points.map((p) => p[1]));
    const x = (t) => L + ((t - t0) / Math.max(t1 - t0, 1e-9)) * (W - L - 6);
    const y = (v) => 6 + (1 - (v - vmin) / (vmax - vmin)) * (H - B - 6);
    g.fillText(short(vmax), 4, 14); g.fillText(short(vmin), 4, H - B);
    g.fillText(`${Math.round(t1 - t0)} s`, W - 40, H - 6);
    g.strokeStyle = "#1f6feb"; g.lineWidth = 1.5; g.beginPath();
    points.forEach(([t, v], i) => (i ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
    g.stroke();
  }
  return h("div", { class: "chart" }, h("h4", {}, title, " ",
    h("span", { class: "muted", "data-k": id }, last === null ? "" : `now ${short(last)}${unit}`)), c);
}

function short(v) {
  const a = Math.abs(v);
  if (a >= 1e9) return `${(v / 1e9).toFixed(1)}G`;
  if (a >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return a >= 10 || a === 0 ? v.toFixed(0) : v.toFixed(2);
}
