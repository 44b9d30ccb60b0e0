// The token-score viewer (design.md 13): a response's tokens shaded by their probability, the
// alternatives on hover or tap, a plot of the log-probabilities and the answer's perplexity.
// Every text the page shows is set as text (textContent), never parsed as HTML: tokens are
// whatever the model wrote.

const LOGPROBS = "message.output_text.logprobs";
const KEY = "responses-proxy-key"; // sessionStorage: this tab only, gone when it closes
const view = document.getElementById("view");
const tooltip = document.getElementById("alternatives");

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error.message;
    } catch {}
    throw new Error(response.status === 401 ? `${message} Enter the API key above.` : message);
  }
  return response;
}

function failed(error) {
  view.replaceChildren(el("p", { class: "error", text: String(error.message || error) }));
}

// -- scores ---------------------------------------------------------------------------------

const probability = (logprob) => Math.exp(Math.max(logprob, -9999));
// Shading: red for an unlikely token, through amber, to green for a sure one.
const shade = (p) => `hsl(${Math.round(120 * p)}, 75%, ${Math.round(88 - 10 * p)}%)`;
const shown = (token) => token.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
const percent = (p) => `${(100 * p).toFixed(p >= 0.1 ? 1 : 2)}%`;

function tokenSpan(score, index) {
  const span = el("span", { class: "token", tabindex: "0", "data-index": String(index), "data-logprob": String(score.logprob), text: score.token });
  span.style.backgroundColor = shade(probability(score.logprob));
  span.score = score;
  return span;
}

function showAlternatives(span) {
  const score = span.score;
  const rows = [el("tr", { class: "chosen" }, el("td", { text: shown(score.token) }), el("td", { text: percent(probability(score.logprob)) }), el("td", { text: score.logprob.toFixed(3) }))];
  for (const alternative of score.top_logprobs || []) {
    if (alternative.token === score.token) continue;
    rows.push(el("tr", {}, el("td", { text: shown(alternative.token) }), el("td", { text: percent(probability(alternative.logprob)) }), el("td", { text: alternative.logprob.toFixed(3) })));
  }
  tooltip.replaceChildren(el("div", { class: "kind", text: `token ${Number(span.dataset.index) + 1}` }), el("table", {}, ...rows));
  const box = span.getBoundingClientRect();
  tooltip.style.left = `${window.scrollX + box.left}px`;
  tooltip.style.top = `${window.scrollY + box.bottom + 6}px`;
  tooltip.hidden = false;
}

function hideAlternatives() {
  if (!document.querySelector(".token.pinned")) tooltip.hidden = true;
}

document.addEventListener("mouseover", (event) => event.target.classList?.contains("token") && showAlternatives(event.target));
document.addEventListener("mouseout", (event) => event.target.classList?.contains("token") && hideAlternatives());
document.addEventListener("focusin", (event) => event.target.classList?.contains("token") && showAlternatives(event.target));
// A tap pins a token's alternatives (touch screens have no hover); a tap elsewhere lets go.
document.addEventListener("click", (event) => {
  const pinned = document.querySelector(".token.pinned");
  if (pinned && pinned !== event.target) pinned.classList.remove("pinned");
  if (event.target.classList?.contains("token")) {
    event.target.classList.toggle("pinned");
    showAlternatives(event.target);
  } else {
    tooltip.hidden = true;
  }
});

function perplexity(scores) {
  if (!scores.length) return null;
  return Math.exp(-scores.reduce((sum, score) => sum + score.logprob, 0) / scores.length);
}

function chart(scores) {
  const svgNs = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNs, "svg");
  const width = Math.max(scores.length, 1);
  const deepest = Math.max(1, ...scores.map((score) => -score.logprob).filter(Number.isFinite).map((depth) => Math.min(depth, 20)));
  svg.setAttribute("viewBox", `0 0 ${width} 100`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "log-probability of each token, deeper is less likely");
  scores.forEach((score, index) => {
    const depth = Math.min(-score.logprob, 20) / deepest;
    const bar = document.createElementNS(svgNs, "rect");
    bar.setAttribute("x", String(index + 0.1));
    bar.setAttribute("width", "0.8");
    bar.setAttribute("y", "0");
    bar.setAttribute("height", String(Math.max(1, 100 * depth)));
    bar.setAttribute("class", probability(score.logprob) < 0.5 ? "low" : "");
    const title = document.createElementNS(svgNs, "title");
    title.textContent = `${shown(score.token)}: ${score.logprob.toFixed(3)}`;
    bar.append(title);
    svg.append(bar);
  });
  return el("div", { class: "chart" }, el("h2", { text: "Log-probability per token (bars down: less likely)" }), svg);
}

