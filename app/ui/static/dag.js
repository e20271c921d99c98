// The swarm's DAG as SVG, left to right: planner -> workers (by depth) -> compressors ->
// synthesizer. Layers come from one topological pass (longest path, O(V + E)); a layer taller
// than a screen wraps into sub-columns, and any layer collapses into one summary node, so a
// thousand subtasks lay out in milliseconds and stay readable. Each node is an SVG group with
// the subtask's name as text and its status in data-status (CSS colours it).

const SVG = "http://www.w3.org/2000/svg";
const COMPRESSOR = "@compress.";

/** name -> names it waits for, as the service computes timing (planner before root workers,
 * a compressed input reaching its consumer through its compressor). */
export function dependencies(subtasks) {
  const names = new Set(subtasks.map((s) => s.name));
  const planners = subtasks.filter((s) => s.kind === "planner").map((s) => s.name);
  const deps = new Map();
  for (const s of subtasks) {
    const ds = s.depends_on.length ? [...s.depends_on] : s.kind === "worker" ? [...planners] : [];
    if (s.kind !== "compressor") for (const d of s.depends_on) ds.push(COMPRESSOR + d);
    deps.set(s.name, [...new Set(ds)].filter((d) => names.has(d) && d !== s.name));
  }
  return deps;
}

/** Names in topological order and each one's layer (longest path from a source). */
function layering(subtasks, deps) {
  const indeg = new Map();
  const out = new Map();
  for (const s of subtasks) { indeg.set(s.name, 0); out.set(s.name, []); }
  for (const [n, ds] of deps) for (const d of ds) { out.get(d).push(n); indeg.set(n, indeg.get(n) + 1); }
  const layer = new Map();
  const order = [];
  for (const s of subtasks) if (indeg.get(s.name) === 0) { order.push(s.name); layer.set(s.name, 0); }
  for (let i = 0; i < order.length; i++) {
    const n = order[i];
    for (const m of out.get(n)) {
      layer.set(m, Math.max(layer.get(m) || 0, layer.get(n) + 1));
      indeg.set(m, indeg.get(m) - 1);
      if (indeg.get(m) === 0) order.push(m);
    }
  }
  const deepest = Math.max(0, ...layer.values());
  for (const s of subtasks) {
    if (!layer.has(s.name) || indeg.get(s.name) > 0) { // only on a cycle: put it last, still shown
      if (!order.includes(s.name)) order.push(s.name);
      layer.set(s.name, deepest + 1);
    }
  }
  return { order, layer };
}

/** Critical path: the chain of largest summed latency through the DAG (a Set of names). */
export function criticalPath(subtasks, deps, order) {
  const lat = new Map(subtasks.map((s) => [s.name, s.latency_ms || 0]));
  const best = new Map();
  const via = new Map();
  let end = null;
  for (const n of order) {
    let b = 0;
    let p = null;
    for (const d of deps.get(n) || []) if ((best.get(d) || 0) > b) { b = best.get(d); p = d; }
    best.set(n, b + lat.get(n));
    via.set(n, p);
    if (end === null || best.get(n) > best.get(end)) end = n;
  }
  const path = new Set();
  for (let n = end; n !== null && best.get(n) > 0; n = via.get(n)) path.add(n);
  return path;
}

function layerLabel(members) {
  const kinds = new Set(members.map((s) => s.kind));
  const kind = kinds.size === 1 ? [...kinds][0] : "mixed";
  const word = { planner: "planner", worker: "workers", compressor: "compressors",
    synthesizer: "synthesizer" }[kind] || "subtasks";
  return `${word} · ${members.length}`;
}

