// The meshmq web console: a single page over the management API (hash routes, no build
// step, no third-party code). An endpoint a broker does not have answers 404; its page
// then says "not available" instead of failing.

const main = document.getElementById("main");
let leave = () => {};  // stops the current page's timers and event feed

// ------------------------------------------------------------------ helpers
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

async function api(path, options = {}) {
  const init = { headers: { Accept: "application/json" }, ...options };
  if (options.json !== undefined) {
    init.body = JSON.stringify(options.json);
    init.headers["Content-Type"] = "application/json";
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (err) {
    return { ok: false, status: 0, body: { error: `broker unreachable: ${err.message}` } };
  }
  let body = null;
  try { body = await resp.json(); } catch { body = null; }
  return { ok: resp.ok, status: resp.status, body: body || {} };
}

function notAvailable(what) {
  return h("p", { class: "notice", "data-unavailable": what },
    `${what} is not available on this broker (its management API has no such endpoint).`);
}

function failure(result) {
  return h("p", { class: "error", role: "alert" },
    `Error ${result.status || ""}: ${result.body.error || "unknown error"}`);
}

function toast(text) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, 4000);
}

const fmt = (n) => (typeof n === "number" ? n.toLocaleString("en") : n ?? "–");
function bytes(n) {
  if (typeof n !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function duration(ms) {
  let secs = Math.floor((ms || 0) / 1000);
  const d = Math.floor(secs / 86400); secs %= 86400;
  const hh = Math.floor(secs / 3600); secs %= 3600;
  const mm = Math.floor(secs / 60);
  return `${d ? d + "d " : ""}${hh}h ${mm}m ${secs % 60}s`;
}

function card(label, value, extra = null) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label),
    h("div", { class: "value" }, value), extra);
}

function gauge(label, used, limit, percent) {
  const pct = typeof percent === "number" ? percent : (limit ? (100 * used) / limit : 0);
  return card(label, `${pct.toFixed(1)} %`,
    h("meter", { min: 0, max: 100, low: 70, high: 90, optimum: 0, value: pct,
      "aria-label": `${label} ${pct.toFixed(1)} percent` }),
    h("div", { class: "label" }, `${bytes(used)} of ${limit ? bytes(limit) : "no limit"}`));
}

// A table whose columns sort on a click on their header.
function sortableTable(caption, columns, rows, rowKey) {
  let key = columns[0].key;
  let dir = 1;
  const tbody = h("tbody");
  const table = h("table", {}, h("caption", { class: "muted", style: "text-align:left" }, caption));
  const headRow = h("tr");
  function render() {
    const sorted = [...rows].sort((a, b) => {
      const x = a[key], y = b[key];
      return (typeof x === "number" && typeof y === "number" ? x - y
        : String(x ?? "").localeCompare(String(y ?? ""))) * dir;
    });
    tbody.replaceChildren(...sorted.map((r) => h("tr", { "data-key": rowKey(r) },
      columns.map((c) => h("td", { class: c.num ? "num" : null, "data-col": c.key },
        c.render ? c.render(r) : fmt(r[c.key]))))));
    for (const th of headRow.children) {
      th.setAttribute("aria-sort", th.dataset.key === key ? (dir > 0 ? "ascending" : "descending") : "none");
    }
  }
  for (const c of columns) {
    const th = h("th", { scope: "col", class: c.num ? "num" : null, "data-key": c.key },
      c.sort === false ? c.label : h("button", {
        type: "button",
        onclick: () => { dir = key === c.key ? -dir : 1; key = c.key; render(); },
      }, c.label));
    headRow.append(th);
  }
  table.append(h("thead", {}, headRow), tbody);
  render();
  return table;
}

