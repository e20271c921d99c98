// A swarm held for approval (SPEC §14): its estimate and plan, the plan as JSON to edit, and
// Approve (POST /swarms/{id}/approve, with the edited plan when it was changed) / Reject
// (POST /swarms/{id}/reject, with a reason). Hidden for any other status.
import { apiJson } from "./api.js";
import { el, money } from "./dom.js";

let shownFor = ""; // the plan and estimate drawn: a redraw would lose the reviewer's edits

function figures(estimate) {
  const e = estimate || {};
  const row = (label, value, title) => el("div", { class: "approval-figure", title },
    el("span", { class: "muted small", text: label }), el("b", { text: value }));
  const cost = e.cost_usd || {};
  return el("div", { class: "approval-figures" },
    row("agents", String(e.agents ?? "–"), "workers of the plan"),
    row("width · depth", `${e.width ?? "–"} · ${e.depth ?? "–"}`, "the widest layer, the longest chain"),
    row("calls", `${e.calls?.expected ?? "–"} (max ${e.calls?.max ?? "–"})`),
    row("expected cost", money(cost.expected), `${cost.expected} USD`),
    row("max cost", money(cost.max), `${cost.max} USD: what the budget would reserve`));
}

function planList(plan) {
  const agents = (plan && plan.agents) || [];
  return el("ol", { class: "approval-plan" }, ...agents.map((a) => el("li", { "data-name": a.name },
    el("b", { class: "mono", text: a.name }),
    el("span", { class: "muted small", text: ` ${a.model || ""}${a.depends_on && a.depends_on.length ? ` · after ${a.depends_on.join(", ")}` : ""}` }),
    a.prompt ? el("div", { class: "small", text: a.prompt }) : null)));
}

/** The approval card; `onDecided(swarm)` takes the route's answer, `onError` shows a failure. */
export function renderApproval(swarm, { base, onDecided, onError }) {
  const box = document.getElementById("approval");
  if (swarm.status !== "awaiting_approval") {
    box.hidden = true;
    box.replaceChildren();
    shownFor = "";
    return;
  }
  const key = JSON.stringify([swarm.id, swarm.plan, swarm.estimate]);
  if (key === shownFor) return;
  shownFor = key;
  const original = JSON.stringify(swarm.plan, null, 2);
  const editor = el("textarea", { id: "plan-editor", class: "mono plan-editor", rows: "12",
    spellcheck: "false", "aria-label": "The plan as JSON: edit it, then Approve" });
  editor.value = original;
  const reason = el("input", { type: "text", id: "reject-reason", placeholder: "reason (optional)",
    "aria-label": "Why the plan is rejected" });
  const note = el("p", { class: "small approval-note", id: "approval-note", role: "status" });
  const decide = async (path, body) => {
    note.textContent = "";
    try {
      onDecided(await apiJson(`${base}/${path}`, { method: "POST", body: JSON.stringify(body),
        headers: { "Content-Type": "application/json" } }));
    } catch (err) {
      note.textContent = err.message || String(err);
      onError(err);
    }
  };
  const approve = () => {
    if (editor.value.trim() === original.trim()) return decide("approve", {});
    let edited;
    try {
      edited = JSON.parse(editor.value);
    } catch (err) {
      note.textContent = `The plan is not valid JSON: ${err.message}`;
      return null;
    }
    return decide("approve", Array.isArray(edited) ? { agents: edited } : edited);
  };
  box.hidden = false;
  box.replaceChildren(
    el("h2", { text: "Awaiting approval" }),
    el("p", { class: "muted small", text: "Nothing runs and nothing is reserved until the plan is approved." }),
    figures(swarm.estimate),
    planList(swarm.plan),
    el("details", {}, el("summary", { text: "Edit the plan (JSON)" }), editor),
    el("div", { class: "actions" },
      el("button", { type: "button", class: "primary", id: "approve", text: "Approve", onclick: approve }),
      reason,
      el("button", { type: "button", class: "danger", id: "reject", text: "Reject",
        onclick: () => decide("reject", reason.value.trim() ? { reason: reason.value.trim() } : {}) })),
    note);
}
