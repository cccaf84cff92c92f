// Playground: a streamed chat with one alias. Shows prompt progress while a long prompt is read
// (modelyard's `prompt_progress` chunks), then the reply as it is generated, and per reply the
// time to first token, tokens/s and usage. Stop aborts the request: the server sees the client
// leave and cancels the generation. The raw view shows the next request and its curl command.
// When the chosen model takes images (/v1/models: modelyard.images), an image can be attached
// (file picker, or pasted into the message): it goes as an OpenAI `image_url` part holding a
// data: URL, after the text part of the same user message.
import { api, authHeader, el, errorText, readEvents, seconds } from "./api.js";

const $ = (id) => document.getElementById(id);
const form = $("chat-form"), select = $("pg-model"), prompt = $("pg-prompt");
const send = $("pg-send"), stop = $("pg-stop"), status = $("pg-status");
const transcript = $("transcript");
let messages = [];    // the conversation so far, as sent to the API
let running = null;   // the AbortController of the request under way
let imageModels = new Set();  // aliases whose entries take images (from /v1/models)
let attached = null;  // {url, name}: the image the next message carries (a data: URL)

export function init() {
  form.addEventListener("submit", (e) => { e.preventDefault(); chat(); });
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); chat(); }
  });
  stop.addEventListener("click", () => running && running.abort());
  $("pg-clear").addEventListener("click", () => {
    messages = [];
    transcript.replaceChildren();
    status.textContent = "";
    showRaw();
  });
  form.addEventListener("input", showRaw);
  select.addEventListener("change", showAttach);
  $("pg-image").addEventListener("change", (e) => e.target.files[0] && attach(e.target.files[0]));
  $("pg-image-remove").addEventListener("click", () => attach(null));
  prompt.addEventListener("paste", (e) => {
    const file = [...(e.clipboardData?.files || [])].find((f) => f.type.startsWith("image/"));
    if (file && imageModels.has(select.value)) { e.preventDefault(); attach(file); }
  });
  window.addEventListener("modelyard-key", showRaw);
  // before the admin stream answers (or when the key may not use it), the public model list
  readModels(true);
  showRaw();
}

// /v1/models: which aliases take images (and the aliases, until the admin stream gives them).
function readModels(setList) {
  api("/v1/models").then((r) => r.ok && r.json()).then((list) => {
    if (!list) return;
    imageModels = new Set(list.data.filter((m) => m.modelyard && m.modelyard.images).map((m) => m.id));
    if (setList && !select.options.length) {
      setEntries(list.data.map((m) => m.modelyard?.aliases ?? [m.id]));
    }
    showAttach();
  }).catch(() => {});
}

function showAttach() {
  const takes = imageModels.has(select.value);
  $("pg-attach").hidden = !takes;
  if (!takes && attached) attach(null);
}

// Attach `file` (an image) to the next message, or drop the attachment (null).
function attach(file) {
  const preview = $("pg-image-preview"), remove = $("pg-image-remove");
  if (!file) {
    attached = null;
    $("pg-image").value = "";
    preview.replaceChildren();
    remove.hidden = true;
    showRaw();
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    attached = { url: reader.result, name: file.name || "pasted image" };
    preview.replaceChildren(el("img", { src: attached.url, alt: `attached: ${attached.name}` }));
    remove.hidden = false;
    showRaw();
  };
  reader.readAsDataURL(file);
}

// A user message: plain text, or [text, image_url] parts when an image is attached.
function userMessage(text, image) {
  if (!image) return { role: "user", content: text };
  const parts = text ? [{ type: "text", text }] : [];
  return { role: "user", content: [...parts, { type: "image_url", image_url: { url: image.url } }] };
}

export function update(live, name) {
  if (name === "models" && live.models.length) {
    setEntries(live.models.filter((r) => !r.retiring).map((r) => r.aliases));
  }
}

// data: URLs shortened for display (the raw view and curl would otherwise hold the whole image)
function shorten(key, value) {
  if (typeof value === "string" && value.startsWith("data:") && value.length > 80) {
    return `${value.slice(0, 40)}…(${value.length} characters)`;
  }
  return value;
}

function setEntries(groups) {
  const seen = new Set();
  const entries = groups.filter((g) => g.length && !seen.has(g[0]) && seen.add(g[0]));
  const current = [...select.options].map((o) => o.textContent);
  const labels = entries.map(([first, ...rest]) => rest.length ? `${first} (also ${rest.join(", ")})` : first);
  if (JSON.stringify(current) === JSON.stringify(labels)) return;
  const chosen = select.value;
  select.replaceChildren(...entries.map((g, i) => el("option", { value: g[0] }, labels[i])));
  if (entries.some((g) => g[0] === chosen)) select.value = chosen;
  readModels(false);
  showAttach();
  showRaw();
}