// ------------------------------------------------------------------ pages
async function overview() {
  const [broker, stat] = await Promise.all([api("/api/broker"), api("/api/stat")]);
  if (!stat.ok && !broker.ok) return [h("h1", {}, "Overview"), failure(stat)];
  const b = broker.ok ? broker.body : null;
  const st = stat.body;
  const name = b ? b.name : st.broker;
  const memory = b ? b.memory : { bytes: st.memory?.used, limit_bytes: st.memory?.limit,
    percent: st.memory?.percent };
  const store = b ? b.store : { bytes: st.store?.bytes ?? st.store?.size_bytes,
    limit_bytes: st.store?.limit_bytes ?? st.store?.limit, percent: st.store?.percent };
  const dests = st.destinations || [];
  const sum = (k) => dests.reduce((acc, d) => acc + (d[k] || 0), 0);
  return [
    h("h1", {}, "Broker ", h("span", { id: "broker-name" }, name)),
    h("div", { class: "cards" },
      card("Role", b ? b.role : st.ha?.role ?? "standalone"),
      b ? card("Version", `${b.version} (${b.build})`) : card("Build", st.build ?? "–"),
      card("Uptime", duration(b ? b.uptime_ms : st.uptime_ms)),
      card("Connections", fmt(b ? b.connections : st.connections)),
      card("Destinations", fmt(dests.length)),
      card("Messages waiting", fmt(sum("depth"))),
      card("Enqueued", fmt(sum("enqueued"))),
      card("Dequeued", fmt(sum("dequeued"))),
      gauge("Memory", memory?.bytes, memory?.limit_bytes, memory?.percent),
      gauge("Store", store?.bytes, store?.limit_bytes, store?.percent),
      // A node of shards: these figures are its shards' summed; the Shards page splits them.
      b?.shards ? card("Shards", h("a", { href: "#/shards", id: "shards-up" },
        `${b.shards.filter((x) => x.state === "up").length} of ${b.shards.length} up`)) : null),
    broker.ok ? null : h("p", { class: "muted" }, "Figures from /api/stat (/api/broker is not available)."),
  ];
}

async function destinations() {
  let result = await api("/api/destinations");
  let rows;
  let canChange = true;
  if (result.ok) rows = result.body.destinations;
  else if (result.status === 404) {
    const stat = await api("/api/stat");
    if (!stat.ok) return [h("h1", {}, "Destinations"), failure(stat)];
    rows = stat.body.destinations;
    canChange = false;
  } else return [h("h1", {}, "Destinations"), failure(result)];
  const filter = h("input", { type: "search", id: "dest-filter", placeholder: "Filter by name",
    "aria-label": "Filter destinations by name" });
  const holder = h("div");
  const columns = [
    { key: "type", label: "Type" },
    { key: "name", label: "Name", render: (d) => d.type === "queue"
      ? h("a", { href: `#/queue/${encodeURIComponent(d.name)}` }, d.name) : d.name },
    { key: "depth", label: "Depth", num: true },
    { key: "enqueued", label: "Enqueued", num: true },
    { key: "dequeued", label: "Dequeued", num: true },
    { key: "enqueue_rate", label: "In/s", num: true,
      render: (d) => d.enqueue_rate === undefined ? "–" : Number(d.enqueue_rate).toFixed(1) },
    { key: "dequeue_rate", label: "Out/s", num: true,
      render: (d) => d.dequeue_rate === undefined ? "–" : Number(d.dequeue_rate).toFixed(1) },
    { key: "consumers", label: "Consumers", num: true },
    { key: "producers", label: "Producers", num: true },
    { key: "actions", label: "Actions", sort: false, render: (d) => canChange
      ? h("button", { type: "button", class: "act danger", "data-purge": d.name,
        "aria-label": `Purge ${d.type} ${d.name}`,
        onclick: () => purge(d) }, "Purge") : "–" },
  ];
  function draw() {
    const text = filter.value.trim().toLowerCase();
    const shown = rows.filter((d) => d.name.toLowerCase().includes(text));
    holder.replaceChildren(sortableTable(`${shown.length} destinations`, columns, shown,
      (d) => `${d.type}:${d.name}`));
  }
  filter.addEventListener("input", draw);
  draw();
  return [h("h1", {}, "Destinations"), h("div", { class: "toolbar" }, filter),
    canChange ? null : notAvailable("Changing destinations"), holder];
}

