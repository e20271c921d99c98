// A broken swarm's page: the failure panel (the swarm's error, its causes, each failed subtask
// with its reason), the Retry button (POST /swarms/{id}/retry, SPEC §11) and the lineage
// both ways: the swarm a retry came from, and the retries made of this one.
import { ApiError, apiJson } from "./api.js";
import { el } from "./dom.js";

const NAMED = 12; // subtasks named per reason; the rest are counted
// one key for this page's retries: a second click (or a reload's resend) starts no second run
const RETRY_KEY = `ui-retry-${[...crypto.getRandomValues(new Uint8Array(12))]
  .map((b) => b.toString(16).padStart(2, "0")).join("")}`;

let failuresKey = "";
let lineageKey = "";

const swarmLink = (id) => el("a", { class: "mono", href: `/ui/swarms/${encodeURIComponent(id)}`,
  text: id.slice(0, 8), title: id });

function reason(error) {
  if (!error) return "no reason recorded";
  const code = error.code || "error";
  return error.message ? `${code}: ${error.message}` : code;
}

/** Failed subtasks grouped by their reason (60 rejected calls are one line, not 60), each
 * group naming its first subtasks as buttons that select them. */
function failureList(failed, onSelect) {
  const groups = new Map();
  for (const s of failed) {
    const why = reason(s.error);
    if (!groups.has(why)) groups.set(why, []);
    groups.get(why).push(s);
  }
  const sorted = [...groups].sort((a, b) => b[1].length - a[1].length);
  return el("ul", { class: "fail-list" }, ...sorted.map(([why, subs]) => {
    const names = subs.slice(0, NAMED).map((s) => el("button", { type: "button", class: "link mono",
      "data-name": s.name, text: s.name, title: s.attempts > 1 ? `after ${s.attempts} attempts` : null,
      onclick: () => onSelect(s.name) }));
    return el("li", { "data-reason": why },
      el("span", { class: "fail-why" }, subs.length > 1 ? el("b", { text: `${subs.length} × ` }) : null, why),
      el("span", { class: "fail-names" }, ...names,
        subs.length > NAMED ? el("span", { class: "muted small", text: `and ${subs.length - NAMED} more` }) : null));
  }));
}

/** The panel over the graph; hidden while nothing has failed and the swarm was not cancelled. */
export function renderFailures(swarm, { onSelect }) {
  const box = document.getElementById("failures");
  const failed = swarm.subtasks.filter((s) => s.status === "failed");
  const broken = swarm.status === "failed" || swarm.status === "cancelled";
  // redrawn only when what it says changed: a reader's click or selection is not lost
  const key = JSON.stringify([swarm.status, swarm.error, swarm.progress,
    failed.map((s) => [s.name, s.error, s.attempts])]);
  if (key === failuresKey) return;
  failuresKey = key;
  box.hidden = !broken && !failed.length;
  if (box.hidden) { box.replaceChildren(); return; }
  const p = swarm.progress;
  const some = `${failed.length} subtask${failed.length === 1 ? "" : "s"} failed`;
  const head = swarm.status === "cancelled" ? "Cancelled" : swarm.status === "failed" ? "Failed"
    : swarm.status === "succeeded" ? `${some}, within the failure tolerance` : `${some} so far`;
  const items = [];
  if (swarm.error) {
    items.push(el("p", { class: "fail-reason", text: reason(swarm.error) }));
    const causes = (swarm.error.details && swarm.error.details.causes) || null;
    if (causes && typeof causes === "object") {
      items.push(el("p", { class: "muted small", text: `causes: ${Object.entries(causes)
        .map(([code, n]) => `${n} × ${code}`).join(", ")}` }));
    }
  }
  if (failed.length) items.push(failureList(failed, onSelect));
  const rest = [];
  if (p.skipped) rest.push(`${p.skipped} skipped (a dependency failed or the swarm stopped first)`);
  if (p.cancelled) rest.push(`${p.cancelled} cancelled`);
  if (p.pending && broken) rest.push(`${p.pending} never started`);
  if (rest.length) items.push(el("p", { class: "muted small", text: rest.join(" · ") }));
  if (broken && !swarm.erased) {
    items.push(el("p", { class: "muted small", text: "Retry starts a new swarm: subtasks that"
      + " succeeded here are reused (no call, no cost); the others and the synthesis run again." }));
  }
  box.dataset.state = swarm.status === "cancelled" ? "cancelled" : "failed";
  box.replaceChildren(el("h2", { text: head }), ...items);
}

/** The Retry button (a failed or cancelled swarm) and the links both ways between retries. */
export function renderLineage(swarm, retries) {
  document.getElementById("retry").hidden = swarm.erased
    || !(swarm.status === "failed" || swarm.status === "cancelled");
  const box = document.getElementById("lineage");
  const key = JSON.stringify([swarm.retry_of, retries, swarm.retried_by]);
  if (key === lineageKey) return;
  lineageKey = key;
  const parts = [];
  if (swarm.retry_of) parts.push(el("span", { class: "retry-of" }, "retry of ", swarmLink(swarm.retry_of)));
  const ids = retries.length ? retries : swarm.retried_by ? [swarm.retried_by] : [];
  if (ids.length) {
    const links = [];
    ids.forEach((id, i) => { if (i) links.push(", "); links.push(swarmLink(id)); });
    parts.push(el("span", { class: "retried-by" }, "retried as ", ...links));
  }
  box.hidden = !parts.length;
  box.replaceChildren(...parts);
}

/** Every retry of `swarmId`, newest first (GET /swarms?retry_of=). */
export async function loadRetries(swarmId) {
  const page = await apiJson(`/swarms?retry_of=${encodeURIComponent(swarmId)}&limit=20`);
  return page.items.map((s) => s.id);
}

/** POST the retry and go to the new swarm's page; a refusal is shown, not thrown. */
export async function retry(swarmId, { onError }) {
  const button = document.getElementById("retry");
  button.disabled = true;
  try {
    const fresh = await apiJson(`/swarms/${encodeURIComponent(swarmId)}/retry`, {
      method: "POST", headers: { "Idempotency-Key": RETRY_KEY } });
    location.assign(`/ui/swarms/${encodeURIComponent(fresh.id)}`);
  } catch (err) {
    button.disabled = false;
    onError(err instanceof ApiError ? err : new Error(String(err)));
  }
}
