// Config view: the config file, how it is watched, and the last reload's result with every
// error (config errors read `file:line: key.path: message`, so each names its line).
import { api, clock, el, errorText } from "./api.js";

const facts = document.getElementById("config-facts");
const lastReload = document.getElementById("last-reload");
const button = document.getElementById("reload-button");
let drawn = null;

export function init() {
  button.addEventListener("click", reload);
}

export function update(live, name) {
  if (name !== "status") return;
  draw(live.status);
}

function fact(term, ...value) { return [el("dt", {}, term), el("dd", {}, ...value)]; }

function draw(s) {
  if (!s) return;
  const w = s.watch;
  const watching = !w.enabled ? "off (reload with the button, POST /admin/reload or SIGHUP)"
    : `${w.polling ? "polling" : "file events"}${w.paths.length ? ": " + w.paths.join(", ") : " (starting)"}`;
  facts.replaceChildren(
    ...fact("Config file", s.config ? el("code", {}, s.config) : "none (built-in defaults)"),
    ...fact("Watching", watching),
    ...fact("Reloads", `${s.reloads.ok} ok, ${s.reloads.error} failed`),
    ...fact("Models", `${s.models.configured} configured, ${s.models.loaded} loaded; aliases ${s.models.aliases.join(", ")}`),
    ...fact("Serving since", new Date(s.started * 1000).toLocaleString()),
    ...(s.warnings.length ? fact("Warnings", el("ul", {}, s.warnings.map((x) => el("li", {}, x)))) : []));
  button.disabled = !s.config;
  drawRecord(s.last_reload);
}

// "path/modelyard.yaml:7: models.0.n_ctx: ..." -> the line number, shown beside the message
function lineOf(error) {
  const m = /^(.*?):(\d+):\s/.exec(error);
  return m ? Number(m[2]) : null;
}

function drawRecord(r) {
  const key = JSON.stringify(r);
  if (key === drawn) return;
  drawn = key;
  if (!r) {
    lastReload.replaceChildren(el("p", { class: "summary" }, "No reload since the server started."));
    return;
  }
  const list = (title, names) => names.length ? el("p", {}, `${title}: ${names.join(", ")}`) : null;
  lastReload.replaceChildren(el("div", { class: "reload" + (r.ok ? "" : " failed"), id: "reload-record" },
    el("p", {}, el("strong", {}, r.ok ? "Applied" : "Failed, still serving the previous config"),
      ` at ${clock(r.at)} (${r.trigger})`),
    r.errors.length ? el("ul", { "aria-label": "Config errors" }, r.errors.map((e) => {
      const line = lineOf(e);
      return el("li", { class: "config-error" },
        line ? el("span", { class: "line" }, `line ${line}: `) : null, el("code", {}, e));
    })) : null,
    list("Kept loaded", r.kept), list("Reloading with new settings", r.reloaded),
    list("Added", r.added), list("Removed", r.removed),
    list("Needs a restart", r.restart_needed),
    r.warnings.length ? el("ul", { "aria-label": "Warnings" }, r.warnings.map((x) => el("li", {}, x))) : null));
}

async function reload() {
  button.disabled = true;
  try {
    const res = await api("/admin/reload", { method: "POST" });
    // 200 applied, 422 invalid: both bodies are the reload record
    if (res.ok || res.status === 422) drawRecord(await res.json());
    else lastReload.replaceChildren(el("p", { class: "message" }, await errorText(res)));
  } catch (err) {
    lastReload.replaceChildren(el("p", { class: "message" }, err.message));
  } finally {
    button.disabled = false;
  }
}