async function purge(d) {
  if (!confirm(`Purge every message of ${d.type} ${d.name}?`)) return;
  const r = await api(`/api/destinations/${d.type}/${encodeURIComponent(d.name)}/purge`,
    { method: "POST" });
  if (r.ok) toast(`${d.name}: ${r.body.purged} messages purged`);
  else toast(r.status === 404 ? "Purging is not available on this broker" : `Purge failed: ${r.body.error}`);
  route();
}

async function queue(name) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const offset = Number(params.get("offset") || 0);
  const limit = 50;
  const selector = params.get("selector") || "";
  const base = `/api/queues/${encodeURIComponent(name)}`;
  const q = new URLSearchParams({ offset, limit });
  if (selector) q.set("selector", selector);
  const r = await api(`${base}/messages?${q}`);
  const title = h("h1", {}, "Queue ", h("span", { id: "queue-name" }, name));
  if (r.status === 404 && r.body.error?.startsWith("no such resource")) {
    return [title, notAvailable("Browsing messages")];
  }
  if (!r.ok) return [title, failure(r)];
  const sel = h("input", { type: "search", id: "selector", value: selector, size: 40,
    placeholder: "JMS selector, e.g. priority > 4", "aria-label": "Message selector" });
  const go = (off, selText) => {
    const p = new URLSearchParams({ offset: off });
    if (selText) p.set("selector", selText);
    location.hash = `#/queue/${encodeURIComponent(name)}?${p}`;
  };
  const form = h("form", { class: "toolbar", onsubmit: (e) => { e.preventDefault(); go(0, sel.value); } },
    sel, h("button", { type: "submit", class: "act" }, "Apply"),
    h("button", { type: "button", class: "act", id: "move-all",
      onclick: () => move(base, null, selector) }, "Move all…"),
    name.startsWith("DLQ") || name.includes(".DLQ")
      ? h("button", { type: "button", class: "act", id: "retry-all",
        onclick: () => retry(base, null) }, "Retry all") : null);
  const ids = (m) => m.message_id;
  const detail = h("div", { id: "message-detail" });
  const columns = [
    { key: "message_id", label: "Message id" },
    { key: "timestamp", label: "Time", render: (m) => new Date(m.timestamp).toLocaleString("en") },
    { key: "priority", label: "Priority", num: true },
    { key: "persistent", label: "Persistent", render: (m) => (m.persistent ? "yes" : "no") },
    { key: "redelivered", label: "Redelivered", render: (m) => (m.redelivered ? "yes" : "no") },
    { key: "size", label: "Size", num: true },
    { key: "body_preview", label: "Body", sort: false },
    { key: "actions", label: "Actions", sort: false, render: (m) => h("span", {},
      h("button", { type: "button", class: "act", onclick: () => view(base, m.message_id, detail) }, "View"), " ",
      h("button", { type: "button", class: "act", onclick: () => move(base, [m.message_id], null) }, "Move"), " ",
      h("button", { type: "button", class: "act danger", "aria-label": `Delete message ${m.message_id}`,
        onclick: () => remove(base, m.message_id) }, "Delete")) },
  ];
  const { total, messages } = r.body;
  const pager = h("div", { class: "toolbar" },
    h("button", { type: "button", class: "act", disabled: offset <= 0,
      onclick: () => go(Math.max(0, offset - limit), selector) }, "Previous"),
    h("span", { class: "muted" }, `${total ? offset + 1 : 0}–${offset + messages.length} of ${total}`),
    h("button", { type: "button", class: "act", disabled: offset + limit >= total,
      onclick: () => go(offset + limit, selector) }, "Next"));
  return [title, form, sortableTable(`${total} messages`, columns, messages, ids), pager, detail];
}

