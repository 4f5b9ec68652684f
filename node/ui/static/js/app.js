// The console's shell: sign-in, the page chosen by the URL's fragment (#cluster ...), and each
// page's refresh loop while it is open. Pages live in pages/*.js: mount(el, ctx) returns
// { refresh(), every } and, when it holds timers or listeners, stop().
import { get, token, whenUnauthorized } from "./api.js";
import { fill } from "./dom.js";
import * as cluster from "./pages/cluster.js";
import * as tables from "./pages/tables.js";
import * as explorer from "./pages/explorer.js";
import * as map from "./pages/map.js";
import * as jobs from "./pages/jobs.js";
import * as metrics from "./pages/metrics.js";

const PAGES = { cluster, tables, explorer, map, jobs, metrics };
const $ = (id) => document.getElementById(id);
const ctx = { state: {}, go: (name) => { location.hash = name; } };
let current = null; // { name, page, timer, busy }

function showError(e) {
  const box = $("error");
  if (!e) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = e.code ? `${e.code}: ${e.message}` : String(e.message || e);
}
ctx.error = showError;

function stop() {
  if (!current) return;
  clearInterval(current.timer);
  if (current.page.stop) current.page.stop();
  current = null;
}

async function refresh(cur) {
  if (cur.busy || current !== cur) return;
  cur.busy = true;
  try {
    await cur.page.refresh();
    showError(null);
    $("refreshed").textContent = `refreshed ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    if (e.status !== 401) showError(e);
  } finally {
    cur.busy = false;
  }
}

function open() {
  const name = PAGES[location.hash.slice(1)] ? location.hash.slice(1) : "cluster";
  stop();
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  const el = fill($("page"));
  el.dataset.page = name;
  const page = PAGES[name].mount(el, ctx);
  current = { name, page, busy: false };
  current.timer = setInterval(() => refresh(current), page.every || 2000);
  refresh(current);
}

function askToken(message) {
  stop();
  fill($("page"));
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").hidden = !message;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function signIn(ev) {
  ev.preventDefault();
  token.set($("token").value);
  $("token").value = "";
  await start();
}

async function start() {
  try {
    const st = await get("/v1/admin/status");
    fill($("node-info"), `node ${st.node_id} · v${st.version}`);
  } catch (e) {
    if (e.status === 401) return;  // whenUnauthorized asked for the token
    showError(e);
  }
  $("login").hidden = true;
  $("logout").hidden = !token.get();
  open();
}

whenUnauthorized((e) => {
  const had = token.get();
  token.clear();
  askToken(had ? `${e.code}: ${e.message}` : null);
});
$("login").addEventListener("submit", signIn);
$("logout").addEventListener("click", () => { token.clear(); askToken(null); });
window.addEventListener("hashchange", () => { if (current) open(); });
start();
