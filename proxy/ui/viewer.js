// The token-score viewer's views (design.md 13): the key's recent responses, one response, two
// compared token by token, and a live answer; the page's route and its key. Every text the page
// shows is set as text, never parsed as HTML (tokens.js).

import {
  LOGPROBS,
  KEY,
  view,
  tooltip,
  el,
  api,
  stored,
  failed,
  probability,
  shown,
  percent,
  bytesOf,
  tokenSpan,
  alternativesTable,
  perplexity,
  chart,
  legend,
  leastLikely,
  Painter,
  meta,
  toolCall,
  outputOf,
} from "./tokens.js";

async function showResponse(id) {
  const response = await stored(id);
  const { parts, painter } = outputOf(response);
  view.replaceChildren(
    el("h1", { text: `Response ${response.id}` }),
    el(
      "div",
      { class: "layout" },
      el("section", {}, legend(), ...parts, chart(painter.scores, painter.reasoningIndices), leastLikely(painter.scores, painter.answerIndices)),
      meta(response, painter),
    ),
  );
}

// -- two responses, token by token --------------------------------------------------------------

const sameToken = (a, b) => a.token === b.token && bytesOf(a).join() === bytesOf(b).join();
const chance = (score) => (score ? percent(probability(score.logprob)) : "");

function divergenceSide(name, id, mine, theirs) {
  const found = (mine.top_logprobs || []).find((alternative) => alternative.token === theirs.token);
  const other = found ? `; ${found.token === mine.token ? "its own choice" : "the other's token"} ${shown(theirs.token)} was among its alternatives at ${percent(probability(found.logprob))}` : `; the other's token ${shown(theirs.token)} is not among its alternatives`;
  return el(
    "div",
    { class: `side side-${name.toLowerCase()}` },
    el("h3", { text: `${name}: ${id}` }),
    el("p", { class: "choice" }, "chose ", el("span", { class: "what", text: shown(mine.token) }), " at ", el("span", { class: "p", text: percent(probability(mine.logprob)) }), el("span", { text: other })),
    el("div", { class: "alternatives" }, el("div", { class: "card-title", text: `${name}'s alternatives there` }), alternativesTable(mine, theirs.token)),
  );
}

async function showCompare(first, second) {
  const [a, b] = await Promise.all([stored(first), stored(second)]);
  const [pa, pb] = [a, b].map((response) => outputOf(response).painter);
  const [sa, sb] = [pa.scores, pb.scores];
  let same = 0;
  while (same < sa.length && same < sb.length && sameToken(sa[same], sb[same])) same++;
  const longest = Math.max(sa.length, sb.length);
  const diverge = same < longest ? same : null;
  let summary;
  if (!sa.length || !sb.length) summary = `${!sa.length ? "A" : "B"} has no scored tokens: made without include ${LOGPROBS}?`;
  else if (diverge === null) summary = `The two agree on all ${longest} tokens: they do not diverge.`;
  else if (diverge >= sa.length || diverge >= sb.length) summary = `The two agree on the first ${same} tokens; then ${diverge >= sa.length ? "A" : "B"} ends (A has ${sa.length} tokens, B ${sb.length}).`;
  else summary = `The two agree on the first ${same} tokens and diverge at token ${diverge + 1}.`;
  const children = [
    el("h1", { text: "Two responses, token by token" }),
    el("p", { class: "ids" }, "A ", el("a", { href: `/ui/responses/${encodeURIComponent(a.id)}`, text: a.id }), ", B ", el("a", { href: `/ui/responses/${encodeURIComponent(b.id)}`, text: b.id })),
    el("p", { id: "compare-summary", text: summary }),
  ];
  if (diverge !== null && diverge < sa.length && diverge < sb.length) {
    children.push(el("section", { id: "divergence" }, el("h2", { text: `Where they diverge: token ${diverge + 1}` }), el("div", { class: "sides" }, divergenceSide("A", a.id, sa[diverge], sb[diverge]), divergenceSide("B", b.id, sb[diverge], sa[diverge]))));
  }
  const rows = [el("tr", {}, ...["#", "A", "p(A)", "B", "p(B)"].map((name) => el("th", { text: name })))];
  for (let index = 0; index < longest; index++) {
    const kind = index < same ? "same" : index === diverge ? "diverge" : "after";
    const cell = (painter, scores) => {
      if (index >= scores.length) return el("td", { class: "none", text: "(ended)" });
      const span = tokenSpan(scores[index], index, painter.reasoningIndices.has(index) ? "reasoning" : "answer");
      span.textContent = shown(scores[index].token); // alone in its cell: blanks made visible
      return el("td", {}, span);
    };
    rows.push(el("tr", { class: kind, "data-index": String(index) }, el("td", { class: "position", text: String(index + 1) }), cell(pa, sa), el("td", { class: "p", text: chance(sa[index]) }), cell(pb, sb), el("td", { class: "p", text: chance(sb[index]) })));
  }
  children.push(el("h2", { text: "Aligned by position (the first difference highlighted)" }), el("table", { id: "aligned" }, ...rows));
  view.replaceChildren(...children);
  document.querySelector("#aligned tr.diverge")?.scrollIntoView({ block: "nearest" });
}