async function view(base, id, where) {
  const r = await api(`${base}/messages/${encodeURIComponent(id)}`);
  if (!r.ok) { where.replaceChildren(failure(r)); return; }
  const m = r.body;
  where.replaceChildren(h("h2", {}, `Message ${id}`),
    h("pre", {}, JSON.stringify(m.headers, null, 2)),
    h("pre", {}, `${m.body}${m.truncated ? "\n… (truncated)" : ""}`));
}

async function remove(base, id) {
  if (!confirm(`Delete message ${id}?`)) return;
  const r = await api(`${base}/messages/${encodeURIComponent(id)}`, { method: "DELETE" });
  toast(r.ok ? `Message ${id} deleted` : `Delete failed: ${r.body.error}`);
  route();
}

async function move(base, messageIds, selector) {
  const to = prompt("Move to which destination? (queue://NAME)", "queue://");
  if (!to) return;
  const json = { to };
  if (messageIds) json.message_ids = messageIds;
  if (selector) json.selector = selector;
  const r = await api(`${base}/move`, { method: "POST", json });
  toast(r.ok ? `${r.body.moved} messages moved to ${to}` : `Move failed: ${r.body.error}`);
  route();
}

async function retry(base, messageIds) {
  const r = await api(`${base}/retry`, { method: "POST", json: messageIds ? { message_ids: messageIds } : {} });
  toast(r.ok ? `${r.body.retried} messages sent back` : `Retry failed: ${r.body.error}`);
  route();
}

async function connections() {
  const r = await api("/api/connections");
  const title = h("h1", {}, "Connections");
  if (r.status === 404) return [title, notAvailable("The list of connections")];
  if (!r.ok) return [title, failure(r)];
  const columns = [
    { key: "id", label: "Id" }, { key: "protocol", label: "Protocol" },
    { key: "user", label: "User" }, { key: "address", label: "Address" },
    { key: "client_id", label: "Client id" },
    { key: "messages_in", label: "In", num: true }, { key: "messages_out", label: "Out", num: true },
    { key: "actions", label: "Actions", sort: false, render: (c) => h("button", {
      type: "button", class: "act danger", "aria-label": `Close connection ${c.id}`,
      onclick: async () => {
        if (!confirm(`Close connection ${c.id}?`)) return;
        const d = await api(`/api/connections/${encodeURIComponent(c.id)}`, { method: "DELETE" });
        toast(d.ok ? `Connection ${c.id} closed` : `Close failed: ${d.body.error}`);
        route();
      } }, "Close") },
  ];
  return [title, sortableTable(`${r.body.connections.length} connections`, columns,
    r.body.connections, (c) => c.id)];
}

async function subscriptions() {
  const r = await api("/api/subscriptions");
  const title = h("h1", {}, "Subscriptions");
  if (r.status === 404) return [title, notAvailable("The list of subscriptions")];
  if (!r.ok) return [title, failure(r)];
  const columns = ["kind", "client_id", "name", "destination", "selector"].map((k) => ({ key: k, label: k.replace("_", " ") }))
    .concat([{ key: "pending", label: "Pending", num: true }, { key: "dispatched", label: "Dispatched", num: true },
      { key: "active", label: "Active", render: (x) => (x.active ? "yes" : "no") }]);
  return [title, sortableTable(`${r.body.subscriptions.length} subscriptions`, columns,
    r.body.subscriptions, (x) => `${x.connection}:${x.name}`)];
}