function number(id, parse) {
  const v = $(id).value.trim();
  return v === "" ? undefined : parse(v);
}

// The request body for `history` with the form's settings.
function body(history) {
  const system = $("pg-system").value.trim();
  const b = {
    model: select.value,
    messages: system ? [{ role: "system", content: system }, ...history] : history,
    stream: true,
    stream_options: { include_usage: true },
  };
  const fields = { temperature: ["pg-temperature", parseFloat], top_p: ["pg-top-p", parseFloat],
                   max_tokens: ["pg-max-tokens", (v) => parseInt(v, 10)], seed: ["pg-seed", (v) => parseInt(v, 10)] };
  for (const [name, [id, parse]] of Object.entries(fields)) {
    const v = number(id, parse);
    if (v !== undefined && !Number.isNaN(v)) b[name] = v;
  }
  return b;
}

function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }

function showRaw() {
  const text = prompt.value.trim() || "Hello!";
  const b = body([...messages, userMessage(text, attached)]);
  const json = JSON.stringify(b, shorten, 2);
  $("pg-raw-body").textContent = json;
  const url = new URL("/v1/chat/completions", location.href).href;
  // the key itself is never shown: the command reads it from the environment
  const auth = "Authorization" in authHeader() ? ` \\\n  -H "Authorization: Bearer $MODELYARD_API_KEY"` : "";
  $("pg-curl").textContent = `curl -N ${url} \\\n  -H "Content-Type: application/json"${auth} \\\n  -d ${shellQuote(JSON.stringify(b, shorten))}`;
}

function bubble(role, text, image = null) {
  const item = el("li", { class: role }, el("span", { class: "who" }, role),
                  el("span", { class: "text" }, text),
                  image && el("img", { src: image.url, alt: `image: ${image.name}` }),
                  el("span", { class: "stats" }));
  transcript.append(item);
  return item;
}

async function chat() {
  const text = prompt.value.trim();
  const image = imageModels.has(select.value) ? attached : null;
  if ((!text && !image) || running || !select.value) return;
  const history = [...messages, userMessage(text, image)];
  bubble("user", text, image);
  prompt.value = "";
  if (image) attach(null);
  const reply = bubble("assistant", "");
  reply.setAttribute("aria-busy", "true");
  const out = reply.querySelector(".text"), stats = reply.querySelector(".stats");
  running = new AbortController();
  send.disabled = true;
  stop.disabled = false;
  status.textContent = "waiting for the model…";
  const started = performance.now();
  let first = null, chunks = 0, usage = null, finish = null, content = "";
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST", signal: running.signal,
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(body(history)),
    });
    if (!res.ok) throw new Error(await errorText(res));
    for await (const { data } of readEvents(res)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      if (chunk.prompt_progress) {
        const p = chunk.prompt_progress;
        status.textContent = `reading the prompt: ${p.processed} / ${p.total} tokens` + (p.cached ? ` (${p.cached} cached)` : "");
      }
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      if (choice.finish_reason) finish = choice.finish_reason;
      const delta = choice.delta && choice.delta.content;
      if (delta) {
        if (first === null) { first = performance.now(); status.textContent = "generating…"; }
        chunks++;
        content += delta;
        out.textContent = content;
      }
    }
    status.textContent = "";
  } catch (err) {
    if (err.name === "AbortError") {
      finish = "stopped";
      status.textContent = "stopped";
    } else {
      reply.append(el("span", { class: "error" }, err.message));
      status.textContent = "";
    }
  } finally {
    const end = performance.now();
    const generated = usage ? usage.completion_tokens : chunks;
    const parts = [];
    if (first !== null) parts.push(`first token ${seconds((first - started) / 1000)}`);
    if (first !== null && generated > 1 && end > first) {
      parts.push(`${((generated - 1) / ((end - first) / 1000)).toFixed(1)} tokens/s`);
    }
    if (usage) parts.push(`usage: ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion = ${usage.total_tokens} tokens`);
    else if (chunks) parts.push(`${chunks} chunks`);
    if (finish) parts.push(`finish: ${finish}`);
    stats.textContent = parts.join(" · ");
    reply.removeAttribute("aria-busy");
    if (content) messages = [...history, { role: "assistant", content }];
    running = null;
    send.disabled = false;
    stop.disabled = true;
    showRaw();
  }
}
