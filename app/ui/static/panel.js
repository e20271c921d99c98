// The side panel: the swarm's summary, or the selected subtask's details (output, usage,
// latency, attempts, tool calls), a reused subtask and a reserved cost said as such.
import { TERMINAL, badge, el, isReserved, money, seconds, when } from "./dom.js";

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

/** The swarm's summary, or the selected subtask's output, usage, timing and tool calls. */
export function renderPanel({ swarm, selected, detail, critical, onSelect, live }) {
  const select = onSelect;
  const sub0 = selected && swarm.subtasks.find((s) => s.name === selected);
  // re-reads of a running swarm must not reset what the reader scrolled to: redraw on change
  const key = JSON.stringify([selected, sub0 || swarm.status, sub0 ? detail : swarm.result,
    swarm.error, critical.has(selected), live]);
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
  const reserved = isReserved(d);
  const deps = el("div", { class: "deps" }, ...(d.depends_on.length ? d.depends_on.map((n) => el("button", {
    type: "button", class: "link mono", text: n, onclick: () => select(n) })) : [el("span", { class: "muted", text: "none" })]));
  panel.replaceChildren(
    el("div", { class: "panel-head" },
      el("h2", { class: "mono", text: d.name }), badge(d.status),
      el("button", { type: "button", class: "link close", text: "× close", onclick: () => select(null) })),
    kv([["kind", d.kind], ["model", d.model],
      ["fallbacks", d.fallbacks ? `${d.fallbacks} model${d.fallbacks > 1 ? "s" : ""} passed over` : null],
      ["output", d.output_status ? el("span", { class: `mono output-${d.output_status}`, title: OUTPUT_STATUS[d.output_status],
        text: `${d.output_status} JSON` }) : null],
      ["attempts", String(d.attempts)],
      ["latency", d.latency_ms !== null && d.latency_ms !== undefined ? seconds(d.latency_ms / 1000) : "–"],
      ["tokens", reserved ? `≤ ${d.usage.prompt_tokens} in · ≤ ${d.usage.completion_tokens} out (reserved)`
        : `${d.usage.prompt_tokens} in · ${d.usage.completion_tokens} out`],
      ["cost", reserved ? el("span", { class: "mono reserved", title: `${d.usage.cost_usd} USD reserved: the call`
        + " was cut off, billed at its upper bound; the gateway billed at most this",
      text: `≤ ${money(d.usage.cost_usd)} reserved (upper bound, not billed usage)` })
        : el("span", { class: "mono", title: `${d.usage.cost_usd} USD`, text: money(d.usage.cost_usd) })],
      ["reused", d.reused ? el("span", {}, "succeeded in ", retryOf(swarm),
        ": its output is copied, no call was made in this run") : null],
      ["started", when(d.started_at)], ["finished", when(d.finished_at)],
      ["turns", d.turns ? String(d.turns) : null], ["tool calls", d.tool_calls ? String(d.tool_calls) : null],
      ["depends on", deps]]),
    d.critical || critical.has(d.name) ? el("p", { class: "crit-note", text: "On the critical path." }) : null,
    d.error ? section("Error", pre(JSON.stringify(d.error, null, 2), "error")) : null,
    toolCalls(d),
    section(d.truncated ? "Output (truncated)" : "Output",
      d.output_json !== null && d.output_json !== undefined ? pre(JSON.stringify(d.output_json, null, 2))
        : d.output ? pre(d.output) : live ? pre(live, "live")
        : el("p", { class: "muted", text: d.status === "running" ? "Running…" : "No output." })));
}

// what each structured-output status means (SPEC §15), said where the status is shown
const OUTPUT_STATUS = {
  valid: "the answer matched its output_schema as it came",
  repaired: "taken from a code fence or prose, or after one repair turn",
  invalid: "no valid JSON after the repair turn: the subtask failed output_invalid",
};

function retryOf(swarm) {
  if (!swarm.retry_of) return "the swarm this one retries";
  return el("a", { class: "mono", href: `/ui/swarms/${encodeURIComponent(swarm.retry_of)}`,
    text: swarm.retry_of.slice(0, 8), title: swarm.retry_of });
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

