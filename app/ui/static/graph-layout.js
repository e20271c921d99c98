// The swarm's DAG as numbers, no drawing: dependencies as the service reads them, layers from
// one topological pass (longest path, O(V + E)), the critical path, which layers are folded
// into one summary node, and where each node goes (planner -> workers by depth -> compressors
// -> synthesizer, left to right). The graph and the timeline both draw from this.

/** A layer of more than this many subtasks starts folded into one summary node (SPEC §13). */
export const FOLD_OVER = 50;
/** ... and a swarm opens with at most this many nodes (subtasks and summaries) drawn where
 * its shape allows. */
export const OPEN_AT_MOST = 60;
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
export function layering(subtasks, deps) {
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

/** The critical path as the service computes `timing.critical_path_s` (app/views.py): the
 * chain of largest summed latency through the DAG, a subtask without a latency weighing 0.
 * Summed in seconds in the same float operations and rounded to the ms as the API rounds, so
 * the card shows the API's figure to the digit. `names` in order from the chain's start. */
export function criticalPath(subtasks, deps, order) {
  const lat = new Map(subtasks.map((s) => [s.name, s.latency_ms === null || s.latency_ms === undefined
    ? 0 : s.latency_ms / 1000]));
  const best = new Map();
  const via = new Map();
  let end = null;
  for (const n of order) {
    let b = 0;
    let p = null;
    for (const d of deps.get(n) || []) if ((best.get(d) || 0) > b) { b = best.get(d); p = d; }
    best.set(n, (lat.get(n) || 0) + b);
    via.set(n, p);
    if (end === null || best.get(n) > best.get(end)) end = n;
  }
  const names = [];
  for (let n = end; n !== null && best.get(n) > 0; n = via.get(n)) names.unshift(n);
  const total = end === null ? 0 : best.get(end);
  return { names, set: new Set(names), seconds: Number(total.toFixed(3)) };
}

/** Which layers are drawn as one summary node: a layer over FOLD_OVER starts folded, and so
 * do the largest others while more than OPEN_AT_MOST nodes would be drawn (1,000 subtasks in
 * layers of 40 open as a screenful too); the reader's choices (one layer, or all) win over
 * that default. Shared by the graph and the timeline. */
export class Folding {
  constructor() {
    this.folded = new Set();
    this.unfolded = new Set();
    this.auto = null; // the default-folded layers of the swarm's shape
    this.shape = null;
    this.listeners = [];
  }

  /** The default for layers of these sizes (sizes[li] = member count), made once per shape:
   * unfolding one layer does not fold the others to make room. */
  plan(sizes) {
    const shape = sizes.join(",");
    if (shape === this.shape) return;
    this.shape = shape;
    this.auto = new Set();
    let drawn = 0;
    sizes.forEach((n, li) => {
      if (n > FOLD_OVER) this.auto.add(li);
      drawn += this.isFolded(li, n) ? 1 : n;
    });
    const rest = sizes.map((n, li) => [n, li])
      .filter(([n, li]) => n > 1 && !this.auto.has(li) && !this.folded.has(li) && !this.unfolded.has(li))
      .sort((a, b) => b[0] - a[0]);
    for (const [n, li] of rest) {
      if (drawn <= OPEN_AT_MOST) break;
      this.auto.add(li);
      drawn -= n - 1;
    }
  }

  isFolded(li, size) {
    if (this.folded.has(li)) return true;
    if (this.unfolded.has(li)) return false;
    return this.auto ? this.auto.has(li) : size > FOLD_OVER;
  }

  set(li, folded) {
    (folded ? this.folded : this.unfolded).add(li);
    (folded ? this.unfolded : this.folded).delete(li);
    this.changed();
  }

  toggle(li, size) { this.set(li, !this.isFolded(li, size)); }

  all(folded, layers) {
    for (const li of layers) {
      (folded ? this.folded : this.unfolded).add(li);
      (folded ? this.unfolded : this.folded).delete(li);
    }
    this.changed();
  }

  onChange(fn) { this.listeners.push(fn); }

  changed() { for (const fn of this.listeners) fn(); }
}

export function layerLabel(members) {
  const kinds = new Set(members.map((s) => s.kind));
  const kind = kinds.size === 1 ? [...kinds][0] : "mixed";
  const word = { planner: "planner", worker: "workers", compressor: "compressors",
    synthesizer: "synthesizer" }[kind] || "subtasks";
  return `${word} · ${members.length}`;
}

/** Positions of nodes, layer boxes and edges (collapsed layers become one summary node). */
export function layout(subtasks, folding = new Folding()) {
  const deps = dependencies(subtasks);
  const { order, layer } = layering(subtasks, deps);
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

  folding.plan(layers.map((m) => (m ? m.length : 0)));
  // compact nodes only when many are drawn: a big swarm's folded layers do not count
  const drawn = layers.reduce((n, m, li) => n + (m && !folding.isFolded(li, m.length) ? m.length : 0), 0);
  const compact = drawn > 120;
  const W = compact ? 150 : 196;
  const H = compact ? 24 : 42;
  const GAP_Y = compact ? 6 : 10;
  const ROWS = compact ? 36 : 14;
  const GAP_X = 76;
  const SUB_GAP = 14;
  const TOP = 34;
  const boxes = [];
  let x = 16;
  let height = 0;
  for (const [li, members] of layers.entries()) {
    if (!members) continue;
    const folded = folding.isFolded(li, members.length);
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
  return { deps, order, layer, layers, nodes, summaries, boxes, edges, compact,
    width: x - GAP_X + 16, height: TOP + height + 16 };
}

