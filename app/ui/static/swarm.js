// /ui/swarms/{id}: the swarm's DAG (or its timeline), live from GET /swarms/{id}/events, with
// the selected subtask's details, stat cards on a ticking clock, the failure panel, Retry and
// the retry lineage, cancel and erase buttons (each confirmed), and for a swarm held for
// approval its plan, estimate, Approve and Reject. Public API only.
import { ApiError, api, apiJson, readEvents, showError, showKeyState } from "./api.js";
import { renderApproval } from "./approval.js";
import { DagView } from "./dag-view.js";
import { SUBTASK_STATUSES, TERMINAL, el, when } from "./dom.js";
import { loadRetries, renderFailures, renderLineage, retry } from "./failures.js";
import { Folding } from "./graph-layout.js";
import { renderPanel as drawPanel } from "./panel.js";
import { ServerClock, renderStats as drawStats, tickStats } from "./stats.js";
import { TimelineView } from "./timeline.js";

const swarmId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const base = `/swarms/${encodeURIComponent(swarmId)}`;
const RANK = { pending: 0, running: 1, succeeded: 2, failed: 2, skipped: 2, cancelled: 2 };
const SWARM_RANK = { queued: 0, planning: 1, awaiting_approval: 1.5, running: 2, synthesizing: 3,
  succeeded: 4, failed: 4, cancelled: 4 };
const EVENT_STATUS = { "subtask.started": "running", "subtask.succeeded": "succeeded",
  "subtask.failed": "failed", "subtask.skipped": "skipped" };

let swarm = null;
let selected = new URLSearchParams(location.hash.slice(1)).get("subtask");
let detail = null; // GET /swarms/{id}/subtasks/{name} of the selected one, when the service has it
const folding = new Folding();
const clock = new ServerClock();
const view = new DagView(document.getElementById("graph"), { onSelect: (n) => select(n, false), folding });
const timeline = new TimelineView(document.getElementById("timeline"), { onSelect: (n) => select(n), folding });
let showing = "graph"; // or "timeline"
let retries = []; // ids of this swarm's retries, newest first
let retriesFor = null; // the retried_by they were read for
folding.onChange(() => { view.redraw(); renderTimeline(); renderNote(); });
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
/** An approval's or rejection's answer: the swarm leaves `awaiting_approval` (for `queued`,
 * which ranks below it: a decision moves it back, where a stale read must not). */
function decided(fresh) {
  if (swarm) swarm.status = fresh.status;
  merge(fresh);
}

function merge(fresh) {
  if (swarm && TERMINAL.has(swarm.status) && !TERMINAL.has(fresh.status)) {
    // a snapshot taken before the end (a cancel's answer that arrives after the end's
    // events and read) would bring back its running clock and unbilled usage
    if (swarm.endedHere) refetch();
    return;
  }
  if (swarm) {
    const live = new Map(swarm.subtasks.map((s) => [s.name, s.status]));
    for (const s of fresh.subtasks) {
      const now = live.get(s.name);
      if (now && RANK[now] > RANK[s.status]) s.status = now;
    }
    if (SWARM_RANK[swarm.status] > SWARM_RANK[fresh.status]) fresh.status = swarm.status;
  }
  swarm = fresh;
  clock.update(fresh);
  render();
}

// ---- live events -----------------------------------------------------------------------------

let dirty = false;
const live = new Map(); // subtask name -> its text so far (subtask.delta events)

