// The console's entry point: tabs, the live connection to /admin/events, and the views.
//
// Views get the server's state through `live`: live.models (rows of /admin/models) and
// live.status (/admin/status), each replaced whenever the event stream sends a new one. When the
// stream cannot be had (an old proxy), the page polls the same two endpoints every second.
import { api, askForKey, errorText, hasKey, readEvents } from "./api.js";
import * as models from "./models.js";
import * as activity from "./activity.js";
import * as config from "./config.js";
import * as playground from "./playground.js";

const views = { models, activity, config, playground };
export const live = { models: [], status: null };
const connection = document.getElementById("connection");

function setConnection(text, ok) {
  connection.textContent = text;
  connection.classList.toggle("live", ok);
  connection.classList.toggle("down", !ok);
}

function publish(name, data) {
  live[name] = data;
  for (const view of Object.values(views)) view.update && view.update(live, name);
}

// ---------------------------------------------------------------------------- tabs

const tabs = [...document.querySelectorAll('[role="tab"]')];

function show(name, focus = false) {
  if (!views[name]) name = "models";
  for (const tab of tabs) {
    const selected = tab.id === "tab-" + name;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    document.getElementById(tab.getAttribute("aria-controls")).hidden = !selected;
    if (selected && focus) tab.focus();
  }
  if (location.hash !== "#" + name) history.replaceState(null, "", "#" + name);
  views[name].shown && views[name].shown(live);
}

for (const tab of tabs) {
  const name = tab.id.slice(4);
  tab.addEventListener("click", () => show(name));
  tab.addEventListener("keydown", (e) => {
    // the ARIA tabs pattern: arrows move between tabs, Home/End to the ends
    const i = tabs.indexOf(tab);
    const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    show(tabs[(to + tabs.length) % tabs.length].id.slice(4), true);
  });
}
window.addEventListener("hashchange", () => show(location.hash.slice(1)));

// ---------------------------------------------------------------------------- live state

async function poll() {
  const [m, s] = await Promise.all([api("/admin/models"), api("/admin/status")]);
  if (!m.ok || !s.ok) throw new Error(await errorText(m.ok ? s : m));
  publish("models", (await m.json()).data);
  publish("status", await s.json());
}

async function connect() {
  for (let failures = 0; ; ) {
    try {
      const res = await api("/admin/events", { headers: { Accept: "text/event-stream" } });
      if (res.status === 404) { // an older server: poll instead
        await poll();
        setConnection("live (polling)", true);
        await new Promise((r) => setTimeout(r, 1000));
        continue;
      }
      if (!res.ok) throw new Error(await errorText(res));
      setConnection("live", true);
      failures = 0;
      for await (const { event, data } of readEvents(res)) {
        if (event === "models" || event === "status") publish(event, JSON.parse(data));
      }
      throw new Error("the event stream ended");
    } catch (err) {
      failures++;
      setConnection(`disconnected (${err.message}); retrying`, false);
      await new Promise((r) => setTimeout(r, Math.min(5000, 500 * failures)));
    }
  }
}

document.getElementById("key-button").addEventListener("click", () => {
  askForKey(hasKey() ? "A key is in use; enter another one, or forget it."
                     : "Enter an API key if the server needs one.");
});

for (const view of Object.values(views)) view.init && view.init(live);
show(location.hash.slice(1) || "models");
connect();
