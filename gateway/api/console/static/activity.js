// Activity view: reads the server's Prometheus text (/metrics) every 2 s and keeps the last
// minutes of samples in the page: generated tokens/s per model (a chart), requests, errors,
// time to first token, batch sizes (see gateway/metrics.py for what each series counts).
// On opening it first reads the server's own history of the last 15 minutes
// (/metrics/activity, gateway/activity.py: the same totals, in the same sample format), so the
// chart shows what happened before the page was open.
import { api, cardTable, el, errorText, seconds } from "./api.js";

const EVERY_MS = 2000;
const WINDOW_S = 900; // the server keeps this much history (gateway/activity.py)
const COLORS = ["#2457c5", "#1f7a3a", "#b3261e", "#9a5b00", "#7b3fb8", "#00838f", "#c2185b"];
const NO_MODEL = "-";

const chart = document.getElementById("activity-chart");
const legend = document.getElementById("activity-legend");
const { body, labelled } = cardTable(document.getElementById("activity-table-wrap"), {
  id: "activity-table",
  caption: "Per model since the server started",
  columns: ["Model", "Tokens/s now", "Requests", "Errors", "Avg time to first token",
    "Avg batch size", "Prompt / generated tokens"],
});
const message = document.getElementById("activity-message");
const samples = []; // {t: unix seconds, models: {alias: totals}}

// Prometheus text exposition -> [{name, labels, value}]
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    out.push({ name: m[1], labels, value: parseFloat(m[3]) });
  }
  return out;
}

function totals(series) {
  const models = {};
  const of = (alias) => (models[alias] ??= { requests: 0, errors: 0, prompt: 0, completion: 0,
                                               ttftSum: 0, ttftCount: 0, batchSum: 0, batchCount: 0 });
  const add = { modelyard_completion_tokens_total: "completion", modelyard_prompt_tokens_total: "prompt",
                modelyard_time_to_first_token_seconds_sum: "ttftSum",
                modelyard_time_to_first_token_seconds_count: "ttftCount",
                modelyard_batch_size_sum: "batchSum", modelyard_batch_size_count: "batchCount" };
  for (const { name, labels, value } of series) {
    if (labels.model === undefined) continue;
    if (name === "modelyard_requests_total") {
      const m = of(labels.model);
      m.requests += value;
      if (Number(labels.status) >= 400) m.errors += value;
    } else if (add[name]) {
      of(labels.model)[add[name]] += value;
    }
  }
  return models;
}

async function sample() {
  try {
    const res = await api("/metrics");
    if (!res.ok) throw new Error(await errorText(res));
    const t = Date.now() / 1000;
    samples.push({ t, models: totals(parseMetrics(await res.text())) });
    while (samples.length > 2 && t - samples[0].t > WINDOW_S) samples.shift();
    message.textContent = "";
  } catch (err) {
    message.textContent = `metrics: ${err.message}`;
  }
  draw();
}

// tokens/s of `alias` between consecutive samples: [{t, rate}]
function rates(alias) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const before = a.models[alias]?.completion ?? 0, after = b.models[alias]?.completion ?? 0;
    out.push({ t: b.t, rate: Math.max(0, after - before) / (b.t - a.t) });
  }
  return out;
}

function draw() {
  const last = samples[samples.length - 1];
  const aliases = last ? Object.keys(last.models).filter((a) => a !== NO_MODEL).sort() : [];
  // drawn in the element's own pixels, so the labels are not stretched
  const W = Math.max(200, Math.round(chart.clientWidth || 600)), H = 180, PAD = 24;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const series = aliases.map((a) => rates(a));
  const top = Math.max(1, ...series.flat().map((p) => p.rate));
  const now = last ? last.t : 0;
  const x = (t) => W - ((now - t) / WINDOW_S) * W;
  const y = (r) => H - PAD / 2 - (r / top) * (H - PAD);
  const title = chart.querySelector("title");
  const grid = [0, 0.5, 1].map((f) => `<line class="grid" x1="0" x2="${W}" y1="${y(top * f)}" y2="${y(top * f)}"/>` +
    `<text x="4" y="${y(top * f) - 3}">${(top * f).toFixed(top * f < 10 ? 1 : 0)} tok/s</text>`).join("");
  const lines = series.map((pts, i) => pts.length
    ? `<polyline stroke="${COLORS[i % COLORS.length]}" points="${pts.map((p) => `${x(p.t).toFixed(1)},${y(p.rate).toFixed(1)}`).join(" ")}"/>`
    : "").join("");
  chart.innerHTML = grid + lines;
  chart.prepend(title);
  legend.replaceChildren(...aliases.map((a, i) => el("span", {},
    el("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}`, "aria-hidden": "true" }), a)));

  const rows = last ? Object.entries(last.models).sort() : [];
  body.replaceChildren(...rows.map(([alias, m]) => {
    const r = alias === NO_MODEL ? [] : rates(alias);
    const nowRate = r.length ? r[r.length - 1].rate : 0;
    return labelled(el("tr", { "data-model": alias },
      el("td", {}, alias === NO_MODEL ? "(no model: admin, metrics, console, refused)" : alias),
      el("td", { class: "num" }, alias === NO_MODEL ? "–" : nowRate.toFixed(1)),
      el("td", { class: "num" }, m.requests),
      el("td", { class: "num" }, m.errors),
      el("td", { class: "num" },
        m.ttftCount ? seconds(m.ttftSum / m.ttftCount) : "–"),
      el("td", { class: "num" },
        m.batchCount ? (m.batchSum / m.batchCount).toFixed(2) : "–"),
      el("td", { class: "num" }, `${m.prompt} / ${m.completion}`)));
  }));
}

// the server's history first, then live samples after it
async function history() {
  try {
    const res = await api("/metrics/activity");
    if (!res.ok) return;
    const past = (await res.json()).samples ?? [];
    samples.unshift(...past.filter((s) => !samples.length || s.t < samples[0].t));
  } catch (err) {
    // no history is no loss: the live samples still come
  }
}

export async function init() {
  document.getElementById("activity-window").textContent = String(WINDOW_S / 60);
  await history();
  sample();
  setInterval(sample, EVERY_MS);
}