function onEvent(ev) {
  let data = {};
  try { data = JSON.parse(ev.data); } catch { return; }
  if (data.erased) return; // an erased swarm's events say nothing more than its snapshot
  const status = EVENT_STATUS[ev.event];
  if (status) {
    const sub = swarm.subtasks.find((s) => s.name === data.name);
    if (!sub) { refetch(); return; } // a subtask born while running (plan, compressor)
    // the stream replays from the first event: never step back from what is already known
    if (RANK[status] >= RANK[sub.status]) sub.status = status;
    // the events carry no time: stamp what the snapshot lacks on the service's clock (the
    // next snapshot brings the recorded times)
    const now = new Date(clock.now()).toISOString();
    if (status === "running" && !sub.started_at) sub.started_at = now;
    if (status !== "running" && !sub.finished_at && sub.started_at) sub.finished_at = now;
    if (data.reused) sub.reused = true;
    if (data.latency_ms !== undefined) sub.latency_ms = data.latency_ms;
    if (data.error) sub.error = data.error;
    view.setStatus(sub.name, sub.status, sub);
    if (status !== "running") dirty = true;
    if (sub.name === selected) loadDetail();
    scheduleSummary();
  } else if (ev.event === "subtask.delta") {
    // a worker's text as it comes (a swarm with limits.stream_tokens): shown until its output
    live.set(data.name, (live.get(data.name) || "") + (data.text || ""));
    if (data.name === selected) renderPanel();
  } else if (ev.event === "subtask.turn") {
    turned.add(data.name);
    if (data.name === selected) loadDetail();
  } else if (ev.event === "swarm.awaiting_approval") {
    swarm.status = data.status;
    refetch(); // the plan and estimate
  } else if (ev.event === "swarm.status") {
    swarm.status = data.status;
    scheduleSummary();
    refetch(); // planning -> running brings the planned subtasks
  } else if (ev.event === "swarm.completed") {
    swarm.status = data.status;
    // the clock stops now; the snapshot this asks for brings the recorded end
    if (!swarm.finished_at) {
      swarm.finished_at = new Date(clock.now()).toISOString();
      swarm.endedHere = true; // wall time from these two stamps until the snapshot says
    }
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
    view.updateCritical(); // live latencies move the chain: the card and the graph agree
    renderStats();
    renderLegend();
    renderFailures(swarm, { onSelect: select });
    renderTimeline();
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
    // a swarm that streams its workers' tokens: ask for them too
    const tokens = swarm && swarm.spec && swarm.spec.limits && swarm.spec.limits.stream_tokens;
    await readEvents(`${base}/events${tokens ? "?deltas=true" : ""}`, {
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
  view.render(swarm.subtasks);
  renderStats();
  renderLegend();
  renderNote();
  renderFailures(swarm, { onSelect: select });
  renderApproval(swarm, { base, onDecided: decided, onError: showError });
  renderLineage(swarm, retries);
  readRetries();
  if (selected && !view.subtasks.has(selected)) selected = null;
  view.select(selected);
  renderTimeline();
  renderPanel();
}

function renderNote() {
  const note = document.getElementById("graph-note");
  const folded = view.layout ? view.layout.summaries.size : 0;
  const bits = [];
  if (folded) bits.push(`${folded} layer${folded === 1 ? "" : "s"} shown as one summary node each (click one to expand it)`);
  if (view.layout && view.layout.compact) bits.push("compact nodes");
  note.hidden = !bits.length;
  note.textContent = `${swarm.subtasks.length} subtasks: ${bits.join("; ")}. Find a subtask by name to go to it.`;
}

function renderStats() { drawStats(swarm, view.criticalInfo, clock); }

function renderPanel() {
  drawPanel({ swarm, selected, detail, critical: view.critical, onSelect: select,
    live: selected ? live.get(selected) : undefined });
}

function renderTimeline() {
  if (showing !== "timeline" || !swarm) return;
  timeline.selected = selected;
  timeline.render(swarm, view.layout, clock.now());
}

/** This swarm's retries (both ways of the lineage), read again when a new one appears. */
async function readRetries() {
  if (!swarm.retried_by || retriesFor === swarm.retried_by) return;
  retriesFor = swarm.retried_by;
  try {
    retries = await loadRetries(swarm.id);
    renderLineage(swarm, retries);
  } catch (err) {
    showError(err);
  }
}

function renderHeader() {
  document.getElementById("swarm-id").textContent = swarm.id;
  const b = document.getElementById("swarm-status");
  b.dataset.status = swarm.status;
  b.textContent = swarm.status;
  document.getElementById("swarm-task").textContent = swarm.erased
    ? "Content erased: the task, outputs and result are gone; status, times and usage stay." : swarm.task;
  document.getElementById("swarm-times").textContent =
    `created ${when(swarm.created_at)}${swarm.finished_at ? ` · finished ${when(swarm.finished_at)}` : ""}`;
  document.getElementById("cancel").hidden = TERMINAL.has(swarm.status);
  document.getElementById("retry").hidden = swarm.erased || !(swarm.status === "failed" || swarm.status === "cancelled");
  document.getElementById("erase").hidden = swarm.erased || !TERMINAL.has(swarm.status);
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
  const L = view.layout;
  if (name && reveal && L && !L.nodes.has(name) && L.layer.has(name)) {
    folding.set(L.layer.get(name), false); // picked from the failure panel or the timeline
  }
  view.select(name);
  renderPanel();
  renderTimeline();
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
document.getElementById("erase").addEventListener("click", () => document.getElementById("confirm-erase").showModal());
document.getElementById("confirm-erase").addEventListener("close", async (ev) => {
  if (ev.target.returnValue !== "yes") return;
  try {
    await apiJson(base, { method: "DELETE" });
    refetch();
  } catch (err) { showError(err); }
});
document.getElementById("show-critical").addEventListener("change", (ev) => {
  view.showCritical = ev.target.checked;
  view.updateCritical();
});
const findBox = document.getElementById("find");
function showFound(n) {
  const out = document.getElementById("find-count");
  out.textContent = findBox.value.trim() ? `${n ? view.matchAt + 1 : 0} of ${n}` : "";
}
findBox.addEventListener("input", () => { if (showing !== "graph") show("graph"); showFound(view.find(findBox.value)); });
findBox.addEventListener("keydown", (ev) => {
  if (ev.key !== "Enter") return;
  ev.preventDefault();
  view.findNext();
  showFound(view.matches.length);
});
const layerIds = () => (view.layout ? view.layout.boxes.map((b) => b.li) : []);
document.getElementById("collapse-all").addEventListener("click", () => folding.all(true, layerIds()));
document.getElementById("expand-all").addEventListener("click", () => folding.all(false, layerIds()));
document.getElementById("retry").addEventListener("click", () => retry(swarmId, { onError: showError }));

function show(which) {
  showing = which;
  document.getElementById("graph").hidden = which !== "graph";
  document.getElementById("timeline").hidden = which !== "timeline";
  for (const b of document.querySelectorAll("[data-view]")) b.setAttribute("aria-pressed", String(b.dataset.view === which));
  for (const id of ["zoom-in", "zoom-out", "zoom-fit", "show-critical"]) document.getElementById(id).disabled = which !== "graph";
  renderTimeline();
}
for (const b of document.querySelectorAll("[data-view]")) b.addEventListener("click", () => show(b.dataset.view));
document.getElementById("zoom-in").addEventListener("click", () => view.setZoom(view.zoom * 1.25));
document.getElementById("zoom-out").addEventListener("click", () => view.setZoom(view.zoom / 1.25));
document.getElementById("zoom-fit").addEventListener("click", () => view.fit());

// while running: after subtasks finish, re-read costs and timing now and then
setInterval(() => {
  if (dirty && swarm && !TERMINAL.has(swarm.status)) { dirty = false; refetch(); }
}, 2000);

// the clock ticks between events: wall time, and the timeline's running bars
setInterval(() => {
  if (!swarm || swarm.finished_at) return;
  tickStats(swarm, clock);
  renderTimeline();
}, 1000);

async function start() {
  showKeyState();
  document.getElementById("swarm-id").textContent = swarmId;
  try {
    swarm = await apiJson(base);
    clock.update(swarm);
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
