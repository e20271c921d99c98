// Building the pages: elements, badges, bars, and figures formatted for reading.

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const SWARM_STATUSES = ["queued", "planning", "awaiting_approval", "running",
  "synthesizing", "succeeded", "failed", "cancelled"];
export const SUBTASK_STATUSES = ["pending", "running", "succeeded", "failed", "skipped",
  "cancelled"];

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

export function badge(status) {
  return el("span", { class: "badge", "data-status": status, text: status });
}

/** Dollars from the API's exact decimal string, rounded for reading (the title keeps all). */
export function money(usd) {
  const v = Number(usd || 0);
  if (v === 0) return "$0";
  if (v < 0.0001) return `$${v.toPrecision(2)}`;
  return `$${v.toFixed(v < 100 ? 4 : 2)}`;
}

export function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "–";
  const s = Math.max(0, (now - Date.parse(iso)) / 1000);
  if (s < 45) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

export function tokens(n) {
  return n >= 10000 ? `${(n / 1000).toFixed(1)}k` : String(n);
}

/** A progress bar of subtask counts, one segment per status. */
export function progressBar(progress) {
  const bar = el("div", { class: "bar", role: "img" });
  const total = progress.total || 0;
  const parts = [];
  for (const s of ["succeeded", "failed", "cancelled", "skipped", "running"]) {
    const n = progress[s] || 0;
    if (!n) continue;
    parts.push(`${n} ${s}`);
    const seg = el("span", { class: "seg", "data-status": s });
    seg.style.width = `${(100 * n) / Math.max(total, 1)}%`;
    bar.append(seg);
  }
  bar.setAttribute("aria-label", parts.join(", ") || "nothing started");
  bar.title = bar.getAttribute("aria-label");
  return bar;
}

/** A cancelled subtask's cost is its cut-off call's reservation (billed at its bounds, an
 * upper bound), not a usage the gateway reported: shown as reserved, never as billed. */
export function isReserved(sub) {
  return sub.status === "cancelled" && Number((sub.usage && sub.usage.cost_usd) || 0) > 0;
}