async function ha() {
  let r = await api("/api/ha");
  const title = h("h1", {}, "High availability");
  let note = null;
  if (r.status === 404) {
    const stat = await api("/api/stat");
    if (!stat.ok) return [title, failure(stat)];
    r = { ok: true, body: stat.body.ha || {} };
    note = h("p", { class: "muted" }, "From /api/stat (/api/ha is not available).");
  }
  if (!r.ok) return [title, failure(r)];
  const body = r.body;
  return [title, h("div", { class: "cards" },
    card("Mode", body.mode ?? "–"), card("Role", body.role ?? "–"), card("Epoch", fmt(body.epoch ?? "–"))),
    h("h2", {}, "Details"), h("pre", { id: "ha-detail" }, JSON.stringify(body, null, 2)), note];
}

// ------------------------------------------------------------------ a node's shards
const SHARD_REFRESH_MS = 2000;
const rate = (n) => (typeof n === "number" ? n.toFixed(1) : "–");

function shardTables(doc) {
  const t = doc.totals || {};
  const cards = h("div", { class: "cards", id: "shard-totals" },
    card("Shards running", `${doc.shards.filter((x) => x.state === "running").length} of ${doc.count}`),
    card("Connections", fmt(t.connections)), card("Destinations", fmt(t.destinations)),
    card("In/s", rate(t.in_rate)), card("Out/s", rate(t.out_rate)),
    card("CPU", `${rate(t.cpu_percent)} %`), card("Journals", bytes(t.journal_bytes)));
  const columns = [
    { key: "shard", label: "Shard", num: true },
    { key: "state", label: "State", render: (r) => h("span", { class: `shard-${r.state}` },
      r.state + (r.answering || r.state !== "running" ? "" : " (not answering)")) },
    { key: "pid", label: "Pid", num: true, render: (r) => String(r.pid ?? "–") },
    { key: "restarts", label: "Restarts", num: true,
      render: (r) => h("span", { title: r.last_exit ? `last exit: ${r.last_exit}` : "" }, fmt(r.restarts)) },
    { key: "uptime_ms", label: "Uptime", num: true, render: (r) => duration(r.uptime_ms) },
    { key: "connections", label: "Connections", num: true },
    { key: "destinations", label: "Destinations", num: true },
    { key: "messages_in", label: "In", num: true },
    { key: "messages_out", label: "Out", num: true },
    { key: "in_rate", label: "In/s", num: true, render: (r) => rate(r.in_rate) },
    { key: "out_rate", label: "Out/s", num: true, render: (r) => rate(r.out_rate) },
    { key: "cpu_seconds", label: "CPU s", num: true, render: (r) => rate(r.cpu_seconds) },
    { key: "cpu_percent", label: "CPU %", num: true, render: (r) => rate(r.cpu_percent) },
    { key: "journal_bytes", label: "Journal", num: true, render: (r) => bytes(r.journal_bytes) },
  ];
  const shardTable = sortableTable(`${doc.count} shards`, columns, doc.shards, (r) => String(r.shard));
  shardTable.id = "shard-table";
  const links = doc.shards.flatMap((r) => (r.links || []).map((l) => ({ ...l, link: `${r.shard}->${l.shard}` })));
  const linkTable = sortableTable("Shard links: a link 0->1 is shard 0's to shard 1 (sent: sends to 1 as owner; delivered out: to 1's consumers; parked: 1's sends held at 0's memory limit)", [
    { key: "link", label: "Link" },
    { key: "up", label: "Up", render: (l) => (l.up ? "yes" : "no") },
    { key: "sent", label: "Sent", num: true },
    { key: "delivered_out", label: "Delivered out", num: true },
    { key: "parked", label: "Parked", num: true },
  ], links, (l) => l.link);
  linkTable.id = "link-table";
  return [cards, h("h2", {}, "Shards"), shardTable, h("h2", {}, "Links"), linkTable];
}

