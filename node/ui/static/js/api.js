// Calls to this node's API: the bearer token asked once, kept in this tab's sessionStorage
// (never in a URL, never in localStorage), sent as an Authorization header on every call.

const KEY = "terrascale.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

/** One call: JSON in, JSON (or text) out; an error answer raised as ApiError with the API's message. */
export async function call(method, path, body, { text = false } = {}) {
  const headers = {};
  const t = token.get();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : stringify(body),
    cache: "no-store", credentials: "omit" });
  if (!r.ok) {
    let code = "http_error", message = `HTTP ${r.status}`;
    try {
      const doc = await r.json();
      if (doc && doc.error) ({ code, message } = doc.error);
    } catch { /* not JSON: keep the status */ }
    const e = new ApiError(r.status, code, message);
    if (r.status === 401) onUnauthorized(e);
    throw e;
  }
  return text ? r.text() : parse(await r.text());
}

// Commit timestamps (physical_ms << 16 | logical) pass 2^53: numbers that large stay exact
// as BigInt, read from the JSON text itself, and go back out as plain JSON integers.
const BIG = `big${Math.random().toString(36).slice(2)}:`;

export function parse(text) {
  return JSON.parse(text, (k, v, c) => (typeof v === "number" && !Number.isSafeInteger(v) && c
    && /^-?\d+$/.test(c.source) ? BigInt(c.source) : v));
}

export function stringify(doc, _, indent) {
  return JSON.stringify(doc, (k, v) => (typeof v === "bigint" ? BIG + v : v), indent)
    .replace(new RegExp(`"${BIG}(-?\\d+)"`, "g"), "$1");
}

export const get = (path, opts) => call("GET", path, undefined, opts);
export const post = (path, body) => call("POST", path, body);
export const del = (path) => call("DELETE", path);
export const enc = encodeURIComponent;
