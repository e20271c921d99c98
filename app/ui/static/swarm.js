// /ui/swarms/{id}: the swarm's DAG, live from GET /swarms/{id}/events, with the selected
// subtask's details, the swarm's timing and cost, and a cancel button. Public API only.
import {
  ApiError, SUBTASK_STATUSES, TERMINAL, api, apiJson, badge, el, money, progressBar, readEvents,
  seconds, showError, showKeyState, tokens, when,
} from "./common.js";
import { DagView } from "./dag.js";

const swarmId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const base = `/swarms/${encodeURIComponent(swarmId)}`;
const RANK = { pending: 0, running: 1, succeeded: 2, failed: 2, skipped: 2, cancelled: 2 };
const SWARM_RANK = { queued: 0, planning: 1, running: 2, synthesizing: 3, succeeded: 4,
  failed: 4, cancelled: 4 };
const EVENT_STATUS = { "subtask.started": "running", "subtask.succeeded": "succeeded",
  "subtask.failed": "failed", "subtask.skipped": "skipped" };

let swarm = null;
let selected = new URLSearchParams(location.hash.slice(1)).get("subtask");
let detail = null; // GET /swarms/{id}/subtasks/{name} of the selected one, when the service has it
const view = new DagView(document.getElementById("graph"), { onSelect: (n) => select(n, false) });
const abort = new AbortController();

// ---- reading the swarm -----------------------------------------------------------------------

let fetching = null;
let again = false;
let lastFetch = 0;

/** Re-read the swarm (costs, timing, new subtasks); calls while one runs coalesce into one. */
function refetch() {
  if (fetching) { again = true; return fetching; }
  fetching = (async () => {
    try {
      const wait = Math.max(0, lastFetch + minInterval() - Date.now());
      if (wait) await new Promise((ok) => setTimeout(ok, wait));
      lastFetch = Date.now();
      const fresh = await apiJson(base);
      showError(null);
      merge(fresh);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) showError(err);
    } finally {
      fetching = null;
      if (again) { again = false; refetch(); }
    }
  })();
  return fetching;
}

function minInterval() { // big swarms are big documents: read them less often
  return swarm ? Math.min(5000, 300 + swarm.subtasks.length * 3) : 0;
}

/** A snapshot never takes a subtask back from what the live events already said. */
function merge(fresh) {
  if (swarm) {
    const live = new Map(swarm.subtasks.map((s) => [s.name, s.status]));
    for (const s of fresh.subtasks) {
      const now = live.get(s.name);
      if (now && RANK[now] > RANK[s.status]) s.status = now;
    }
    if (SWARM_RANK[swarm.status] > SWARM_RANK[fresh.status]) fresh.status = swarm.status;
  }
  swarm = fresh;
  render();
}

// ---- live events -----------------------------------------------------------------------------

let dirty = false;

function onEvent(ev) {
  let data = {};
  try { data = JSON.parse(ev.data); } catch { return; }
  const status = EVENT_STATUS[ev.event];
  if (status) {
    const sub = swarm.subtasks.find((s) => s.name === data.name);
    if (!sub) { refetch(); return; } // a subtask born while running (plan, compressor)
    // the stream replays from the first event: never step back from what is already known
    if (RANK[status] >= RANK[sub.status]) sub.status = status;
    if (data.latency_ms !== undefined) sub.latency_ms = data.latency_ms;
    if (data.error) sub.error = data.error;
    view.setStatus(sub.name, sub.status, sub);
    if (status !== "running") dirty = true;
    if (sub.name === selected) loadDetail();
    scheduleSummary();
  } else if (ev.event === "subtask.turn") {
    turned.add(data.name);
    if (data.name === selected) loadDetail();
  } else if (ev.event === "swarm.status") {
    swarm.status = data.status;
    scheduleSummary();
    refetch(); // planning -> running brings the planned subtasks
  } else if (ev.event === "swarm.completed") {
    swarm.status = data.status;
    for (const name of data.cancelled || []) {
      const sub = swarm.subtasks.find((s) => s.name === name);
      if (sub) { sub.status = "cancelled"; view.setStatus(name, "cancelled"); }
    }
    finished = true;
    scheduleSummary();
    refetch();
  }
}

let finished = false;
let summaryQueued = false;