async function shards() {
  const title = h("h1", {}, "Shards");
  const first = await api("/api/shards");
  if (first.status === 404) return [title, notAvailable("The shard view")];
  if (!first.ok) return [title, failure(first)];
  const holder = h("div", { id: "shard-view" }, ...shardTables(first.body));
  const updated = h("p", { class: "muted", id: "shards-updated" }, "");
  // Refreshed in place while the page is open: a shard that restarts shows it.
  const timer = setInterval(async () => {
    const r = await api("/api/shards");
    if (r.ok) {
      holder.replaceChildren(...shardTables(r.body));
      updated.textContent = `Updated ${new Date().toLocaleTimeString("en")}`;
      updated.dataset.at = String(Date.now());
    } else updated.textContent = `Not updated: ${r.body.error || r.status}`;
  }, SHARD_REFRESH_MS);
  leave = () => clearInterval(timer);
  return [title, h("p", { class: "muted" },
    "The node's shards, one process each; the figures at the top are their sums. Destinations are counted on the shard that owns them."),
  holder, updated];
}

// ------------------------------------------------------------------ the network map
const STATE_WORDS = { forwarding: "forwarding", connecting: "connecting", handshaking: "handshaking",
  "syncing-demand": "syncing", "backing-off": "down", stopped: "stopped" };