function legend() {
  const swatches = [0.05, 0.25, 0.5, 0.75, 0.95].map((p) => {
    const swatch = el("span", { class: "swatch", title: percent(p) });
    swatch.style.backgroundColor = shade(p);
    return swatch;
  });
  return el("div", { class: "legend" }, el("span", { text: "unlikely" }), ...swatches, el("span", { text: "likely" }));
}

// -- a response ------------------------------------------------------------------------------

function meta(response, scores) {
  const usage = response.usage || {};
  const rows = [
    ["id", response.id],
    ["model", response.model],
    ["status", response.status],
    ["created", new Date(response.created_at * 1000).toLocaleString()],
    ["input tokens", usage.input_tokens],
    ["cached", usage.input_tokens_details?.cached_tokens],
    ["output tokens", usage.output_tokens],
    ["reasoning", usage.output_tokens_details?.reasoning_tokens],
    ["temperature", response.temperature],
    ["top_p", response.top_p],
    ["top_logprobs", response.top_logprobs],
    ["scored tokens", scores.length],
    ["perplexity", perplexity(scores)?.toFixed(3) ?? "-"],
  ];
  const list = el("dl");
  for (const [name, value] of rows) list.append(el("dt", { text: name }), el("dd", { id: `meta-${name.replace(/ /g, "-")}`, text: value == null ? "-" : String(value) }));
  return el("aside", { class: "meta" }, el("h2", { text: "Response" }), list);
}

function outputOf(response) {
  const parts = [];
  const scores = [];
  for (const item of response.output || []) {
    if (item.type === "message") {
      for (const part of item.content || []) {
        if (part.type !== "output_text") continue;
        if (part.logprobs && part.logprobs.length) {
          const tokens = el("div", { class: "tokens" });
          for (const score of part.logprobs) tokens.append(tokenSpan(score, scores.push(score) - 1));
          parts.push(el("div", {}, el("span", { class: "kind", text: "answer" }), tokens));
        } else {
          parts.push(el("div", {}, el("span", { class: "kind", text: "answer (no scores: made without include " + LOGPROBS + ")" }), el("div", { class: "unscored", text: part.text })));
        }
      }
    } else if (item.type === "reasoning") {
      const text = (item.content || item.summary || []).map((part) => part.text).join("");
      parts.push(el("div", {}, el("span", { class: "kind", text: "reasoning (not scored)" }), el("div", { class: "unscored reasoning", text })));
    } else if (item.type === "function_call" || item.type === "custom_tool_call") {
      const text = `${item.namespace ? item.namespace + "." : ""}${item.name}(${item.arguments ?? item.input ?? ""})`;
      parts.push(el("div", {}, el("span", { class: "kind", text: "tool call (not scored)" }), el("div", { class: "unscored tool-call", text })));
    }
  }
  return { parts, scores };
}

async function showResponse(id) {
  const response = await (await api(`/v1/responses/${encodeURIComponent(id)}?include[]=${LOGPROBS}`)).json();
  const { parts, scores } = outputOf(response);
  view.replaceChildren(
    el("h1", { text: `Response ${response.id}` }),
    el("div", { class: "layout" }, el("section", {}, legend(), ...parts, chart(scores)), meta(response, scores)),
  );
}

// -- the list ----------------------------------------------------------------------------------

function firstText(response) {
  for (const item of response.output || []) {
    for (const part of item.content || []) if (part.type === "output_text") return part.text;
  }
  return "";
}

async function showList(after = null) {
  const query = new URLSearchParams({ limit: "20" });
  if (after) query.set("after", after);
  const page = await (await api(`/v1/responses?${query}`)).json();
  const rows = page.data.map((response) =>
    el(
      "tr",
      {},
      el("td", {}, el("a", { href: `/ui/responses/${encodeURIComponent(response.id)}`, text: response.id })),
      el("td", { text: new Date(response.created_at * 1000).toLocaleString() }),
      el("td", { text: response.model }),
      el("td", { text: response.status }),
      el("td", { text: String(response.usage?.output_tokens ?? "-") }),
      el("td", { text: firstText(response).slice(0, 80) }),
    ),
  );
  const table = el("table", {}, el("tr", {}, ...["id", "created", "model", "status", "output tokens", "answer"].map((name) => el("th", { text: name }))), ...rows);
  const children = [el("h1", { text: "Recent responses" }), page.data.length ? table : el("p", { class: "note", text: "No stored responses for this key yet." })];
  if (page.has_more) {
    const more = el("button", { type: "button", text: "Older" });
    more.addEventListener("click", () => showList(page.last_id).catch(failed));
    children.push(more);
  }
  view.replaceChildren(...children);
}