function scheduleSummary() { // many events per frame: one header repaint
  if (summaryQueued) return;
  summaryQueued = true;
  requestAnimationFrame(() => {
    summaryQueued = false;
    recount();
    renderHeader();
    renderStats();
    renderLegend();
  });
}

function recount() {
  const p = { total: swarm.subtasks.length };
  for (const s of SUBTASK_STATUSES) p[s] = 0;
  for (const s of swarm.subtasks) p[s.status] += 1;
  swarm.progress = p;
}

async function follow() {
  const state = document.getElementById("stream-state");
  const setState = (s) => {
    state.dataset.state = s;
    state.textContent = { live: "live", reconnecting: "reconnecting…", ended: "finished",
      error: "stream unavailable" }[s];
    if (s === "reconnecting") refetch();
  };
  setState("live");
  try {
    await readEvents(`${base}/events`, {
      onEvent, onState: setState, signal: abort.signal, isDone: () => finished,
    });
    setState("ended");
  } catch (err) {
    setState("error");
    showError(err);
  }
}

// ---- rendering -------------------------------------------------------------------------------

function render() {
  document.title = `${swarm.id.slice(0, 8)} · ${swarm.status} · Swarm API`;
  renderHeader();
  renderStats();
  view.render(swarm.subtasks);
  renderLegend();
  const note = document.getElementById("graph-note");
  note.hidden = !(view.layout && view.layout.compact);
  note.textContent = `${swarm.subtasks.length} subtasks: compact nodes; click a layer's title to`
    + " collapse it, find a subtask by name, or zoom out.";
  if (selected && !view.subtasks.has(selected)) selected = null;
  view.select(selected);
  renderPanel();
}

function renderHeader() {
  document.getElementById("swarm-id").textContent = swarm.id;
  const b = document.getElementById("swarm-status");
  b.dataset.status = swarm.status;
  b.textContent = swarm.status;
  document.getElementById("swarm-task").textContent = swarm.task;
  document.getElementById("swarm-times").textContent =
    `created ${when(swarm.created_at)}${swarm.finished_at ? ` · finished ${when(swarm.finished_at)}` : ""}`;
  document.getElementById("cancel").hidden = TERMINAL.has(swarm.status);
}

function stat(label, value, sub, attrs = {}) {
  return el("div", { class: "stat", ...attrs },
    el("div", { class: "stat-label", text: label }),
    el("div", { class: "stat-value mono", text: value }),
    sub ? el("div", { class: "stat-sub", text: sub }) : null);
}

function renderStats() {
  const p = swarm.progress;
  const done = p.succeeded + p.failed + p.skipped + p.cancelled;
  const t = swarm.timing;
  const u = swarm.usage;
  const progress = el("div", { class: "stat grow" },
    el("div", { class: "stat-label", text: "Progress" }),
    el("div", { class: "stat-value mono", text: `${done} / ${p.total}` }),
    progressBar(p));
  document.getElementById("stats").replaceChildren(
    progress,
    stat("Cost", money(u.cost_usd), `${tokens(u.prompt_tokens)} in · ${tokens(u.completion_tokens)} out · ${u.gateway_calls} calls`,
      { title: `${u.cost_usd} USD${u.unresolved_usd ? ` (${u.unresolved_usd} unresolved)` : ""}` }),
    stat("Wall time", seconds(t.wall_s), swarm.queue_position ? `queue position ${swarm.queue_position}` : null),
    stat("Critical path", seconds(t.critical_path_s), "highlighted in the graph", { class: "stat critical-stat" }),
    stat("Serial", seconds(t.serial_s), "sum of subtask latencies"),
    stat("Speedup", t.speedup ? `${t.speedup}×` : "–", "serial ÷ wall"),
    stat("Latency p50 / p95", `${seconds(t.subtask_latency_s.p50)} / ${seconds(t.subtask_latency_s.p95)}`, null));
}

let highlight = null;

function renderLegend() {
  const legend = document.getElementById("legend");
  const counts = swarm.progress;
  legend.replaceChildren(...SUBTASK_STATUSES.map((s) => el("button", {
    type: "button", class: "chip", "data-status": s, "aria-pressed": String(highlight === s),
    title: `highlight ${s} subtasks`,
    onclick: () => {
      highlight = highlight === s ? null : s;
      view.setHighlight(highlight);
      renderLegend();
    },
  }, el("span", { class: "dot", "data-status": s }), `${s} `, el("b", { text: String(counts[s] || 0) }))));
}

