// Shared by the pages: the public API with the caller's key, the event stream, formatting.
// The key lives in sessionStorage (this tab only) and goes out as a bearer token.

const KEY = "swarm-api-key";
export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const SWARM_STATUSES = ["queued", "planning", "running", "synthesizing", "succeeded",
  "failed", "cancelled"];
export const SUBTASK_STATUSES = ["pending", "running", "succeeded", "failed", "skipped",
  "cancelled"];

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let asking = null; // one key prompt at a time, shared by every request that needs it

function askForKey(reason) {
  if (asking) return asking;
  const dlg = document.createElement("dialog");
  dlg.className = "key-dialog";
  dlg.innerHTML = `<form method="dialog">
      <h2>API key needed</h2>
      <p class="reason"></p>
      <label>Key <input type="password" name="key" autocomplete="off" required
        placeholder="the key your tenant was given"></label>
      <p class="muted small">Kept in this tab only (sessionStorage) and sent as
        <code>Authorization: Bearer …</code>.</p>
      <div class="actions"><button type="submit" class="primary">Use key</button></div>
    </form>`;
  dlg.querySelector(".reason").textContent = reason;
  document.body.append(dlg);
  asking = new Promise((resolve) => {
    const form = dlg.querySelector("form");
    form.addEventListener("submit", (ev) => {
      const key = form.elements.key.value.trim();
      if (!key) { ev.preventDefault(); return; }
      sessionStorage.setItem(KEY, key);
      dlg.close();
      dlg.remove();
      asking = null;
      showKeyState();
      resolve();
    });
    dlg.addEventListener("cancel", (ev) => ev.preventDefault()); // nothing works without it
  });
  dlg.showModal();
  dlg.querySelector("input").focus();
  return asking;
}

/** fetch() against the service with the key; a 401 asks for a key and tries again. */
export async function api(path, opts = {}) {
  for (;;) {
    const headers = new Headers(opts.headers || {});
    const key = sessionStorage.getItem(KEY);
    if (key) headers.set("Authorization", `Bearer ${key}`);
    const r = await fetch(path, { ...opts, headers });
    if (r.status !== 401) return r;
    if (key) sessionStorage.removeItem(KEY);
    await askForKey(key ? "The service refused that key. Enter another one."
      : "This service requires an API key.");
  }
}

/** The JSON answer, or an ApiError carrying the service's error code and message. */
export async function apiJson(path, opts = {}) {
  const r = await api(path, opts);
  let body = null;
  try { body = await r.json(); } catch { /* an empty or non-JSON answer */ }
  if (!r.ok) {
    const err = (body && body.error) || {};
    throw new ApiError(r.status, err.code || `http_${r.status}`, err.message || r.statusText);
  }
  return body;
}

export function showKeyState() {
  const el = document.getElementById("key-state");
  if (!el) return;
  const has = !!sessionStorage.getItem(KEY);
  el.hidden = !has;
  el.replaceChildren();
  if (!has) return;
  const forget = document.createElement("button");
  forget.type = "button";
  forget.className = "link";
  forget.textContent = "forget key";
  forget.addEventListener("click", () => { sessionStorage.removeItem(KEY); location.reload(); });
  el.append("key set · ", forget);
}

/**
 * Reads a Server-Sent Events stream with fetch (EventSource cannot send the bearer token),
 * calling onEvent({id, event, data}) for each event. A dropped connection resumes after the
 * last id seen (Last-Event-ID) with backoff; returns when the server ends the stream after
 * the terminal event, when `signal` aborts, or on an error answer (thrown).
 */
export async function readEvents(path, { onEvent, onState, signal, isDone }) {
  let lastId = null;
  let backoff = 500;
  while (!signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId !== null) headers["Last-Event-ID"] = lastId;
      const r = await api(path, { headers, signal, cache: "no-store" });
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        const e = body.error || {};
        throw new ApiError(r.status, e.code || `http_${r.status}`, e.message || r.statusText);
      }
      onState("live");
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      let carry = ""; // a "\r" that may be the first half of "\r\n"
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        let text = carry + value;
        carry = text.endsWith("\r") ? "\r" : "";
        if (carry) text = text.slice(0, -1);
        buf += text.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const ev = parseBlock(buf.slice(0, cut));
          buf = buf.slice(cut + 2);
          if (ev.id !== null) lastId = ev.id;
          if (ev.data !== null) {
            backoff = 500;
            onEvent(ev);
          }
        }
      }
      if (isDone()) return;
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError) throw err;
    }
    onState("reconnecting");
    await new Promise((ok) => setTimeout(ok, backoff));
    backoff = Math.min(backoff * 2, 5000);
  }
}

function parseBlock(block) {
  const ev = { id: null, event: "message", data: null };
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue; // a comment: the server's keep-alive ping
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") ev.event = value;
    else if (field === "id" && !value.includes("\0")) ev.id = value;
  }
  if (data.length) ev.data = data.join("\n");
  return ev;
}

// ---- formatting ------------------------------------------------------------------------------

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

export function showError(err) {
  const box = document.getElementById("error");
  if (!box) return;
  if (!err) { box.hidden = true; return; }
  box.textContent = err instanceof ApiError ? `${err.status} ${err.code}: ${err.message}`
    : `Cannot reach the service: ${err.message || err}`;
  box.hidden = false;
}
