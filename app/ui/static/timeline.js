// The timeline: a Gantt of the swarm's subtasks beside the graph, one row per subtask from its
// start to its end (now, while it runs), in the graph's layer order. A layer the graph shows
// folded is one summary row here too (its span and counts by status), so a 1,000-subtask
// swarm stays a screenful; unfolding a layer in either view draws its rows in both.
import { layerLabel } from "./graph-layout.js";
import { el, seconds } from "./dom.js";

const ORDER = ["succeeded", "failed", "cancelled", "skipped", "running", "pending"];
const TICKS = 5;

const at = (iso) => (iso ? Date.parse(iso) : null);

export class TimelineView {
  constructor(container, { onSelect, folding }) {
    this.container = container;
    this.onSelect = onSelect;
    this.folding = folding;
    this.selected = null;
  }

  /** Draw `swarm`'s subtasks in the layers of `layout` (graph-layout.js); `now` is the
   * service's clock in ms, the right edge while the swarm runs. */
  render(swarm, layout, now) {
    if (!layout) return;
    const start = at(swarm.started_at) ?? at(swarm.created_at);
    let end = at(swarm.finished_at) ?? now;
    for (const s of swarm.subtasks) end = Math.max(end, at(s.finished_at) ?? 0);
    const span = Math.max(end - start, 1);
    const pct = (t) => `${(100 * Math.min(Math.max(t - start, 0), span)) / span}%`;
    const width = (a, b) => `${(100 * Math.max(Math.min(b, end) - Math.max(a, start), 0)) / span}%`;
    const byName = new Map(swarm.subtasks.map((s) => [s.name, s]));

    const rows = [this.axis(span)];
    let drawn = 0;
    layout.layers.forEach((members, li) => {
      if (!members) return;
      const current = members.map((m) => byName.get(m.name) || m);
      const folded = this.folding.isFolded(li, current.length);
      rows.push(this.layerHead(li, current, folded));
      if (folded) { rows.push(this.summary(li, current, { pct, width, now })); return; }
      for (const s of current) {
        rows.push(this.row(s, { pct, width, now, start }));
        drawn += 1;
      }
    });
    const box = el("div", { class: "timeline", role: "table", "aria-label": "subtask timeline",
      "data-rows": String(drawn) }, ...rows);
    this.container.replaceChildren(box);
  }

  axis(span) {
    const ticks = [];
    for (let i = 0; i <= TICKS; i += 1) {
      const t = el("span", { class: "tl-tick", text: seconds((span * i) / TICKS / 1000) });
      t.style.left = `${(100 * i) / TICKS}%`;
      ticks.push(t);
    }
    return el("div", { class: "tl-axis", role: "row" },
      el("div", { class: "tl-label muted small", text: "since the swarm started" }),
      el("div", { class: "tl-track" }, ...ticks));
  }

  layerHead(li, members, folded) {
    const toggle = () => this.folding.set(li, !folded);
    return el("div", { class: "tl-layer", role: "row", "data-layer": String(li) },
      el("button", { type: "button", class: "link tl-fold", "aria-pressed": String(folded),
        title: folded ? "expand this layer" : "collapse this layer into one row", onclick: toggle,
        text: `${folded ? "▸" : "▾"} ${layerLabel(members)}` }));
  }

  row(s, { pct, width, now, start }) {
    const a = at(s.started_at);
    const b = at(s.finished_at) ?? (s.status === "running" ? now : a);
    const track = el("div", { class: "tl-track" });
    let tip = `${s.name}: ${s.status}`;
    if (s.reused) {
      track.append(el("span", { class: "tl-note", text: "reused · no call in this run" }));
      tip += " (reused from the swarm this one retries)";
    } else if (a !== null) {
      const bar = el("span", { class: "tl-bar" });
      bar.style.left = pct(a);
      bar.style.width = width(a, b);
      track.append(bar);
      tip += ` · started +${seconds((a - start) / 1000)} · ${seconds((b - a) / 1000)}`;
    } else {
      track.append(el("span", { class: "tl-note", text: s.status === "pending" ? "not started" : "never ran" }));
    }
    const row = el("div", { class: `tl-row${s.name === this.selected ? " selected" : ""}`, role: "row",
      "data-name": s.name, "data-status": s.status, title: tip },
      el("button", { type: "button", class: "link tl-label mono", text: s.name,
        onclick: () => this.onSelect(s.name) }),
      track);
    return row;
  }

  summary(li, members, { pct, width, now }) {
    const counts = {};
    let first = null;
    let last = null;
    for (const s of members) {
      counts[s.status] = (counts[s.status] || 0) + 1;
      const a = at(s.started_at);
      if (a === null) continue;
      const b = at(s.finished_at) ?? (s.status === "running" ? now : a);
      first = first === null ? a : Math.min(first, a);
      last = last === null ? b : Math.max(last, b);
    }
    const track = el("div", { class: "tl-track" });
    const text = ORDER.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(" · ");
    if (first !== null) {
      // the layer's span, split by how its subtasks ended
      const bar = el("span", { class: "tl-span" });
      bar.style.left = pct(first);
      bar.style.width = width(first, last);
      for (const s of ORDER) {
        if (!counts[s]) continue;
        const seg = el("span", { class: "seg", "data-status": s });
        seg.style.width = `${(100 * counts[s]) / members.length}%`;
        bar.append(seg);
      }
      track.append(bar);
    }
    track.append(el("span", { class: "tl-note", text }));
    return el("div", { class: "tl-row tl-summary", role: "row", "data-layer": String(li),
      title: `${layerLabel(members)}: ${text}; expand to see each subtask` },
    el("button", { type: "button", class: "link tl-label", text: `${members.length} subtasks ▸`,
      onclick: () => this.folding.set(li, false) }),
    track);
  }
}