/** Positions of nodes, layer boxes and edges (collapsed layers become one summary node). */
export function layout(subtasks, { collapsed = new Set() } = {}) {
  const deps = dependencies(subtasks);
  const { order, layer } = layering(subtasks, deps);
  const compact = subtasks.length > 120;
  const W = compact ? 150 : 196;
  const H = compact ? 24 : 42;
  const GAP_Y = compact ? 6 : 10;
  const ROWS = compact ? 36 : 14;
  const GAP_X = 76;
  const SUB_GAP = 14;
  const TOP = 34;
  const position = new Map(subtasks.map((s, i) => [s.name, i]));
  const byName = new Map(subtasks.map((s) => [s.name, s]));
  const layers = [];
  for (const n of order) (layers[layer.get(n)] ||= []).push(byName.get(n));
  // order within a layer by where its dependencies sit (barycentre), so edges cross less
  const rank = new Map();
  layers.forEach((members, li) => {
    const key = new Map(members.map((s) => {
      const ds = deps.get(s.name);
      const bary = li && ds.length ? ds.reduce((a, d) => a + (rank.get(d) || 0), 0) / ds.length : 0;
      return [s.name, bary];
    }));
    members.sort((a, b) => key.get(a.name) - key.get(b.name) || position.get(a.name) - position.get(b.name));
    members.forEach((s, i) => rank.set(s.name, i / members.length));
  });

  const boxes = [];
  let x = 16;
  let height = 0;
  for (const [li, members] of layers.entries()) {
    if (!members) continue;
    const folded = collapsed.has(li);
    const cols = folded ? 1 : Math.ceil(members.length / ROWS);
    const rows = folded ? 1 : Math.ceil(members.length / cols);
    const w = folded ? Math.max(W, 170) : cols * W + (cols - 1) * SUB_GAP;
    const h = folded ? 64 : rows * H + (rows - 1) * GAP_Y;
    boxes.push({ li, x, w, h, rows, cols, members, folded, label: layerLabel(members) });
    height = Math.max(height, h);
    x += w + GAP_X;
  }
  const nodes = new Map(); // name -> {x, y, w, h}
  const summaries = new Map(); // layer -> {x, y, w, h, members}
  const centre = height <= 560; // small graphs centre short layers; tall ones align to the top
  for (const b of boxes) {
    const top = TOP + (centre ? (height - b.h) / 2 : 0);
    b.y = top;
    if (b.folded) {
      summaries.set(b.li, { x: b.x, y: top, w: b.w, h: b.h, members: b.members, label: b.label });
      continue;
    }
    b.members.forEach((s, i) => {
      const col = Math.floor(i / b.rows);
      const row = i % b.rows;
      nodes.set(s.name, { x: b.x + col * (W + SUB_GAP), y: top + row * (H + GAP_Y), w: W, h: H });
    });
  }
  // edges between drawn things: a collapsed layer's edges meet at its summary node
  const end = (n) => (nodes.has(n) ? n : `#${layer.get(n)}`);
  const seen = new Set();
  const edges = [];
  for (const [n, ds] of deps) {
    for (const d of ds) {
      const a = end(d);
      const b = end(n);
      const k = `${a}\u0000${b}`;
      if (a === b || seen.has(k)) continue;
      seen.add(k);
      edges.push({ from: a, to: b, a: d, b: n });
    }
  }
  return { deps, order, layer, nodes, summaries, boxes, edges, compact,
    width: x - GAP_X + 16, height: TOP + height + 16 };
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fmtLatency(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

export class DagView {
  constructor(container, { onSelect }) {
    this.container = container;
    this.onSelect = onSelect;
    this.collapsed = new Set();
    this.zoom = 1;
    this.selected = null;
    this.critical = new Set();
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
    const L = (this.layout = layout(subtasks, { collapsed: this.collapsed }));
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
      const toggle = () => {
        if (this.collapsed.has(b.li)) this.collapsed.delete(b.li); else this.collapsed.add(b.li);
        this.draw([...this.subtasks.values()]);
        this.updateCritical();
      };
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
        role: "button", "data-name": name, "data-kind": s.kind, "data-status": s.status });
      g.append(svg("rect", { class: "box", width: r.w, height: r.h, rx: 6 }));
      g.append(svg("rect", { class: "stripe", width: 4, height: r.h, rx: 2 }));
      const label = svg("text", { class: "name", x: 12, y: L.compact ? 16 : 17, "clip-path": "url(#node-text)" });
      label.textContent = name;
      g.append(label);
      if (!L.compact) {
        const meta = svg("text", { class: "meta", x: 12, y: 33, "clip-path": "url(#node-text)" });
        g.append(meta);
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
      t.textContent = r.label;
      g.append(t, svg("g", { class: "mini" }), svg("text", { class: "meta", x: 10, y: 56 }));
      g.addEventListener("click", () => labels.querySelector(`[data-layer="${li}"]`).dispatchEvent(new Event("click")));
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
    this.layoutMs = performance.now() - t0;
    root.dataset.layoutMs = this.layoutMs.toFixed(1);
  }

  describe(g, s) {
    const meta = g.querySelector(".meta");
    const bits = [s.kind === "worker" ? s.model : s.kind];
    if (s.latency_ms !== null && s.latency_ms !== undefined) bits.push(fmtLatency(s.latency_ms));
    if (s.attempts > 1) bits.push(`${s.attempts} attempts`);
    if (meta) meta.textContent = bits.join(" · ");
    g.querySelector("title").textContent = `${s.name} — ${s.status}${bits.length ? ` (${bits.join(", ")})` : ""}`;
    g.setAttribute("aria-label", `${s.name}: ${s.status}`);
  }

  updateSummary(li) {
    const entry = this.summaryEls && this.summaryEls.get(li);
    if (!entry) return;
    const { g, r } = entry;
    const counts = {};
    for (const m of r.members) {
      const s = this.subtasks.get(m.name) || m;
      counts[s.status] = (counts[s.status] || 0) + 1;
    }
    const mini = g.querySelector(".mini");
    mini.replaceChildren();
    let x = 10;
    const width = r.w - 20;
    for (const st of ["succeeded", "failed", "cancelled", "skipped", "running", "pending"]) {
      if (!counts[st]) continue;
      const w = (width * counts[st]) / r.members.length;
      mini.append(svg("rect", { x, y: 28, width: Math.max(w, 1), height: 10, class: "seg", "data-status": st }));
      x += w;
    }
    g.querySelector(".meta").textContent = Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(" · ");
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
    this.critical = criticalPath(subtasks, this.layout.deps, this.layout.order);
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

  find(text) {
    if (!this.svg) return 0;
    const q = text.trim().toLowerCase();
    let first = null;
    let n = 0;
    for (const [name, g] of this.nodeEls) {
      const hit = q !== "" && name.toLowerCase().includes(q);
      g.classList.toggle("match", hit);
      if (hit) { n += 1; first ||= name; }
    }
    this.svg.classList.toggle("searching", q !== "");
    if (first) this.reveal(first);
    return n;
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
