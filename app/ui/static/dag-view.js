// The swarm's DAG drawn as SVG from graph-layout.js's numbers. Each node is an SVG group with
// the subtask's name as text and its status in data-status (CSS colours it); a folded layer is
// one summary node (counts by status, cost) until expanded. Find expands and zooms to a match.
import { criticalPath, layout } from "./graph-layout.js";
import { isReserved, money } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const STATUS_ORDER = ["succeeded", "failed", "cancelled", "skipped", "running", "pending"];

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null) node.setAttribute(k, v);
  return node;
}

function fmtLatency(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

export class DagView {
  constructor(container, { onSelect, folding }) {
    this.container = container;
    this.onSelect = onSelect;
    this.folding = folding;
    this.zoom = 1;
    this.selected = null;
    this.critical = new Set();
    this.criticalInfo = { names: [], set: this.critical, seconds: 0 };
    this.matches = [];
    this.matchAt = -1;
    this.showCritical = true;
    this.structure = "";
    this.zoomed = false; // the reader's zoom wins over fitting once they used it
    new ResizeObserver(() => this.autoFit()).observe(container);
  }

  /** A graph slightly too wide fits its box; a huge one keeps legible nodes and scrolls. */
  autoFit() {
    if (this.zoomed || !this.layout) return;
    const fit = (this.container.clientWidth - 16) / this.layout.width;
    const zoom = fit >= 0.6 ? Math.min(1, fit) : 1;
    if (Math.abs(zoom - this.zoom) > 0.005) { this.zoom = zoom; this.applyZoom(); }
  }

  /** Draw again as it is (a layer folded or unfolded). */
  redraw() {
    if (!this.subtasks) return;
    this.draw([...this.subtasks.values()]);
    this.updateCritical();
  }

  /** Draw `subtasks`; re-lays out only when the set of subtasks (or collapsing) changed. */
  render(subtasks, force = false) {
    this.subtasks = new Map(subtasks.map((s) => [s.name, s]));
    const structure = subtasks.map((s) => s.name).join("\n");
    if (force || structure !== this.structure) {
      this.structure = structure;
      this.draw(subtasks);
    } else {
      for (const s of subtasks) this.setStatus(s.name, s.status, s);
    }
    this.updateCritical();
  }

  draw(subtasks) {
    const t0 = performance.now();
    const L = (this.layout = layout(subtasks, this.folding));
    // edges live in an SVG of their own under the nodes': a node's status change then
    // re-lays out only the nodes (thousands of curves made each change cost a second)
    const viewBox = `0 0 ${L.width} ${L.height}`;
    const root = svg("svg", { class: `dag${L.compact ? " compact" : ""}`, viewBox, role: "group",
      "aria-label": "subtask graph" });
    const under = svg("svg", { class: `dag-edges${L.edges.length > 400 ? " dense" : ""}`, viewBox,
      "aria-hidden": "true" });
    const defs = svg("defs");
    const clip = svg("clipPath", { id: "node-text", clipPathUnits: "userSpaceOnUse" });
    const any = L.nodes.values().next().value || { w: 196, h: 42 };
    clip.append(svg("rect", { x: 0, y: 0, width: any.w - 8, height: any.h }));
    const arrow = svg("marker", { id: "arrow", viewBox: "0 0 8 8", refX: 7, refY: 4,
      markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
    arrow.append(svg("path", { d: "M0,0 L8,4 L0,8 z", class: "arrow" }));
    under.append(arrow);
    defs.append(clip);
    root.append(defs);

    const labels = svg("g", { class: "layers" });
    for (const b of L.boxes) {
      const t = svg("text", { x: b.x, y: 18, class: "layer-label", "data-layer": b.li,
        tabindex: 0, role: "button", "aria-pressed": String(b.folded) });
      t.textContent = `${b.folded ? "▸" : "▾"} ${b.label}`;
      const tip = svg("title");
      tip.textContent = b.folded ? "expand this layer" : "collapse this layer into one node";
      t.append(tip);
      const toggle = () => this.folding.toggle(b.li, b.members.length);
      t.addEventListener("click", toggle);
      t.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(); } });
      labels.append(t);
    }

    const box = (id) => (id.startsWith("#") ? L.summaries.get(Number(id.slice(1))) : L.nodes.get(id));
    const edges = svg("g", { class: "edges" });
    this.edgeEls = new Map();
    for (const e of L.edges) {
      const p = box(e.from);
      const q = box(e.to);
      const x1 = p.x + p.w;
      const y1 = p.y + p.h / 2;
      const x2 = q.x - 2;
      const y2 = q.y + q.h / 2;
      const dx = Math.max(24, (x2 - x1) / 2);
      const path = svg("path", { class: "edge", d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`,
        "marker-end": "url(#arrow)" });
      path.dataset.from = e.a;
      path.dataset.to = e.b;
      edges.append(path);
      for (const n of [e.a, e.b]) {
        if (!this.edgeEls.has(n)) this.edgeEls.set(n, []);
        this.edgeEls.get(n).push(path);
      }
    }

    const nodes = svg("g", { class: "nodes" });
    this.nodeEls = new Map();
    for (const [name, r] of L.nodes) {
      const s = this.subtasks.get(name);
      const g = svg("g", { class: "node", transform: `translate(${r.x},${r.y})`, tabindex: 0,
        role: "button", "data-name": name, "data-kind": s.kind, "data-status": s.status,
        "data-reused": s.reused ? "true" : null });
      g.append(svg("rect", { class: "box", width: r.w, height: r.h, rx: 6 }));
      g.append(svg("rect", { class: "stripe", width: 4, height: r.h, rx: 2 }));
      const label = svg("text", { class: "name", x: 12, y: L.compact ? 16 : 17, "clip-path": "url(#node-text)" });
      label.textContent = name;
      g.append(label);
      if (!L.compact) {
        const meta = svg("text", { class: "meta", x: 12, y: 33, "clip-path": "url(#node-text)" });
        g.append(meta);
      }
      if (s.reused) { // copied from the swarm this one retries: no call of its own
        const tag = svg("text", { class: "tag reused", x: r.w - 6, y: L.compact ? 16 : 17, "text-anchor": "end" });
        tag.textContent = "reused";
        g.append(tag);
      }
      g.append(svg("title"));
      g.addEventListener("click", () => this.onSelect(name));
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); this.onSelect(name); } });
      nodes.append(g);
      this.nodeEls.set(name, g);
      this.describe(g, s);
    }
    this.summaryEls = new Map();
    for (const [li, r] of L.summaries) {
      const g = svg("g", { class: "node summary", transform: `translate(${r.x},${r.y})`, "data-layer": li });
      g.append(svg("rect", { class: "box", width: r.w, height: r.h, rx: 6 }));
      const t = svg("text", { class: "name", x: 10, y: 18 });
      t.textContent = `${r.label} ▸`;
      const tip = svg("title");
      tip.textContent = "expand this layer";
      g.append(t, svg("g", { class: "mini" }), svg("text", { class: "meta", x: 10, y: 56 }), tip);
      g.setAttribute("tabindex", 0);
      g.setAttribute("role", "button");
      const expand = () => this.folding.set(li, false);
      g.addEventListener("click", expand);
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); expand(); } });
      nodes.append(g);
      this.summaryEls.set(li, { g, r });
      this.updateSummary(li);
    }
    under.append(edges);
    root.append(labels, nodes);
    this.svg = root;
    this.edgeSvg = under;
    const wrap = document.createElement("div");
    wrap.className = "dag-wrap";
    wrap.append(under, root);
    this.container.replaceChildren(wrap);
    this.applyZoom();
    this.autoFit();
    if (this.selected) this.select(this.selected);
    if (this.query) this.markMatches();
    this.layoutMs = performance.now() - t0;
    root.dataset.layoutMs = this.layoutMs.toFixed(1);
  }

  describe(g, s) {
    const meta = g.querySelector(".meta");
    const bits = [s.kind === "worker" ? s.model : s.kind];
    if (s.latency_ms !== null && s.latency_ms !== undefined) bits.push(fmtLatency(s.latency_ms));
    if (s.attempts > 1) bits.push(`${s.attempts} attempts`);
    if (s.reused) bits.push("reused");
    if (isReserved(s)) bits.push(`${money(s.usage.cost_usd)} reserved`);
    if (meta) meta.textContent = bits.join(" · ");
    g.querySelector("title").textContent = `${s.name} — ${s.status}${bits.length ? ` (${bits.join(", ")})` : ""}`;
    g.setAttribute("aria-label", `${s.name}: ${s.status}`);
  }

  updateSummary(li) {
    const entry = this.summaryEls && this.summaryEls.get(li);
    if (!entry) return;
    const { g, r } = entry;
    const counts = {};
    let cost = 0;
    let reused = 0;
    for (const m of r.members) {
      const s = this.subtasks.get(m.name) || m;
      counts[s.status] = (counts[s.status] || 0) + 1;
      cost += Number((s.usage && s.usage.cost_usd) || 0);
      if (s.reused) reused += 1;
    }
    const mini = g.querySelector(".mini");
    mini.replaceChildren();
    let x = 10;
    const width = r.w - 20;
    for (const st of STATUS_ORDER) {
      if (!counts[st]) continue;
      const w = (width * counts[st]) / r.members.length;
      mini.append(svg("rect", { x, y: 28, width: Math.max(w, 1), height: 10, class: "seg", "data-status": st }));
      x += w;
    }
    const parts = STATUS_ORDER.filter((k) => counts[k]).map((k) => `${counts[k]} ${k}`);
    if (reused) parts.push(`${reused} reused`);
    parts.push(money(cost));
    g.querySelector(".meta").textContent = parts.join(" · ");
    g.setAttribute("aria-label", `${r.label}: ${parts.join(", ")}`);
  }

  setStatus(name, status, sub) {
    const s = this.subtasks.get(name);
    if (!s) return false;
    if (sub) Object.assign(s, sub);
    s.status = status;
    const g = this.nodeEls.get(name);
    if (g) {
      if (g.getAttribute("data-status") !== status) g.setAttribute("data-status", status);
      this.describe(g, s);
    } else {
      this.updateSummary(this.layout.layer.get(name));
    }
    return true;
  }

  select(name) {
    this.selected = name;
    if (!this.svg) return;
    for (const el of this.svg.querySelectorAll(".selected")) el.classList.remove("selected");
    for (const el of this.edgeSvg.querySelectorAll(".hot")) el.classList.remove("hot");
    const g = this.nodeEls.get(name);
    if (!g) return;
    g.classList.add("selected");
    for (const p of this.edgeEls.get(name) || []) p.classList.add("hot");
  }

  /** Scroll the graph (not the page) so that `name` is in view. */
  reveal(name) {
    const r = this.layout && this.layout.nodes.get(name);
    if (!r) return;
    const c = this.container;
    const x = r.x * this.zoom;
    const y = r.y * this.zoom;
    if (x < c.scrollLeft || x + r.w * this.zoom > c.scrollLeft + c.clientWidth) c.scrollLeft = x - c.clientWidth / 2;
    if (y < c.scrollTop || y + r.h * this.zoom > c.scrollTop + c.clientHeight) c.scrollTop = y - c.clientHeight / 2;
  }

  updateCritical() {
    if (!this.svg || !this.layout) return;
    const subtasks = [...this.subtasks.values()];
    this.criticalInfo = criticalPath(subtasks, this.layout.deps, this.layout.order);
    this.critical = this.criticalInfo.set;
    for (const el of this.svg.querySelectorAll(".critical")) el.classList.remove("critical");
    for (const el of this.edgeSvg.querySelectorAll(".critical")) el.classList.remove("critical");
    if (!this.showCritical) return;
    for (const n of this.critical) {
      const g = this.nodeEls.get(n);
      if (g) g.classList.add("critical");
      for (const p of this.edgeEls.get(n) || []) {
        if (this.critical.has(p.dataset.from) && this.critical.has(p.dataset.to)) p.classList.add("critical");
      }
    }
  }

  setHighlight(status) {
    if (!this.svg) return;
    for (const s of ["pending", "running", "succeeded", "failed", "skipped", "cancelled"]) {
      this.svg.classList.toggle(`only-${s}`, s === status);
    }
  }

  /** Marks every subtask whose name holds `text` and goes to the first: its layer unfolds
   * if folded, the graph zooms to legible size and scrolls it to the middle. */
  find(text) {
    if (!this.svg) return 0;
    const q = text.trim().toLowerCase();
    this.query = q;
    this.matches = q ? [...this.subtasks.keys()].filter((n) => n.toLowerCase().includes(q)) : [];
    this.matchAt = -1;
    this.markMatches();
    if (this.matches.length) this.findNext();
    return this.matches.length;
  }

  markMatches() {
    const hits = new Set(this.matches);
    for (const [name, g] of this.nodeEls) g.classList.toggle("match", hits.has(name));
    this.svg.classList.toggle("searching", !!this.query);
  }

  /** The next match (Enter in the find box): unfolded, zoomed to, marked as current. */
  findNext() {
    if (!this.matches.length) return null;
    this.matchAt = (this.matchAt + 1) % this.matches.length;
    const name = this.matches[this.matchAt];
    const li = this.layout.layer.get(name);
    if (!this.layout.nodes.has(name)) this.folding.set(li, false); // redraws through onChange
    this.markMatches();
    for (const g of this.svg.querySelectorAll(".current")) g.classList.remove("current");
    const g = this.nodeEls.get(name);
    if (g) g.classList.add("current");
    this.zoomTo(name);
    return name;
  }

  /** Zoom so that nodes read at full size, and centre `name` in the graph's box. */
  zoomTo(name) {
    const r = this.layout && this.layout.nodes.get(name);
    if (!r) return;
    if (this.zoom < 1) this.setZoom(1);
    const c = this.container;
    c.scrollLeft = (r.x + r.w / 2) * this.zoom - c.clientWidth / 2;
    c.scrollTop = (r.y + r.h / 2) * this.zoom - c.clientHeight / 2;
  }

  applyZoom() {
    if (!this.svg) return;
    for (const root of [this.svg, this.edgeSvg]) {
      root.setAttribute("width", Math.round(this.layout.width * this.zoom));
      root.setAttribute("height", Math.round(this.layout.height * this.zoom));
    }
  }

  setZoom(z) {
    this.zoomed = true;
    this.zoom = Math.min(2, Math.max(0.15, z));
    this.applyZoom();
  }

  fit() {
    if (!this.layout) return;
    this.setZoom(Math.min(1, (this.container.clientWidth - 8) / this.layout.width));
  }
}
