// The stat cards over the graph: progress (succeeded of all, as the CLI counts it), cost (a
// reserved part labelled as an upper bound), wall time on a clock that ticks every second
// while the swarm runs, the critical path the graph highlights, serial time and speedup.
import { el, money, progressBar, seconds, tokens } from "./dom.js";

/** The service's clock: a snapshot of a running swarm says its wall time at the moment it was
 * read, so started_at + wall_s is the service's "now" then; the page counts on from there and
 * a browser clock set wrong does not bend the figures. */
export class ServerClock {
  constructor() { this.offset = 0; }

  update(swarm) {
    if (swarm.started_at && swarm.timing.wall_s !== null && !swarm.finished_at) {
      this.offset = Date.parse(swarm.started_at) + swarm.timing.wall_s * 1000 - Date.now();
    } else if (!swarm.started_at && !swarm.finished_at) {
      this.offset = 0;
    }
  }

  now() { return Date.now() + this.offset; }
}

/** Wall time: the API's once the swarm ended, counted on the service's clock while it runs. */
export function wallTime(swarm, clock) {
  if (swarm.endedHere && swarm.started_at) {
    return Math.max(0, (Date.parse(swarm.finished_at) - Date.parse(swarm.started_at)) / 1000);
  }
  if (swarm.finished_at || !swarm.started_at) return swarm.timing.wall_s;
  return Math.max(0, (clock.now() - Date.parse(swarm.started_at)) / 1000);
}

function stat(key, label, value, sub, attrs = {}) {
  return el("div", { class: "stat", "data-stat": key, ...attrs },
    el("div", { class: "stat-label", text: label }),
    el("div", { class: "stat-value mono", text: value }),
    sub ? el("div", { class: "stat-sub", text: sub }) : null);
}

function chainText(names) {
  if (!names.length) return "nothing has run yet";
  const shown = names.length <= 3 ? names : [names[0], "…", names[names.length - 1]];
  return `${names.length} subtask${names.length === 1 ? "" : "s"}: ${shown.join(" → ")}`;
}

function wallSub(swarm) {
  if (swarm.queue_position) return `queue position ${swarm.queue_position}`;
  if (!swarm.started_at) return "not started";
  return swarm.finished_at ? "start to finish" : "running · ticks live";
}

/** The cards, drawn anew from `swarm` and the critical path `critical` (graph-layout.js). */
export function renderStats(swarm, critical, clock) {
  const p = swarm.progress;
  const t = swarm.timing;
  const u = swarm.usage;
  const other = ["running", "failed", "skipped", "cancelled"].filter((s) => p[s])
    .map((s) => `${p[s]} ${s}`).join(" · ");
  const progress = el("div", { class: "stat grow", "data-stat": "progress",
    title: "succeeded subtasks of all the swarm's subtasks (planner, compressors and synthesizer"
      + " included), as `swarm-api` counts them" },
  el("div", { class: "stat-label", text: "Progress · succeeded" }),
  el("div", { class: "stat-value mono", text: `${p.succeeded} / ${p.total}` }),
  progressBar(p),
  other ? el("div", { class: "stat-sub", text: other }) : null);
  const reserved = Number(u.unresolved_usd || 0);
  const costSub = `${tokens(u.prompt_tokens)} in · ${tokens(u.completion_tokens)} out · ${u.gateway_calls}`
    + ` call${u.gateway_calls === 1 ? "" : "s"}`;
  const cost = stat("cost", "Cost", `${reserved ? "≤ " : ""}${money(u.cost_usd)}`, costSub,
    { title: `${u.cost_usd} USD${reserved ? `, of which ${u.unresolved_usd} reserved: calls cut off or`
      + " without a usage report, counted at their upper bound" : ""}` });
  if (reserved) {
    cost.append(el("div", { class: "stat-sub reserved",
      text: `${money(u.unresolved_usd)} of it reserved (upper bound, not billed usage)` }));
  }
  document.getElementById("stats").replaceChildren(
    progress,
    cost,
    stat("wall", "Wall time", seconds(wallTime(swarm, clock)), wallSub(swarm)),
    stat("critical", "Critical path", seconds(critical.seconds), chainText(critical.names),
      { class: "stat critical-stat", title: critical.names.join(" → ") }),
    stat("serial", "Serial", seconds(t.serial_s), "sum of subtask latencies"),
    stat("speedup", "Speedup", t.speedup ? `${t.speedup}×` : "–", "serial ÷ wall"),
    stat("latency", "Latency p50 / p95", `${seconds(t.subtask_latency_s.p50)} / ${seconds(t.subtask_latency_s.p95)}`, null));
}

/** The clock's tick: only the wall time changes between events. */
export function tickStats(swarm, clock) {
  const v = document.querySelector('#stats [data-stat="wall"] .stat-value');
  if (v) v.textContent = seconds(wallTime(swarm, clock));
}
