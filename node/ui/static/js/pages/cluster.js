// Cluster: members (up or down, version, role), the catalog leader, and per table partition
// its leader, epoch, replicas and each follower's lag; under-replicated partitions highlighted.
// Membership changes wait for a second click (the confirmation).
import { del, enc, get, post } from "../api.js";
import { bytes, card, fill, h, num, table } from "../dom.js";

const CATCH_UP_BYTES = 4 << 20; // as the node's metric: further behind than one catch-up message

export function mount(el, ctx) {
  const head = h("div", { class: "cards" });
  const members = h("div");
  const parts = h("div");
  const change = h("div", { class: "panel" });
  fill(el, h("h2", {}, "Cluster"), head, h("h3", {}, "Members"), members, change,
    h("h3", {}, "Partitions"), parts);
  let pending = null; // the membership change waiting for its confirmation
  const again = () => drawChange();

  function drawChange() {
    const addr = h("input", { id: "member-address", placeholder: "host:raftport" });
    const ask = () => { pending = { op: "add", address: addr.value.trim() }; drawChange(); };
    fill(change, h("strong", {}, "Membership "), addr, h("button", { id: "member-add", type: "button", onclick: ask },
      "Add member…"), pending ? confirmBox() : null);
  }

  function confirmBox() {
    const { op, address } = pending;
    const run = async () => {
      pending = null;
      try {
        if (op === "add") await post("/v1/admin/cluster/members", { raft_address: address });
        else await del(`/v1/admin/cluster/members/${enc(address)}`);
      } catch (e) { ctx.error(e); }
      drawChange();
    };
    return h("span", { class: "confirm", id: "confirm" }, `${op === "add" ? "Add" : "Remove"} the member at ${address}? `,
      h("button", { id: "confirm-yes", type: "button", onclick: run }, "Confirm"),
      h("button", { type: "button", onclick: () => { pending = null; again(); } }, "Cancel"));
  }

  async function refresh() {
    const [view, nodes] = await Promise.all([get("/v1/admin/cluster"), get("/v1/admin/nodes")]);
    const byId = Object.fromEntries(nodes.nodes.map((n) => [n.id, n]));
    const up = (id) => byId[id] && byId[id].alive && byId[id].status !== null;
    const upCount = nodes.nodes.filter((n) => up(n.id)).length;
    fill(head, card("catalog leader", view.leader ?? "none", "catalog-leader"), card("Raft term", view.term, "term"),
      card("members up", `${upCount} / ${view.members.length}`, "up"), card("catalog", view.catalog));
    fill(members, memberTable(view, byId, up, (m) => { pending = { op: "remove", address: m.raft_address }; again(); }));
    fill(parts, partitionTable(view.placement, byId, up));
    if (!change.firstChild) drawChange();
  }
  return { refresh, every: 2000 };
}

function memberTable(view, byId, up, remove) {
  const rows = view.members.map((m) => {
    const st = (byId[m.id] || {}).status;
    return [m.id, m.address ?? "—", { text: up(m.id) ? "up" : "down", class: up(m.id) ? "up-label state" : "state", k: "state" },
      m.id === view.leader ? "leader" : "", st ? st.version : "—", st ? st.role : "—", num(st ? st.uptime_s : null),
      num(st ? st.partitions_owned : null, "led"), st ? String(st.ready) : "—", (byId[m.id] || {}).error ?? "",
      m.raft_address ? h("button", { type: "button", class: "danger", onclick: () => remove(m) }, "Remove…") : ""];
  });
  return table(["node", "address", "state", "catalog", "version", "role", "uptime s", "partitions led", "ready",
    "error", ""], rows, (r, i) => ({ "data-node": view.members[i].id, class: up(view.members[i].id) ? "" : "down" }),
  { id: "members" });
}

/** Each follower's lag as its partition's leader reports it (null: the leader does not answer). */
function followers(byId, leader, key) {
  const st = byId[leader] && byId[leader].status;
  const led = st && st.replication && st.replication.led && st.replication.led[key];
  return led ? led.followers : null;
}

function partitionTable(placement, byId, up) {
  const rows = [], attrs = [];
  for (const [name, parts] of Object.entries(placement || {})) {
    for (const p of parts) {
      const key = `${name}/${p.partition}`;
      const fl = p.replicas.length > 1 ? followers(byId, p.leader, key) : {};
      const lags = fl ? Object.entries(fl).map(([n, f]) =>
        `${n}: ${f.lag_bytes === null ? "?" : bytes(f.lag_bytes)}, ${f.ack_age_s === null ? "?" : f.ack_age_s + " s"}`) : ["unknown"];
      const under = p.replicas.some((r) => !up(r)) || fl === null ||
        Object.values(fl).some((f) => f.lag_bytes === null || f.lag_bytes > CATCH_UP_BYTES);
      rows.push([name, num(p.partition), { text: p.leader, k: "leader" }, num(p.epoch, "epoch"), p.replicas.join(", "),
        lags.join("; "), { text: under ? "under-replicated" : "ok", k: "health" }]);
      attrs.push({ "data-part": key, class: under ? "under" : "" });
    }
  }
  if (!rows.length) return h("p", { class: "muted" }, "No tables yet.");
  return table(["table", "partition", "leader", "epoch", "replicas", "follower lag (bytes, last ack)", "replication"],
    rows, (r, i) => attrs[i], { id: "partitions" });
}