function kv(pairs) {
  const dl = el("dl", { class: "kv" });
  for (const [k, v] of pairs) if (v !== null && v !== undefined && v !== "") dl.append(el("dt", { text: k }), el("dd", {}, v));
  return dl;
}

function pre(text, cls = "") {
  return el("pre", { class: `out ${cls}`, text });
}

function section(title, ...children) {
  return el("section", { class: "panel-section" }, el("h3", { text: title }), ...children);
}

let panelKey = "";

function renderPanel() {
  const sub0 = selected && swarm.subtasks.find((s) => s.name === selected);
  // re-reads of a running swarm must not reset what the reader scrolled to: redraw on change
  const key = JSON.stringify([selected, sub0 || swarm.status, sub0 ? detail : swarm.result,
    swarm.error, view.critical.has(selected)]);
  if (key === panelKey) return;
  panelKey = key;
  const panel = { replaceChildren: (...nodes) => document.getElementById("panel")
    .replaceChildren(...nodes.filter((n) => n !== null && n !== undefined)) };
  const sub = selected && swarm.subtasks.find((s) => s.name === selected);
  if (!sub) {
    const spec = swarm.spec || {};
    panel.replaceChildren(
      el("h2", { text: "Swarm" }),
      el("p", { class: "muted small", text: "Select a subtask in the graph to see its output, usage and calls." }),
      kv([["status", badge(swarm.status)], ["model", spec.model], ["synthesis", spec.synthesis && spec.synthesis.strategy],
        ["started", when(swarm.started_at)], ["finished", swarm.finished_at ? when(swarm.finished_at) : null],
        ["budget", spec.limits && spec.limits.budget_usd ? `$${spec.limits.budget_usd}` : null],
        ["concurrency", spec.limits && String(spec.limits.concurrency)]]),
      swarm.error ? section("Error", pre(JSON.stringify(swarm.error, null, 2), "error")) : null,
      section("Result", swarm.result ? pre(swarm.result) : el("p", { class: "muted", text: TERMINAL.has(swarm.status) ? "No result." : "Not finished yet." })),
      Object.keys(swarm.metadata || {}).length ? section("Metadata", pre(JSON.stringify(swarm.metadata, null, 2))) : null);
    return;
  }
  const d = detail && detail.name === sub.name ? { ...sub, ...detail, status: sub.status } : sub;
  const deps = el("div", { class: "deps" }, ...(d.depends_on.length ? d.depends_on.map((n) => el("button", {
    type: "button", class: "link mono", text: n, onclick: () => select(n) })) : [el("span", { class: "muted", text: "none" })]));
  panel.replaceChildren(
    el("div", { class: "panel-head" },
      el("h2", { class: "mono", text: d.name }), badge(d.status),
      el("button", { type: "button", class: "link close", text: "× close", onclick: () => select(null) })),
    kv([["kind", d.kind], ["model", d.model], ["attempts", String(d.attempts)],
      ["latency", d.latency_ms !== null && d.latency_ms !== undefined ? seconds(d.latency_ms / 1000) : "–"],
      ["tokens", `${d.usage.prompt_tokens} in · ${d.usage.completion_tokens} out`],
      ["cost", el("span", { class: "mono", title: `${d.usage.cost_usd} USD`, text: money(d.usage.cost_usd) })],
      ["started", when(d.started_at)], ["finished", when(d.finished_at)],
      ["turns", d.turns ? String(d.turns) : null], ["tool calls", d.tool_calls ? String(d.tool_calls) : null],
      ["depends on", deps]]),
    d.critical || view.critical.has(d.name) ? el("p", { class: "crit-note", text: "On the critical path." }) : null,
    d.error ? section("Error", pre(JSON.stringify(d.error, null, 2), "error")) : null,
    toolCalls(d),
    section(d.truncated ? "Output (truncated)" : "Output",
      d.output ? pre(d.output) : el("p", { class: "muted", text: d.status === "running" ? "Running…" : "No output." })));
}

