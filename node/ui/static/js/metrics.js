// This node's /metrics sampled while the Metrics or Jobs page is open (history kept for the
// tab's life, the last MINUTES minutes), and the series the charts draw from the samples.
import { get } from "./api.js";

const MINUTES = 10;
const samples = []; // { t: seconds, m: Map "name{labels}" -> value }

/** Prometheus text format -> Map of "name{labels}" to value (comments skipped). */
export function parseProm(text) {
  const m = new Map();
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const i = line.lastIndexOf(" ");
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return m;
}

/** The sum of every series of `name` whose labels include `want` (e.g. 'route="/x"'). */
export function total(m, name, want = "") {
  let s = 0, seen = false;
  for (const [k, v] of m) {
    const n = k.indexOf("{") < 0 ? k : k.slice(0, k.indexOf("{"));
    if (n === name && (!want || k.includes(want))) { s += v; seen = true; }
  }
  return seen ? s : null;
}

export function max(m, name) {
  let best = null;
  for (const [k, v] of m) if ((k === name || k.startsWith(`${name}{`)) && (best === null || v > best)) best = v;
  return best;
}

export async function sample() {
  const m = parseProm(await get("/metrics", { text: true }));
  const t = Date.now() / 1000;
  samples.push({ t, m });
  while (samples.length && samples[0].t < t - MINUTES * 60) samples.shift();
  return m;
}

/** [[t, value]] of a gauge-like reading of each sample. */
export function series(read) {
  return samples.map((s) => [s.t, read(s.m)]).filter(([, v]) => v !== null && Number.isFinite(v));
}

/** [[t, per second]] of a counter between consecutive samples (a restart's drop skipped). */
export function rate(read, per = null) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = read(samples[i - 1].m), b = read(samples[i].m);
    if (a === null || b === null || b < a) continue;
    if (per) {
      const pa = per(samples[i - 1].m), pb = per(samples[i].m);
      if (pa !== null && pb !== null && pb > pa) out.push([samples[i].t, (b - a) / (pb - pa)]);
      continue;
    }
    out.push([samples[i].t, (b - a) / (samples[i].t - samples[i - 1].t)]);
  }
  return out;
}