// -- the list ----------------------------------------------------------------------------------

function firstText(response) {
  for (const item of response.output || []) {
    for (const part of item.content || []) if (part.type === "output_text") return part.text;
  }
  return "";
}

// Newest first: by created_at (seconds), then as the API listed them, which orders responses
// of the same second itself; the pages read so far shown as one list.
function newestFirst(responses) {
  return responses.map((response, order) => ({ response, order })).sort((a, b) => b.response.created_at - a.response.created_at || a.order - b.order).map(({ response }) => response);
}

async function showList() {
  const listed = [];
  const picked = [];
  const body = el("tbody");
  const compare = el("button", { type: "button", id: "compare", disabled: "", text: "Compare the two picked" });
  compare.addEventListener("click", () => {
    if (picked.length === 2) window.location.assign(`/ui/compare/${encodeURIComponent(picked[0])}/${encodeURIComponent(picked[1])}`);
  });
  const pick = (id, box) => {
    const at = picked.indexOf(id);
    if (at >= 0) picked.splice(at, 1);
    if (box.checked) picked.push(id);
    while (picked.length > 2) {
      const dropped = picked.shift();
      const other = body.querySelector(`input[data-id="${CSS.escape(dropped)}"]`);
      if (other) other.checked = false;
    }
    if (picked.length === 2) compare.removeAttribute("disabled");
    else compare.setAttribute("disabled", "");
  };
  const more = el("button", { type: "button", text: "Older" });
  const render = () =>
    body.replaceChildren(
      ...newestFirst(listed).map((response) => {
        const box = el("input", { type: "checkbox", class: "pick", "data-id": response.id, "aria-label": `pick ${response.id} to compare` });
        box.checked = picked.includes(response.id);
        box.addEventListener("change", () => pick(response.id, box));
        return el(
          "tr",
          { "data-id": response.id },
          el("td", {}, box),
          el("td", {}, el("a", { href: `/ui/responses/${encodeURIComponent(response.id)}`, text: response.id })),
          el("td", { text: new Date(response.created_at * 1000).toLocaleString() }),
          el("td", { text: response.model }),
          el("td", { text: response.status }),
          el("td", { text: String(response.usage?.output_tokens ?? "-") }),
          el("td", { text: firstText(response).slice(0, 80) }),
        );
      }),
    );
  const read = async (after) => {
    const query = new URLSearchParams({ limit: "20" });
    if (after) query.set("after", after);
    const page = await (await api(`/v1/responses?${query}`)).json();
    listed.push(...page.data);
    render();
    more.hidden = !page.has_more;
    return page;
  };
  let page = await read(null);
  more.addEventListener("click", async () => {
    try {
      page = await read(page.last_id);
    } catch (error) {
      failed(error);
    }
  });
  if (!listed.length) {
    view.replaceChildren(el("h1", { text: "Recent responses" }), el("p", { class: "note", text: "No stored responses for this key yet." }));
    return;
  }
  const head = el("tr", {}, ...["pick", "id", "created", "model", "status", "output tokens", "answer"].map((name) => el("th", { text: name })));
  view.replaceChildren(
    el("h1", { text: "Recent responses" }),
    el("p", { class: "note", text: "Pick two answers to the same input to compare them token by token." }),
    el("table", { id: "responses" }, el("thead", {}, head), body),
    el("div", { class: "actions" }, compare, more),
  );
}

// -- live --------------------------------------------------------------------------------------