// -- live --------------------------------------------------------------------------------------

function liveForm() {
  const form = el(
    "form",
    { class: "live", id: "live-form" },
    el("label", { text: "model" }, el("input", { name: "model", required: "", value: "default" })),
    el("label", { text: "top_logprobs" }, el("input", { name: "top_logprobs", type: "number", min: "0", max: "20", value: "5" })),
    el("label", { text: "temperature" }, el("input", { name: "temperature", type: "number", min: "0", max: "2", step: "0.1", value: "1" })),
    el("label", { class: "wide", text: "input" }, el("textarea", { name: "input", required: "" })),
    el("div", {}, el("button", { type: "submit", text: "Generate" })),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    generate(new FormData(form)).catch((error) => status.replaceChildren(el("p", { class: "error", text: error.message })));
  });
  const status = el("div", { id: "live-status" });
  const tokens = el("div", { class: "tokens", id: "live-tokens" });
  const below = el("div", { id: "live-after" });
  view.replaceChildren(el("h1", { text: "Live: a new response, painted as it streams" }), form, legend(), tokens, status, below);
}

function* sseEvents(buffer) {
  let end;
  while ((end = buffer.text.indexOf("\n\n")) >= 0) {
    const frame = buffer.text.slice(0, end);
    buffer.text = buffer.text.slice(end + 2);
    const data = frame.split("\n").filter((line) => line.startsWith("data: ")).map((line) => line.slice(6)).join("\n");
    if (data && data !== "[DONE]") yield JSON.parse(data);
  }
}

async function generate(form) {
  const tokens = document.getElementById("live-tokens");
  const status = document.getElementById("live-status");
  const below = document.getElementById("live-after");
  tokens.replaceChildren();
  below.replaceChildren();
  status.replaceChildren(el("p", { class: "note", text: "Streaming..." }));
  const body = {
    model: form.get("model"),
    input: form.get("input"),
    stream: true,
    include: [LOGPROBS],
    top_logprobs: Number(form.get("top_logprobs")),
    temperature: Number(form.get("temperature")),
  };
  const response = await api("/v1/responses", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const buffer = { text: "" };
  const scores = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer.text += decoder.decode(value, { stream: true });
    for (const event of sseEvents(buffer)) {
      if (event.type === "response.output_text.delta") {
        for (const score of event.logprobs || []) tokens.append(tokenSpan(score, scores.push(score) - 1));
      } else if (event.type === "error") {
        status.replaceChildren(el("p", { class: "error", text: event.message || "the stream failed" }));
      } else if (event.type === "response.completed" || event.type === "response.incomplete" || event.type === "response.failed") {
        const made = event.response;
        const link = made.store ? el("a", { href: `/ui/responses/${encodeURIComponent(made.id)}`, text: "open the stored response" }) : "";
        status.replaceChildren(el("p", { class: "note", id: "live-done", text: `${made.status}: ${scores.length} tokens, perplexity ${perplexity(scores)?.toFixed(3) ?? "-"}. ` }, link));
        below.replaceChildren(chart(scores), meta(made, scores));
      }
    }
  }
}

// -- the page ----------------------------------------------------------------------------------

function route() {
  tooltip.hidden = true;
  const path = window.location.pathname;
  const one = path.match(/^\/ui\/responses\/([^/]+)$/);
  if (one) return showResponse(decodeURIComponent(one[1]));
  if (path === "/ui/live") return liveForm();
  return showList();
}

const keyInput = document.getElementById("key");
keyInput.value = sessionStorage.getItem(KEY) || "";
document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (keyInput.value) sessionStorage.setItem(KEY, keyInput.value);
  else sessionStorage.removeItem(KEY);
  Promise.resolve(route()).catch(failed);
});
Promise.resolve(route()).catch(failed);
