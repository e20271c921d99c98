// The public API with the caller's key, and its event stream, for every page.
// The key lives in sessionStorage (this tab only) and goes out as a bearer token.

const KEY = "swarm-api-key";

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

/** The page's error banner: the service's error code and message, or why it is unreachable. */
export function showError(err) {
  const box = document.getElementById("error");
  if (!box) return;
  if (!err) { box.hidden = true; return; }
  box.textContent = err instanceof ApiError ? `${err.status} ${err.code}: ${err.message}`
    : `Cannot reach the service: ${err.message || err}`;
  box.hidden = false;
}
