// A live query (docs/rfcs/0015-subscriptions.md) read as server-sent events through fetch, so
// the bearer token travels in the Authorization header as on every other call (an EventSource
// cannot send one, and the token never goes in a URL). Changes are handed on only when a
// `{"closed": T}` frame covers them, so a reconnect from the last closed T — after a dropped
// connection, a node restart, a leader moving — repeats none and misses none.
import { parse, token } from "./api.js";

const RESUMABLE = new Set(["slow_subscriber", "stopping", "unavailable", "schema_changed", "moved"]);
const RETRY = new Set([429, 502, 503, 504]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Subscribe to `table`'s changes matching `params` (`where`, `bbox`, `prefix`, `columns`: the
 * shapes /query takes) after commit timestamp `from`. `on.changes(list, closed)` gets the changes
 * every closed frame covers (possibly none), `on.state(text)` what the connection is doing,
 * `on.error(e)` an error that ends it. Returns `{ stop() }`.
 */
export function subscribe(table, params, from, on) {
  const me = { stopped: false, closed: from, abort: null };
  (async () => {
    let failures = 0;
    while (!me.stopped) {
      me.abort = new AbortController();
      try {
        const r = await open(table, params, me);
        if (!r.ok) {
          const e = await failure(r);
          if (!RETRY.has(r.status)) { on.error(e); return; }
          on.state(`${e.message}; retrying`);
        } else {
          on.state("live");
          failures = 0;
          const end = await frames(r.body, me, on);
          if (end && !RESUMABLE.has(end.code)) { on.error(end); return; }
          on.state(end ? `${end.code}: resuming from ${me.closed}` : "reconnecting");
        }
      } catch (e) {
        if (me.stopped) return;
        on.state(`connection lost (${e.message}); reconnecting`);
      }
      failures += 1;
      await sleep(Math.min(5000, 200 * 2 ** Math.min(failures, 5)));
    }
  })();
  return { stop() { me.stopped = true; if (me.abort) me.abort.abort(); } };
}

function open(table, params, me) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) q.set(k, JSON.stringify(v));
  if (me.closed !== null && me.closed !== undefined) q.set("from", String(me.closed));
  const headers = { Accept: "text/event-stream" };
  const t = token.get();
  if (t) headers.Authorization = `Bearer ${t}`;
  return fetch(`/v1/tables/${encodeURIComponent(table)}/subscribe?${q}`,
    { headers, signal: me.abort.signal, cache: "no-store", credentials: "omit" });
}

async function failure(r) {
  let code = "http_error", message = `HTTP ${r.status}`;
  try { ({ code, message } = (await r.json()).error); } catch { /* not JSON: keep the status */ }
  return Object.assign(new Error(message), { status: r.status, code });
}

/** Reads one connection's events until it ends: the node's last `{"error"}` (or null). */
async function frames(body, me, on) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", data = [], pending = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return null;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line.startsWith("data:")) { data.push(line.slice(5).replace(/^ /, "")); continue; }
      if (line || !data.length) continue; // id: and event: say nothing the data does not
      const doc = parse(data.join("\n"));
      data = [];
      if (Array.isArray(doc)) pending.push(...doc);
      else if (doc.closed !== undefined) {
        me.closed = doc.closed;
        const out = pending;
        pending = [];
        on.changes(out, doc.closed);
      } else if (doc.error) return Object.assign(new Error(doc.error.message), doc.error);
    }
  }
}
