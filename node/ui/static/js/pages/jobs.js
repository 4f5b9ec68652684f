// Jobs: seal, offload and checkpoint run now on this node, and GC — a dry run first, then the
// real pass it described — with each answer shown as the API gave it; GC's metrics over time.
import { get, post, stringify } from "../api.js";
import { fill, h, select } from "../dom.js";
import { chart } from "../chart.js";
import { rate, sample, series, total } from "../metrics.js";

export function mount(el, ctx) {
  const buttons = h("div", { class: "panel", id: "jobs" });
  const answer = h("pre", { class: "answer", id: "job-answer" }, "No job run yet.");
  const charts = h("div", { id: "gc-charts" });
  fill(el, h("h2", {}, "Jobs"), buttons, h("h3", {}, "Answer"), answer, h("h3", {}, "GC over time (this node)"), charts);
  let tables = [], table = "", dry = null; // dry: the dry run's table, once it ran

  const show = (what, doc) => { answer.textContent = `${what}\n${stringify(doc, null, 2)}`; };
  const job = (name) => async () => {
    try { show(`POST /v1/admin/${name}`, await post(`/v1/admin/${name}`, {})); } catch (e) { ctx.error(e); }
  };
  const gc = (dryRun) => async () => {
    const body = { dry_run: dryRun, ...(table ? { table } : {}) };
    try {
      show(`POST /v1/admin/gc ${stringify(body)}`, await post("/v1/admin/gc", body));
      dry = dryRun ? table : null;
    } catch (e) { ctx.error(e); }
    draw();
  };

  function draw() {
    fill(buttons, h("span", {}, "Run now on this node: "),
      ["seal", "offload", "checkpoint"].map((n) => h("button", { id: `job-${n}`, type: "button", onclick: job(n) }, n)),
      h("span", {}, "  GC of ", select("gc-table", [["", "every table"], ...tables], table, (e) => { table = e.target.value; dry = null; draw(); }),
        " ", h("button", { id: "gc-dry", type: "button", onclick: gc(true) }, "Dry run"), " ",
        h("button", { id: "gc-run", type: "button", disabled: dry !== table, onclick: gc(false),
          title: "after a dry run of the same choice" }, "Run GC")));
  }

  async function refresh() {
    const [list] = await Promise.all([get("/v1/tables"), sample()]);
    tables = list.tables.map((t) => t.name);
    if (!buttons.contains(document.activeElement)) draw();
    fill(charts,
      chart("gc-runs", "GC passes / min", rate((m) => 60 * total(m, "terrascale_gc_runs_total"))),
      chart("gc-reclaimed", "Bytes reclaimed (total)", series((m) => total(m, "terrascale_gc_bytes_reclaimed_total")), " B"),
      chart("gc-garbage", "Garbage ratio", series((m) => total(m, "terrascale_gc_garbage_ratio"))));
  }
  return { refresh, every: 2000 };
}
