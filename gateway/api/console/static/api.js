// Talking to the server: API key handling, fetch with the key, an SSE reader, formatting.
//
// The key: asked for when the server answers 401 (or 403 "needs the admin key"), kept in
// sessionStorage (this tab only), sent as `Authorization: Bearer`, never put on the page.
// EventSource cannot send headers, so server-sent events are read from fetch() bodies here.

const KEY_STORE = "modelyard.api_key";

export function hasKey() { return Boolean(sessionStorage.getItem(KEY_STORE)); }
export function authHeader() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { Authorization: "Bearer " + key } : {};
}
export function forgetKey() { sessionStorage.removeItem(KEY_STORE); }

let asking = null;    // one dialog for every request that was refused at the same time
let declined = false; // cancelled: refused requests fail until the API key button is used

export function askForKey(reason) {
  declined = false;
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  document.getElementById("key-reason").textContent = reason;
  input.value = "";
  asking = new Promise((resolve) => {
    const done = (key) => {
      input.value = "";
      dialog.removeEventListener("close", onClose);
      if (dialog.open) dialog.close();
      asking = null;
      resolve(key);
    };
    const onClose = () => done(dialog.returnValue === "use" && input.value ? input.value : null);
    dialog.addEventListener("close", onClose);
    document.getElementById("key-cancel").onclick = () => done(null);
    document.getElementById("key-forget").onclick = () => { forgetKey(); done(null); };
    dialog.returnValue = "";
    dialog.showModal();
    input.focus();
  }).then((key) => {
    if (key) sessionStorage.setItem(KEY_STORE, key);
    else declined = true;
    window.dispatchEvent(new CustomEvent("modelyard-key"));
    return key;
  });
  return asking;
}

async function refusal(res) {
  // 401: no key or a wrong one; 403 permission_denied: the key may not use admin endpoints
  if (res.status === 401) return hasKey() ? "The server did not accept that key." : "The server needs an API key.";
  if (res.status !== 403) return null;
  const body = await res.clone().json().catch(() => null);
  const code = body && body.error && body.error.code;
  return code === "permission_denied" ? "This needs the admin key." : null;
}

// fetch() with the key; asks for one (and retries) while the server refuses and the user gives one.
export async function api(path, options = {}) {
  for (;;) {
    const headers = { ...(options.headers || {}), ...authHeader() };
    const res = await fetch(path, { ...options, headers });
    const reason = await refusal(res);
    if (reason === null || declined) return res;
    if (!(await askForKey(reason))) return res;
  }
}

// The message of an API error body, or the status line.
export async function errorText(res) {
  const body = await res.json().catch(() => null);
  if (body && body.error) {
    const e = body.error;
    return typeof e === "string" ? e : (e.message || JSON.stringify(e));
  }
  if (body && body.errors) return body.errors.join("\n");
  return `${res.status} ${res.statusText}`;
}

// Server-sent events of a fetch() response: yields {event, data} until the body ends.
export async function* readEvents(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue; // a comment (keepalive)
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") event = value;
          else if (field === "data") data.push(value);
        }
        if (data.length) yield { event, data: data.join("\n") };
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// ---------------------------------------------------------------------------- formatting

export function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 && i ? 1 : 0)} ${units[i]}`;
}

export function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 90) return `${s.toFixed(1)} s`;
  return `${Math.round(s / 60)} min`;
}

export function ago(unix) {
  if (!unix) return "never";
  const s = Math.max(0, Date.now() / 1000 - unix);
  if (s < 2) return "just now";
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function clock(unix) { return unix ? new Date(unix * 1000).toLocaleTimeString() : "–"; }

// An element with attributes and children: el("td", {class: "num"}, "3").
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

// A table whose rows become cards on a narrow screen (console.css), made in `wrap`. Its columns
// are named once: the header row and each cell's data-label (the name a card shows before the
// cell) both come from `columns`. Returns its body and `labelled(row)`, which labels a row's
// cells in order and gives the row back.
export function cardTable(wrap, { id, caption, columns }) {
  const body = el("tbody");
  wrap.replaceChildren(el("table", { id, class: "cards" },
    el("caption", { class: "sr-only" }, caption),
    el("thead", {}, el("tr", {}, columns.map((name) => el("th", { scope: "col" }, name)))),
    body));
  const labelled = (row) => {
    [...row.cells].forEach((cell, i) => { cell.dataset.label = columns[i]; });
    return row;
  };
  return { body, labelled };
}

// An alias as an admin path: its slashes stay (the route takes "org/model").
export function aliasPath(alias) { return alias.split("/").map(encodeURIComponent).join("/"); }
