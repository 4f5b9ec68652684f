// Building the page: every value from the API goes in as text (textContent, text nodes),
// never as markup, so a table named <img src=x onerror=...> is shown, not run.

/** An element: attrs set one by one (on* handlers as listeners, never attributes), children as nodes or text. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value") el.value = v;
    else if (k === "checked" || k === "disabled" || k === "hidden" || k === "selected") el[k] = Boolean(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  add(el, children);
  return el;
}

function add(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  add(el, children);
  return el;
}

/** A table: header names and rows of cells (a cell is text, a node, or {text, class, k});
 * rowAttrs(row, i) gives each row's attributes (class, data-id). */
export function table(headers, rows, rowAttrs = () => ({}), attrs = {}) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r, i) => h("tr", rowAttrs(r, i),
      r.map((c) => (c !== null && typeof c === "object" && !(c instanceof Node))
        ? h("td", { class: c.class, "data-k": c.k }, c.text ?? "")
        : h("td", {}, c ?? ""))))));
}

/** A number cell, right-aligned. */
export const num = (v, k) => ({ text: v === null || v === undefined ? "—" : fmt(v), class: "num", k });

export function fmt(v) {
  return typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v);
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

export const card = (label, value, k) => h("div", { class: "card" },
  h("div", { class: "muted" }, label), h("div", { class: "v", "data-k": k }, value));

/** A select of options (a value, or [value, label]), the one equal to `current` selected. */
export function select(id, options, current, onchange) {
  return h("select", { id, onchange }, options.map((o) => {
    const [value, label] = Array.isArray(o) ? o : [o, o];
    return h("option", { value, selected: value === current }, label);
  }));
}