async function listModels(input, choices, note) {
  try {
    const models = (await (await api("/v1/models")).json()).data || [];
    choices.replaceChildren(...models.map((model) => el("option", { value: String(model.id) })));
    const ids = models.map((model) => String(model.id));
    if (ids.length && input.value === "default" && !ids.includes("default")) input.value = ids[0];
    note.textContent = ids.length ? `${ids.length} model${ids.length === 1 ? "" : "s"} listed by /v1/models` : "";
  } catch (error) {
    note.textContent = `no list of models: ${error.message}`;
  }
}

function liveForm() {
  const model = el("input", { name: "model", required: "", value: "default", list: "models", autocomplete: "off" });
  const choices = el("datalist", { id: "models" });
  const note = el("span", { class: "hint", id: "models-note" });
  const form = el(
    "form",
    { class: "live", id: "live-form" },
    el("label", { text: "model" }, model, choices, note),
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
  const output = el("div", { id: "live-output" });
  const below = el("div", { id: "live-after" });
  view.replaceChildren(el("h1", { text: "Live: a new response, painted as it streams" }), form, legend(), output, status, below);
  listModels(model, choices, note);
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
  const output = document.getElementById("live-output");
  const status = document.getElementById("live-status");
  const below = document.getElementById("live-after");
  const tokens = el("div", { class: "tokens answer", id: "live-tokens" });
  const answerKind = el("span", { class: "kind", text: "answer" });
  const answer = el("div", { class: "block" }, answerKind, tokens);
  output.replaceChildren(answer);
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
  const painter = new Painter(tokens);
  const reasoning = new Map(); // item id -> its block
  const received = new Map(); // output_text part -> how many of its scores are painted
  const take = (part, scores, whole) => {
    const had = received.get(part) || 0;
    // A delta's scores are new; a done's list is the part's whole list (rule 3.7), of which
    // the deltas brought a prefix: what rode on no delta (the last token's, say) is the rest.
    const fresh = whole ? scores.slice(had) : scores;
    received.set(part, had + fresh.length);
    painter.add(fresh);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer.text += decoder.decode(value, { stream: true });
    for (const event of sseEvents(buffer)) {
      const part = `${event.item_id}:${event.content_index}`;
      if (event.type === "response.output_item.added" && event.item?.type === "reasoning") {
        const block = painter.reasoning();
        reasoning.set(event.item.id, block);
        output.insertBefore(block.node, answer);
      } else if (event.type === "response.reasoning_text.delta" || event.type === "response.reasoning_summary_text.delta") {
        reasoning.get(event.item_id)?.append(event.delta);
      } else if (event.type === "response.output_item.done" && (event.item?.type === "function_call" || event.item?.type === "custom_tool_call")) {
        output.insertBefore(toolCall(event.item), answer);
      } else if (event.type === "response.output_text.delta") {
        take(part, event.logprobs || [], false);
      } else if (event.type === "response.output_text.done") {
        take(part, event.logprobs || [], true);
      } else if (event.type === "error") {
        status.replaceChildren(el("p", { class: "error", text: event.message || "the stream failed" }));
      } else if (event.type === "response.completed" || event.type === "response.incomplete" || event.type === "response.failed") {
        const made = event.response;
        // The final response holds every score (rule 3.7): any still unpainted are added.
        const all = (made.output || []).filter((item) => item.type === "message").flatMap((item) => (item.content || []).filter((c) => c.type === "output_text").flatMap((c) => c.logprobs || []));
        if (all.length > painter.scores.length) painter.add(all.slice(painter.scores.length));
        painter.finish();
        const text = (made.output || []).filter((item) => item.type === "message").flatMap((item) => (item.content || []).map((c) => c.text || "")).join("");
        if (!text && painter.answerIndices.length) answerKind.textContent = "scored tokens outside the answer's text (tool calls)";
        const link = made.store ? el("a", { href: `/ui/responses/${encodeURIComponent(made.id)}`, text: "open the stored response" }) : "";
        const counted = made.usage?.output_tokens;
        const usage = counted == null ? "" : ` of the ${counted} output tokens the usage counts`;
        status.replaceChildren(el("p", { class: "note", id: "live-done", text: `${made.status}: ${painter.scores.length} scored tokens${usage}, perplexity ${perplexity(painter.scores)?.toFixed(3) ?? "-"}. ` }, link));
        below.replaceChildren(chart(painter.scores, painter.reasoningIndices), leastLikely(painter.scores, painter.answerIndices), meta(made, painter));
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
  const two = path.match(/^\/ui\/compare\/([^/]+)\/([^/]+)$/);
  if (two) return showCompare(decodeURIComponent(two[1]), decodeURIComponent(two[2]));
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
