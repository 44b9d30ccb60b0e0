// The token-score viewer's parts (design.md 13): a response's tokens shaded by their probability,
// their alternatives on hover or tap, the plot of their log-probabilities, the reasoning's and the
// answer's scores apart. Every text the page shows is set as text (textContent, or an
// attribute's value), never parsed as HTML: tokens are whatever the model wrote.

export const LOGPROBS = "message.output_text.logprobs";
export const KEY = "responses-proxy-key"; // sessionStorage: this tab only, gone when it closes
const SVG = "http://www.w3.org/2000/svg";
export const view = document.getElementById("view");
export const tooltip = document.getElementById("alternatives");
const encoder = new TextEncoder();

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

// An SVG element; string children become text nodes (never markup).
function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  node.append(...children);
  return node;
}

export async function api(path, options = {}) {
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

export const stored = async (id) => (await api(`/v1/responses/${encodeURIComponent(id)}?include[]=${LOGPROBS}`)).json();

export function failed(error) {
  view.replaceChildren(el("p", { class: "error", text: String(error.message || error) }));
}

// -- scores ---------------------------------------------------------------------------------

export const probability = (logprob) => Math.exp(Math.max(logprob, -9999));
// Shading: red for an unlikely token, through amber, to green for a sure one.
const shade = (p) => `hsl(${Math.round(120 * p)}, 75%, ${Math.round(88 - 10 * p)}%)`;
export const shown = (token) => token.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
export const percent = (p) => `${(100 * p).toFixed(p >= 0.1 ? 1 : 2)}%`;
// A tokenizer's control tokens: <|im_end|>, <｜end▁of▁sentence｜>, <eos>, </think>, each alone.
const SPECIAL = /^<(\|[^|\s]+\||\uff5c[^\uff5c]+\uff5c|\/?[A-Za-z_][\w.:\u2581-]*)>$/;
const isSpecial = (token) => SPECIAL.test(token);
const isBlank = (token) => token.trim() === "";
const isFiller = (score) => isSpecial(score.token) || isBlank(score.token);
const isBlankByte = (byte) => byte === 32 || byte === 9 || byte === 10 || byte === 13;
export const bytesOf = (score) => (Array.isArray(score.bytes) ? score.bytes : Array.from(encoder.encode(score.token)));

export function tokenSpan(score, index, part = "answer") {
  const special = isSpecial(score.token);
  const span = el("span", {
    class: `token ${part}${special ? " special" : ""}`,
    tabindex: "0",
    "data-index": String(index),
    "data-logprob": String(score.logprob),
    text: score.token,
  });
  if (special) span.setAttribute("title", "special token");
  span.style.backgroundColor = shade(probability(score.logprob));
  span.score = score;
  return span;
}

export function alternativesTable(score, other = null) {
  const row = (token, logprob, kind) =>
    el("tr", { class: kind }, el("td", { text: shown(token) }), el("td", { text: percent(probability(logprob)) }), el("td", { text: logprob.toFixed(3) }));
  const rows = [row(score.token, score.logprob, "chosen")];
  for (const alternative of score.top_logprobs || []) {
    if (alternative.token === score.token) continue;
    rows.push(row(alternative.token, alternative.logprob, alternative.token === other ? "other" : ""));
  }
  return el("table", {}, ...rows);
}

function showAlternatives(span) {
  const score = span.score;
  const what = [`token ${Number(span.dataset.index) + 1}`];
  if (span.classList.contains("reasoning")) what.push("reasoning");
  if (span.classList.contains("special")) what.push("special token");
  tooltip.replaceChildren(el("div", { class: "card-title", text: what.join(" \u00b7 ") }), alternativesTable(score));
  place(span);
}

// The card goes below the token, or above it, whichever is nearer once moved clear of the
// token itself and of every heading (it never covers what it explains, or where it is).
function place(span) {
  tooltip.style.visibility = "hidden";
  tooltip.style.left = "0px";
  tooltip.style.top = "0px";
  tooltip.hidden = false;
  const { width, height } = tooltip.getBoundingClientRect();
  const token = span.getBoundingClientRect();
  const gap = 6;
  const left = Math.max(4, Math.min(token.left, document.documentElement.clientWidth - width - 4));
  const keepOut = [token];
  for (const node of document.querySelectorAll("header, h1, h2, h3, .kind")) {
    if (tooltip.contains(node)) continue;
    const box = node.getBoundingClientRect();
    if (box.width && box.height) keepOut.push(box);
  }
  const covered = (top) => keepOut.filter((box) => left < box.right && left + width > box.left && top < box.bottom && top + height > box.top);
  const clear = (top, down) => {
    for (let tries = 0; tries < 64; tries++) {
      const hit = covered(top);
      if (!hit.length) return top;
      top = down ? Math.max(...hit.map((box) => box.bottom)) + gap : Math.min(...hit.map((box) => box.top)) - gap - height;
    }
    return null;
  };
  const below = clear(token.bottom + gap, true);
  let above = clear(token.top - gap - height, false);
  if (above !== null && above + window.scrollY < 0) above = null; // off the top of the page
  const top = above !== null && (below === null || token.top - (above + height) < below - token.bottom) ? above : below;
  tooltip.style.left = `${window.scrollX + left}px`;
  tooltip.style.top = `${window.scrollY + (top ?? token.bottom + gap)}px`;
  tooltip.style.visibility = "";
}

function hideAlternatives() {
  if (!document.querySelector(".token.pinned")) tooltip.hidden = true;
}

const isToken = (node) => node?.classList?.contains("token") && node.score;
document.addEventListener("mouseover", (event) => isToken(event.target) && showAlternatives(event.target));
document.addEventListener("mouseout", (event) => isToken(event.target) && hideAlternatives());
document.addEventListener("focusin", (event) => isToken(event.target) && showAlternatives(event.target));
document.addEventListener("focusout", (event) => isToken(event.target) && hideAlternatives());
// A tap pins a token's alternatives (touch screens have no hover); a tap elsewhere lets go.
document.addEventListener("click", (event) => {
  const pinned = document.querySelector(".token.pinned");
  if (pinned && pinned !== event.target) pinned.classList.remove("pinned");
  if (isToken(event.target)) {
    event.target.classList.toggle("pinned");
    showAlternatives(event.target);
  } else if (!event.target.closest?.("#least-likely, .chart")) {
    tooltip.hidden = true;
  }
});

export function perplexity(scores) {
  if (!scores.length) return null;
  return Math.exp(-scores.reduce((sum, score) => sum + score.logprob, 0) / scores.length);
}

// Scroll to a token of the page and show its alternatives.
function goTo(index) {
  const span = document.querySelector(`.token[data-index="${Number(index)}"]`);
  if (!span) return;
  span.scrollIntoView({ block: "center" });
  span.focus({ preventScroll: true });
  span.classList.remove("flash");
  void span.offsetWidth; // restart the animation
  span.classList.add("flash");
}

// The log-probability of each token along the answer: a y axis of log-probabilities, bars
// down (deeper is less likely), each token's label below its bar and in its tooltip.
export function chart(scores, reasoning = new Set()) {
  const n = scores.length;
  const axis = 48;
  const top = 10;
  const depth = 120;
  const labels = 80;
  const step = n ? Math.max(6, Math.min(36, 720 / n)) : 36;
  const width = axis + Math.max(n, 1) * step + 10;
  const deepest = Math.max(0, ...scores.map((score) => Math.min(-score.logprob, 20)).filter(Number.isFinite));
  const bottom = [1, 2, 5, 10, 20].find((limit) => deepest <= limit) ?? 20;
  const ticks = { 1: [0, 0.25, 0.5, 0.75, 1], 2: [0, 0.5, 1, 1.5, 2], 5: [0, 1, 2, 3, 4, 5], 10: [0, 2, 4, 6, 8, 10], 20: [0, 5, 10, 15, 20] }[bottom];
  const y = (down) => top + (depth * Math.min(down, bottom)) / bottom;
  const plot = svg("svg", {
    width,
    height: top + depth + labels,
    role: "img",
    "aria-label": "log-probability of each token, deeper is less likely",
  });
  for (const tick of ticks) {
    plot.append(svg("line", { class: "grid", x1: axis, x2: width, y1: y(tick), y2: y(tick) }));
    plot.append(svg("text", { class: "ytick", x: axis - 6, y: y(tick) + 4, "text-anchor": "end" }, tick ? `-${tick}` : "0"));
  }
  plot.append(svg("line", { class: "axis", x1: axis, x2: axis, y1: top, y2: top + depth }));
  plot.append(svg("text", { class: "ytitle", x: 12, y: top + depth / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${top + depth / 2})` }, "log p"));
  const every = Math.ceil(12 / step);
  scores.forEach((score, index) => {
    const x = axis + index * step;
    const low = probability(score.logprob) < 0.5;
    const bar = svg("rect", {
      class: `bar${low ? " low" : ""}${reasoning.has(index) ? " reasoning" : ""}`,
      "data-index": index,
      x: x + step * 0.1,
      width: step * 0.8,
      y: top,
      height: Math.max(1, y(-score.logprob) - top),
    });
    bar.append(svg("title", {}, `token ${index + 1}: ${shown(score.token)}  ${score.logprob.toFixed(3)} (${percent(probability(score.logprob))})`));
    plot.append(bar);
    if (index % every === 0) {
      const cx = x + step / 2;
      const label = shown(score.token);
      const text = svg("text", { x: cx, y: top + depth + 12, "text-anchor": "end", transform: `rotate(-55 ${cx} ${top + depth + 12})` }, label.length > 10 ? `${label.slice(0, 9)}\u2026` : label);
      plot.append(svg("g", { class: "xlabel", "data-index": index }, svg("title", {}, `token ${index + 1}: ${label}`), text));
    }
  });
  plot.addEventListener("click", (event) => {
    const index = event.target.closest?.("[data-index]")?.getAttribute("data-index");
    if (index != null) goTo(index);
  });
  return el("div", { class: "chart" }, el("h2", { text: "Log-probability per token (bars down: less likely)" }), el("div", { class: "plot" }, plot));
}

export function legend() {
  const swatches = [0.05, 0.25, 0.5, 0.75, 0.95].map((p) => {
    const swatch = el("span", { class: "swatch", title: `probability ${percent(p)}`, text: `${Math.round(100 * p)}%` });
    swatch.style.backgroundColor = shade(p);
    return swatch;
  });
  return el("div", { class: "legend" }, el("span", { text: "probability: unlikely" }), ...swatches, el("span", { text: "likely" }));
}

// The answer's ten least likely tokens, each a link to the token.
export function leastLikely(scores, indices) {
  const lowest = indices
    .map((index) => ({ index, score: scores[index] }))
    .sort((a, b) => a.score.logprob - b.score.logprob || a.index - b.index)
    .slice(0, 10);
  const list = el("ol", {});
  for (const { index, score } of lowest) {
    const go = el("button", { type: "button", class: "link", "data-index": String(index) }, el("span", { class: "position", text: `token ${index + 1}` }), " ", el("span", { class: "what", text: shown(score.token) }), " ", el("span", { class: "p", text: percent(probability(score.logprob)) }));
    go.addEventListener("click", () => goTo(index));
    list.append(el("li", {}, go));
  }
  return el("section", { id: "least-likely" }, el("h2", { text: "Least likely tokens of the answer" }), lowest.length ? list : el("p", { class: "note", text: "No scored tokens." }));
}

// -- painting scores: reasoning's apart from the answer's ---------------------------------------

// A reasoning item: its text, then (once its scores come) its tokens, scored. Rule 3.8 puts
// reasoning's scores on the message's output_text, first: the painter hands a block the
// scores whose tokens spell its text, in order.
class ReasoningBlock {
  constructor() {
    this.text = "";
    this.want = []; // the text's UTF-8 bytes, which the tokens' bytes spell
    this.at = 0; // how many of them the tokens matched so far
    this.matched = 0;
    this.kind = el("span", { class: "kind", text: "reasoning" });
    this.body = el("div", { class: "unscored reasoning" });
    this.rest = null;
    this.node = el("div", { class: "block" }, this.kind, this.body);
  }

  append(text) {
    this.text += text;
    this.want.push(...encoder.encode(text));
    this.update();
  }

  paint(span, spelled) {
    if (!this.rest) {
      this.body.className = "tokens reasoning";
      this.rest = el("span", { class: "rest" });
      this.body.replaceChildren(this.rest);
    }
    this.body.insertBefore(span, this.rest);
    if (spelled) {
      this.at += spelled;
      this.matched += 1;
    }
    this.update();
  }

  update() {
    if (this.rest) this.rest.textContent = new TextDecoder().decode(new Uint8Array(this.want.slice(this.at)));
    else this.body.textContent = this.text;
  }

  finish() {
    this.kind.textContent = this.matched ? "reasoning" : "reasoning (not scored)";
  }

  // How many bytes of the text, from `at`, a token's bytes spell: all of them, in order; at
  // the text's edges, with the blanks the text leaves out (a tokenizer's " Let" where the
  // text begins "Let", its ".\n" where it ends "."). -1 when they spell none of it.
  spelled(bytes, at = this.at) {
    const want = this.want;
    const same = (from, to, offset) => bytes.slice(from, to).every((byte, k) => byte === want[offset + k]);
    const rest = want.length - at;
    if (!bytes.length) return -1;
    if (bytes.length <= rest && same(0, bytes.length, at)) return bytes.length;
    if (rest > 0 && bytes.length > rest && same(0, rest, at) && bytes.slice(rest).every(isBlankByte)) return rest;
    const lead = bytes.findIndex((byte) => !isBlankByte(byte));
    if (at === 0 && lead > 0 && bytes.length - lead <= want.length && same(lead, bytes.length, 0)) return bytes.length - lead;
    return -1;
  }

  // Whether its scores begin at batch[k]: the first that is no control token or blank
  // spells the text's start.
  begins(batch, k) {
    let first = k;
    while (first < batch.length && isFiller(batch[first])) first++;
    return first < batch.length && this.spelled(bytesOf(batch[first]), 0) >= 0;
  }
}

export class Painter {
  constructor(answer) {
    this.answer = answer; // the element the answer's tokens go in
    this.scores = [];
    this.answerIndices = [];
    this.reasoningIndices = new Set();
    this.blocks = [];
    this.cursor = 0; // the reasoning block that the next scores may still belong to
  }

  reasoning() {
    const block = new ReasoningBlock();
    this.blocks.push(block);
    return block;
  }

  // Scores in generation order, as they come (a delta's, the rest of a done's).
  add(batch) {
    batch.forEach((score, k) => {
      const index = this.scores.push(score) - 1;
      const [block, spelled] = this.route(batch, k);
      if (block) {
        this.reasoningIndices.add(index);
        block.paint(tokenSpan(score, index, "reasoning"), spelled);
      } else {
        this.answerIndices.push(index);
        this.answer.append(tokenSpan(score, index, "answer"));
      }
    });
  }

  // Which reasoning block a score belongs to, and how many bytes of its text it spells:
  // the scores that spell a block's text, in order, go to it, with the control tokens and
  // blanks around them that the text leaves out (<think>, a newline, </think>); the first
  // that does not fit closes the block. A block not begun waits for the score that begins
  // it: the scores before it (an earlier round's text or tool call) are the answer's, and a
  // block that none begins (its reasoning unscored) lets a later one begin.
  route(batch, k) {
    const score = batch[k];
    const bytes = bytesOf(score);
    const open = this.blocks[this.cursor];
    if (open && open.at > 0) {
      const spelled = open.spelled(bytes);
      if (spelled >= 0) return [open, spelled];
      if (isFiller(score)) {
        if (open.at < open.want.length) {
          const next = batch.slice(k + 1).find((s) => !isFiller(s));
          if (next && open.spelled(bytesOf(next)) >= 0) return [open, 0];
        } else {
          // After the text: what is left of a run of control tokens and blanks that holds
          // a control token still (the </think> and the newlines before it).
          let end = k;
          while (end < batch.length && isFiller(batch[end])) end++;
          if (batch.slice(k, end).some((s) => isSpecial(s.token))) return [open, 0];
        }
      }
      this.cursor += 1;
    }
    for (let next = this.cursor; next < this.blocks.length; next++) {
      const block = this.blocks[next];
      if (block.begins(batch, k)) {
        this.cursor = next;
        return [block, Math.max(block.spelled(bytes), 0)];
      }
    }
    return [null, 0];
  }

  finish() {
    for (const block of this.blocks) block.finish();
  }

  answerScores() {
    return this.answerIndices.map((index) => this.scores[index]);
  }
}

// -- a response ------------------------------------------------------------------------------

export function meta(response, painter) {
  const usage = response.usage || {};
  const scores = painter.scores;
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
  if (painter.reasoningIndices.size) {
    rows.push(["scored reasoning", painter.reasoningIndices.size]);
    rows.push(["answer perplexity", perplexity(painter.answerScores())?.toFixed(3) ?? "-"]);
  }
  const list = el("dl");
  for (const [name, value] of rows) list.append(el("dt", { text: name }), el("dd", { id: `meta-${name.replace(/ /g, "-")}`, text: value == null ? "-" : String(value) }));
  return el("aside", { class: "meta" }, el("h2", { text: "Response" }), list);
}

export function toolCall(item) {
  const text = `${item.namespace ? item.namespace + "." : ""}${item.name}(${item.arguments ?? item.input ?? ""})`;
  return el("div", { class: "block" }, el("span", { class: "kind", text: "tool call" }), el("div", { class: "unscored tool-call", text }));
}

const reasoningText = (item) => (item.content || item.summary || []).map((part) => part.text).join("");

// A response's output, painted: reasoning, tool calls and the answer, each apart; the scores
// of every output_text, in order, split between the reasoning and the answer.
export function outputOf(response) {
  const parts = [];
  const scores = [];
  let answer = null;
  let text = "";
  const painter = new Painter(null);
  for (const item of response.output || []) {
    if (item.type === "message") {
      for (const part of item.content || []) {
        if (part.type !== "output_text") continue;
        if (part.logprobs && part.logprobs.length) {
          if (!answer) {
            answer = { kind: el("span", { class: "kind", text: "answer" }), tokens: el("div", { class: "tokens answer", id: "answer-tokens" }) };
            parts.push(el("div", { class: "block" }, answer.kind, answer.tokens));
          }
          scores.push(...part.logprobs);
          text += part.text;
        } else {
          parts.push(el("div", { class: "block" }, el("span", { class: "kind", text: "answer (no scores: made without include " + LOGPROBS + ")" }), el("div", { class: "unscored", text: part.text })));
        }
      }
    } else if (item.type === "reasoning") {
      const block = painter.reasoning();
      block.append(reasoningText(item));
      parts.push(block.node);
    } else if (item.type === "function_call" || item.type === "custom_tool_call") {
      parts.push(toolCall(item));
    }
  }
  painter.answer = answer?.tokens ?? el("div");
  painter.add(scores);
  painter.finish();
  if (answer && !text && painter.answerIndices.length) answer.kind.textContent = "scored tokens outside the answer's text (tool calls)";
  return { parts, painter };
}
