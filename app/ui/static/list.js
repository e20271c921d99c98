// /ui: recent swarms, newest first, from GET /swarms (filter by status, paged by its cursor).
import { SWARM_STATUSES, TERMINAL, ago, badge, el, money, progressBar, seconds } from "./dom.js";
import { apiJson, showError, showKeyState } from "./api.js";

const params = new URLSearchParams(location.search);
const PAGE_SIZE = Math.min(200, Math.max(1, Number(params.get("limit")) || 25)); // ?limit=N
const REFRESH_MS = 5000;
const state = {
  status: SWARM_STATUSES.includes(params.get("status")) ? params.get("status") : "",
  cursors: [null], // cursors[i] is where page i starts; the last one is the page shown
  next: null,
};

function renderFilters() {
  const bar = document.getElementById("filters");
  bar.replaceChildren();
  for (const s of ["", ...SWARM_STATUSES]) {
    bar.append(el("button", {
      type: "button", class: "chip", "data-status": s || "all", "aria-pressed": String(s === state.status),
      text: s || "all",
      onclick: () => {
        state.status = s;
        state.cursors = [null];
        const url = new URL(location.href);
        if (s) url.searchParams.set("status", s); else url.searchParams.delete("status");
        history.replaceState(null, "", url);
        renderFilters();
        load();
      },
    }));
  }
}

function firstLine(text, max = 110) {
  const line = (text || "").split("\n", 1)[0];
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

function row(s, now) {
  const href = `/ui/swarms/${encodeURIComponent(s.id)}`;
  const tr = el("tr", { "data-id": s.id, "data-status": s.status },
    el("td", {}, el("div", { class: "swarm-cell" },
      el("a", { href, class: "mono id", text: s.id.slice(0, 8), title: s.id }),
      s.retry_of ? el("span", { class: "tag retry-tag", text: "retry", title: `retry of ${s.retry_of}` }) : null,
      s.retried_by ? el("span", { class: "tag retried-tag", text: "retried", title: `retried as ${s.retried_by}` }) : null,
      el("span", { class: "task-line", text: firstLine(s.task), title: s.task }))),
    el("td", {}, badge(s.status)),
    el("td", { class: "progress-col" }, el("div", { class: "progress-cell" }, progressBar(s.progress),
      el("span", { class: "count mono", text: `${s.progress.succeeded}/${s.progress.total}` }))),
    el("td", { class: "num mono", title: `${s.usage.cost_usd} USD`, text: money(s.usage.cost_usd) }),
    el("td", { class: "num mono", text: seconds(s.timing.wall_s) }),
    el("td", { class: "num", title: new Date(s.created_at).toLocaleString(), text: ago(s.created_at, now) }));
  tr.addEventListener("click", (ev) => { if (!ev.target.closest("a")) location.href = href; });
  return tr;
}

let timer = null;
let seq = 0;

async function load() {
  clearTimeout(timer);
  const mine = ++seq;
  const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (state.status) q.set("status", state.status);
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor) q.set("cursor", cursor);
  const refresh = document.getElementById("refresh-state");
  try {
    const page = await apiJson(`/swarms?${q}`);
    if (mine !== seq) return; // a newer load (filter or page change) answered first
    showError(null);
    state.next = page.next_cursor;
    const now = Date.now();
    document.querySelector("#swarms tbody").replaceChildren(...page.items.map((s) => row(s, now)));
    document.getElementById("empty").hidden = page.items.length > 0;
    const active = page.items.filter((s) => !TERMINAL.has(s.status)).length;
    document.getElementById("summary").textContent =
      `${page.items.length} shown${active ? ` · ${active} active` : ""}`;
    refresh.textContent = `updated ${new Date().toLocaleTimeString()}`;
    refresh.dataset.state = "live";
  } catch (err) {
    if (mine !== seq) return;
    showError(err);
    refresh.dataset.state = "error";
  }
  document.getElementById("newer").disabled = state.cursors.length <= 1;
  document.getElementById("older").disabled = !state.next;
  document.getElementById("page-no").textContent = `page ${state.cursors.length}`;
  timer = setTimeout(() => { if (!document.hidden) load(); else timer = setTimeout(load, REFRESH_MS); },
    REFRESH_MS);
}

document.getElementById("older").addEventListener("click", () => {
  if (!state.next) return;
  state.cursors.push(state.next);
  load();
});
document.getElementById("newer").addEventListener("click", () => {
  if (state.cursors.length > 1) state.cursors.pop();
  load();
});

showKeyState();
renderFilters();
load();