/** Tool calls from the subtask's transcript: each call with its arguments and result. */
function toolCalls(d) {
  const transcript = Array.isArray(d.transcript) ? d.transcript : [];
  const results = new Map();
  for (const m of transcript) if (m && m.role === "tool") results.set(m.tool_call_id, m.content);
  const items = [];
  let turn = 0;
  for (const m of transcript) {
    if (!m || m.role !== "assistant") continue;
    turn += 1;
    for (const call of m.tool_calls || []) {
      const fn = call.function || {};
      let args = fn.arguments || "";
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* shown as sent */ }
      const result = results.get(call.id);
      const text = typeof result === "string" ? result : JSON.stringify(result, null, 2);
      const failed = typeof text === "string" && text.startsWith("error:");
      items.push(el("li", { class: `tool-call${failed ? " failed" : ""}` },
        el("div", { class: "tool-head" }, el("span", { class: "mono tool-name", text: (fn.name || "?").replace("__", ".") }),
          el("span", { class: "muted small", text: `turn ${turn}` })),
        el("details", {}, el("summary", { text: "arguments" }), pre(args)),
        result === undefined ? el("p", { class: "muted small", text: "no result recorded" })
          : el("details", { open: failed }, el("summary", { text: failed ? "error" : "result" }), pre(text, failed ? "error" : ""))));
    }
  }
  if (!items.length) return d.tool_calls ? section("Tool calls", el("p", { class: "muted", text: `${d.tool_calls} calls (loading transcript…)` })) : null;
  return section(`Tool calls (${items.length})`, el("ol", { class: "tool-calls" }, ...items));
}

let detailSeq = 0;
const turned = new Set(); // subtasks a `subtask.turn` event was seen for

/** The one-subtask resource with its transcript, read only for subtasks that used tools:
 * for the others the swarm's own fields say everything. */
async function loadDetail() {
  if (!selected) return;
  const sub = swarm.subtasks.find((s) => s.name === selected);
  if (!sub || !(sub.tool_calls || sub.turns || turned.has(sub.name))) return;
  const mine = ++detailSeq;
  const name = selected;
  try {
    const r = await api(`${base}/subtasks/${encodeURIComponent(name)}`);
    if (mine !== detailSeq) return;
    detail = r.ok ? await r.json() : null;
  } catch { detail = null; }
  if (mine === detailSeq && selected === name) renderPanel();
}

function select(name, reveal = true) {
  selected = name;
  detail = null;
  history.replaceState(null, "", name ? `#subtask=${encodeURIComponent(name)}` : location.pathname);
  view.select(name);
  renderPanel();
  if (name) { loadDetail(); if (reveal) view.reveal(name); }
}

// ---- controls --------------------------------------------------------------------------------

document.getElementById("cancel").addEventListener("click", () => document.getElementById("confirm-cancel").showModal());
document.getElementById("confirm-cancel").addEventListener("close", async (ev) => {
  if (ev.target.returnValue !== "yes") return;
  try {
    const r = await apiJson(`${base}/cancel`, { method: "POST" });
    merge(r);
  } catch (err) {
    if (err instanceof ApiError && err.code === "already_terminal") refetch(); else showError(err);
  }
});
document.getElementById("show-critical").addEventListener("change", (ev) => {
  view.showCritical = ev.target.checked;
  view.updateCritical();
});
document.getElementById("find").addEventListener("input", (ev) => view.find(ev.target.value));
document.getElementById("zoom-in").addEventListener("click", () => view.setZoom(view.zoom * 1.25));
document.getElementById("zoom-out").addEventListener("click", () => view.setZoom(view.zoom / 1.25));
document.getElementById("zoom-fit").addEventListener("click", () => view.fit());

// while running: after subtasks finish, re-read costs and timing now and then
setInterval(() => {
  if (dirty && swarm && !TERMINAL.has(swarm.status)) { dirty = false; refetch(); }
}, 2000);

async function start() {
  showKeyState();
  document.getElementById("swarm-id").textContent = swarmId;
  try {
    swarm = await apiJson(base);
  } catch (err) {
    showError(err);
    document.getElementById("swarm-status").textContent = err.status === 404 ? "not found" : "error";
    document.getElementById("stream-state").hidden = true;
    return;
  }
  showKeyState();
  render();
  if (selected) loadDetail();
  if (TERMINAL.has(swarm.status)) {
    const s = document.getElementById("stream-state");
    s.dataset.state = "ended";
    s.textContent = "finished";
  } else {
    follow();
  }
}

start();
