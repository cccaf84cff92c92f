// Models view: every configured entry (and instances still draining after a reload), with load
// and unload buttons. Re-drawn on each models event and once a second (relative times, and the
// elapsed time of a load in progress).
import { ago, aliasPath, api, bytes, cardTable, el, errorText, seconds } from "./api.js";

const { body, labelled } = cardTable(document.getElementById("models-table-wrap"), {
  id: "models-table",
  caption: "Configured models: state, memory and requests; load or unload each",
  columns: ["Model", "State", "Memory", "Context", "In flight / queued / active", "Last used",
    "Loads", "Actions"],
});
const summary = document.getElementById("models-summary");
const message = document.getElementById("models-message");
const loadingSince = new Map(); // row key -> Date.now() when the page first saw it loading
const busy = new Set();         // row keys with a load/unload request of ours under way
let rows = [];

const rowKey = (r) => r.model + (r.retiring ? " (old)" : "");

export function init() { setInterval(draw, 1000); }

export function update(live, name) {
  if (name !== "models") return;
  rows = live.models;
  draw();
}

function stateCell(r, key) {
  const cell = el("td", {},
    el("span", { class: `state state-${r.state}` }, r.state + (r.retiring ? " (old settings)" : "")));
  if (r.state === "loading") {
    if (!loadingSince.has(key)) loadingSince.set(key, Date.now());
    const s = (Date.now() - loadingSince.get(key)) / 1000;
    // loaded before: measured against the last load's time; else an indeterminate bar
    const expected = r.load_seconds;
    const bar = expected
      ? el("progress", { max: "1", value: String(Math.min(0.99, s / expected)), "aria-label": `loading ${r.aliases[0]}` })
      : el("progress", { "aria-label": `loading ${r.aliases[0]}` });
    cell.append(" ", bar, el("div", { class: "summary" },
      `${Math.round(s)} s${expected ? ` of about ${seconds(expected)}` : ""}, reserving ${bytes(r.memory_bytes)}`));
  } else {
    loadingSince.delete(key);
  }
  if (r.last_error) cell.append(el("div", { class: "error" }, r.last_error));
  return cell;
}

function actions(r, key) {
  const alias = r.aliases[0];
  const cell = el("td");
  if (r.retiring) return cell;
  const mine = busy.has(key);
  const canLoad = r.state === "unloaded" || r.state === "failed";
  cell.append(el("div", { class: "buttons" },
    el("button", { type: "button", "data-action": "load", "data-alias": alias,
                   disabled: mine || !canLoad, "aria-label": `Load ${alias}`,
                   onclick: () => act(r, key, "load") }, "Load"),
    el("button", { type: "button", class: "secondary", "data-action": "unload", "data-alias": alias,
                   disabled: mine || r.state !== "ready", "aria-label": `Unload ${alias}`,
                   onclick: () => act(r, key, "unload") }, "Unload")));
  return cell;
}

function draw() {
  // keep keyboard focus on the same button across the redraw
  const focused = document.activeElement;
  const focusId = focused && body.contains(focused) && focused.dataset.action
    ? [focused.dataset.action, focused.dataset.alias] : null;
  body.replaceChildren(...rows.map((r) => {
    const key = rowKey(r);
    const [name, ...others] = r.aliases;
    const file = r.model.split(/[\\/]/).pop();
    return labelled(el("tr", { "data-model": r.aliases[0], "data-state": r.state },
      el("td", {},
        el("strong", {}, name), r.pinned ? el("span", { class: "badge" }, "pinned") : null,
        others.length ? el("div", { class: "aliases" }, "also: " + others.join(", ")) : null,
        el("div", { class: "file", title: r.model }, file),
        r.chat_format ? el("div", { class: "file" }, "template: " + r.chat_format) : null),
      stateCell(r, key),
      el("td", { class: "num", "data-field": "memory" },
        r.memory_bytes ? bytes(r.memory_bytes) : "–"),
      el("td", { class: "num" }, r.n_ctx),
      el("td", { class: "num", "data-field": "requests",
                 title: "in flight / queued / active" },
        `${r.in_flight} / ${r.queued} / ${r.active}`),
      el("td", { title: r.last_used ? new Date(r.last_used * 1000).toLocaleString() : "" },
        ago(r.last_used)),
      el("td", { class: "num" },
        r.load_count ? `${r.load_count} × (last ${seconds(r.load_seconds)})` : "0"),
      actions(r, key)));
  }));
  if (focusId) {
    const again = body.querySelector(`[data-action="${focusId[0]}"][data-alias="${CSS.escape(focusId[1])}"]`);
    if (again) again.focus();
  }
  const ready = rows.filter((r) => r.state === "ready");
  const memory = rows.reduce((n, r) => n + r.memory_bytes, 0);
  summary.textContent = `${rows.length} entries, ${ready.length} ready, ${bytes(memory)} held`;
}

async function act(r, key, what) {
  const alias = r.aliases[0];
  busy.add(key);
  message.textContent = "";
  draw();
  try {
    const res = await api(`/admin/models/${aliasPath(alias)}/${what}`, { method: "POST" });
    if (!res.ok) message.textContent = `${what} ${alias}: ${await errorText(res)}`;
  } catch (err) {
    message.textContent = `${what} ${alias}: ${err.message}`;
  } finally {
    busy.delete(key);
    draw();
  }
}