// Brokers on a circle, in name order: the same network is always drawn the same way.
function drawMap(svg, table, map) {
  const nodes = map.nodes || [];
  const edges = map.edges || [];
  const W = 900, H = Math.max(420, 160 + 60 * nodes.length);
  const cx = W / 2, cy = H / 2, r = Math.min(W, H) / 2 - 90;
  const at = {};
  nodes.forEach((n, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(1, nodes.length);
    at[n.broker] = nodes.length === 1 ? [cx, cy] : [cx + r * Math.cos(a), cy + r * Math.sin(a)];
  });
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const defs = s("defs", {}, ...["forwarding", "warn", "bad"].map((k) => s("marker", {
    id: `arrow-${k}`, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7,
    orient: "auto-start-reverse" }, s("path", { d: "M0,0 L10,5 L0,10 z",
    fill: k === "forwarding" ? "#1f8a4c" : k === "warn" ? "#b7791f" : "#c53030" }))));
  const parts = [defs];
  for (const e of edges) {
    const a = at[e.from], b = at[e.to];
    if (!a || !b) continue;
    const dx = b[0] - a[0], dy = b[1] - a[1], len = Math.hypot(dx, dy) || 1;
    const ux = dx / len, uy = dy / len, R = 52;
    const x1 = a[0] + ux * R, y1 = a[1] + uy * R, x2 = b[0] - ux * R, y2 = b[1] - uy * R;
    const kind = e.state === "forwarding" ? "forwarding"
      : ["backing-off", "stopped"].includes(e.state) ? "bad" : "warn";
    const word = STATE_WORDS[e.state] || e.state;
    const tip = `${e.from} → ${e.to}: ${e.state}` + (e.last_error_kind ? ` (last error: ${e.last_error_kind})` : "")
      + (e.demand?.length ? `\ndemand: ${e.demand.join(", ")}` : "");
    parts.push(s("g", { class: `edge state-${e.state}`, "data-from": e.from, "data-to": e.to,
      "data-state": e.state, "data-error": e.last_error_kind || "" },
    s("title", {}, tip),
    s("line", { x1, y1, x2, y2, "marker-end": `url(#arrow-${kind})`, ...(e.duplex ? { "marker-start": `url(#arrow-${kind})` } : {}) }),
    s("text", { x: (x1 + x2) / 2 - uy * 14, y: (y1 + y2) / 2 + ux * 14, "text-anchor": "middle", class: "edge-label" },
      word + (e.last_error_kind && e.state !== "forwarding" ? ` · ${e.last_error_kind}` : ""))));
  }
  for (const n of nodes) {
    const [x, y] = at[n.broker];
    const rates = n.rates ? `in ${n.rates.enqueue_rate}/s · out ${n.rates.dequeue_rate}/s` : "unreachable";
    const g = s("g", { class: "node", "data-broker": n.broker, "data-reachable": String(n.reachable),
      transform: `translate(${x},${y})` },
    s("title", {}, `${n.broker}${n.management_url ? ` (${n.management_url})` : ""}` +
      (n.reachable ? `\nrole: ${n.role}\ndepth: ${n.rates.depth}` : `\n${n.error || "unreachable"}`)),
    s("circle", { r: 50 }),
    s("text", { class: "name", "text-anchor": "middle", y: -6 }, n.broker),
    s("text", { class: "sub", "text-anchor": "middle", y: 12 }, n.reachable ? n.role : "unreachable"),
    s("text", { class: "sub", "text-anchor": "middle", y: 72 }, rates));
    parts.push(g);
  }
  svg.replaceChildren(...parts);
  table.replaceChildren(h("caption", { class: "muted", style: "text-align:left" }, "Bridges"),
    h("thead", {}, h("tr", {}, ["From", "To", "State", "Last error", "Demand"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, edges.map((e) => h("tr", { "data-edge": `${e.from}->${e.to}` },
      h("td", {}, e.from), h("td", {}, e.to), h("td", {}, e.state),
      h("td", {}, e.last_error_kind || "–"), h("td", {}, e.demand?.length ? e.demand.join(", ") : "–")))));
}

async function network() {
  const title = h("h1", {}, "Network");
  const svg = s("svg", { class: "map", id: "network-map", role: "img",
    "aria-label": "Map of the network of brokers" });
  const table = h("table", { id: "bridge-table" });
  const updated = h("p", { class: "muted", id: "map-updated", "aria-live": "off" }, "");
  const first = await api("/api/network/map");
  if (first.status === 404) return [title, notAvailable("The network map")];
  if (!first.ok) return [title, failure(first)];
  const show = (map) => {
    drawMap(svg, table, map);
    updated.textContent = `Updated ${new Date((map.at || Date.now() / 1000) * 1000).toLocaleTimeString("en")}`;
  };
  show(first.body);
  const feed = new EventSource("/api/events");
  feed.addEventListener("snapshot", (ev) => {
    const data = JSON.parse(ev.data);
    if (data.map) show(data.map);
  });
  leave = () => feed.close();
  return [title,
    h("p", { class: "muted" }, "Every broker reachable from this one, live. Hover a bridge for its last error and demand."),
    h("div", { class: "legend" }, h("span", { class: "ok" }, "forwarding"),
      h("span", { class: "warn" }, "connecting"), h("span", { class: "bad" }, "down")),
    svg, updated, table];
}

// ------------------------------------------------------------------ routing
const PAGES = { overview, destinations, connections, subscriptions, network, ha, shards };

async function route() {
  leave();
  leave = () => {};
  const hash = location.hash.replace(/^#\/?/, "");
  const [path] = hash.split("?");
  const [page, ...rest] = path.split("/");
  let render;
  let current = page;
  if (page === "queue" && rest.length) {
    const name = decodeURIComponent(rest.join("/"));
    render = () => queue(name);
    current = "destinations";
  } else {
    render = PAGES[page] || overview;
    if (!PAGES[page]) current = "overview";
  }
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  let content;
  try {
    content = await render();
  } catch (err) {
    content = [h("p", { class: "error", role: "alert" }, `The page failed: ${err.message}`)];
  }
  main.replaceChildren(...[].concat(content).filter(Boolean));
  main.dataset.page = current;
  main.dataset.ready = String(Date.now());
}

async function badge() {
  const r = await api("/api/health");
  const node = r.ok && r.body.shards;  // a node of shards: its Shards page
  document.getElementById("broker-badge").textContent = !r.ok ? "broker unreachable"
    : node ? `node ${r.body.broker} (${r.body.shards.count} shards)` : `broker ${r.body.broker}`;
  document.getElementById("nav-shards").hidden = !node;
}

window.addEventListener("hashchange", route);
badge();
route();
