"""The token-score viewer (design.md 13) in a real headless Chromium, against the real proxy
and the fake upstream: a live answer painted token by token with its scores, the alternatives
on hover, a stored response with its perplexity, the list, the API key, and tokens that look
like markup shown as text. The browser is driven from a thread: the proxy runs on this loop."""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from proxy.config import parse
from tests.browser import chromium, needs_chromium
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.mcp_servers import ToolServer

WORDS = ["Hello", " world", " <script>window.pwned=1</script>", ' <img src=x onerror="window.pwned=2">', "!"]
LOGPROBS = [-0.05, -0.7, -1.6, -2.3, -0.01]
ANSWER = Generation(
    [Step("reasoning", "The user wants a greeting."), *(Step("text", w, [score(w, lp, top=3)]) for w, lp in zip(WORDS, LOGPROBS, strict=True)), Step("finish", finish_reason="stop")]
)
# The documentation's pictures (`make screenshots`) are taken here, from a realistic answer.
SHOTS = os.environ.get("SCREENSHOTS")


def viewer_config(upstream: FakeUpstream, tmp_path: Path, **top: Any) -> Any:
    return parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": {"url": f"sqlite:{tmp_path}/r.db"}, "ui": True, **top})


def _shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / name))


def _wait(driver: Any, css: str, timeout: float = 10) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))
    return driver.find_elements(By.CSS_SELECTOR, css)


@needs_chromium
async def test_a_live_answer_is_painted_token_by_token_with_its_scores(upstream: FakeUpstream, start_proxy, tmp_path: Path) -> None:
    url = await start_proxy(viewer_config(upstream, tmp_path))
    upstream.script(Reply(ANSWER, delay=0.05))

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        with chromium() as driver:
            driver.get(f"{url}/ui/live")
            _wait(driver, "#live-form textarea")[0].send_keys("Say hello.")
            driver.find_element(By.CSS_SELECTOR, "#live-form button").click()
            done = _wait(driver, "#live-done")[0].text
            tokens = driver.find_elements(By.CSS_SELECTOR, "#live-tokens .token")
            ActionChains(driver).move_to_element(tokens[1]).perform()
            tooltip = driver.find_element(By.ID, "alternatives")
            return {
                "texts": [token.get_attribute("textContent") for token in tokens],
                "logprobs": [float(token.get_attribute("data-logprob")) for token in tokens],
                "colours": {token.value_of_css_property("background-color") for token in tokens},
                "tooltip": tooltip.text if tooltip.is_displayed() else None,
                "done": done,
                "pwned": driver.execute_script("return window.pwned === undefined ? null : window.pwned"),
                "markup": len(driver.find_elements(By.CSS_SELECTOR, "#live-tokens script, #live-tokens img")),
            }

    seen = await asyncio.to_thread(drive)
    assert seen["texts"] == WORDS  # N tokens, painted as their deltas came, each with its score
    assert seen["logprobs"] == LOGPROBS
    assert len(seen["colours"]) == len(WORDS)  # shaded by probability: five scores, five shades
    assert seen["tooltip"] is not None and "␣world 49.7%" in seen["tooltip"] and "␣world#1 18.3%" in seen["tooltip"]  # exp(-0.7), exp(-1.7)
    assert seen["pwned"] is None and seen["markup"] == 0  # the tokens that look like markup are text
    assert seen["done"].startswith(f"completed: {len(WORDS)} scored tokens of the {len(WORDS)} output tokens the usage counts")
    assert "upstream" not in seen["done"]
    asked = upstream.requests[-1]
    assert asked["logprobs"] is True and asked["top_logprobs"] == 5 and asked["temperature"] == 1


@needs_chromium
async def test_a_stored_response_its_perplexity_and_the_list(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(viewer_config(upstream, tmp_path, auth={"api_keys": ["sk-viewer"]}))
    upstream.script(Reply(ANSWER))
    headers = {"Authorization": "Bearer sk-viewer"}
    body = {"model": "qwen3", "input": "Say hello.", "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    async with http.post(f"{url}/v1/responses", json=body, headers=headers) as made:
        response_id = (await made.json())["id"]

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.by import By

        with chromium() as driver:
            driver.get(f"{url}/ui/")
            refused = _wait(driver, ".error")[0].text  # no key yet: the API's 401, shown
            driver.find_element(By.ID, "key").send_keys("sk-viewer")
            driver.find_element(By.CSS_SELECTOR, "#key-form button").click()
            _wait(driver, "table a")[0].click()
            _wait(driver, ".tokens .token")
            return {
                "refused": refused,
                "path": driver.execute_script("return location.pathname"),
                "tokens": len(driver.find_elements(By.CSS_SELECTOR, ".tokens .token")),
                "perplexity": driver.find_element(By.ID, "meta-perplexity").text,
                "reasoning": driver.find_element(By.CSS_SELECTOR, ".unscored.reasoning").text,
                "bars": len(driver.find_elements(By.CSS_SELECTOR, ".chart rect")),
                "key_kept": driver.execute_script("return sessionStorage.length === 1 && localStorage.length === 0"),
            }

    seen = await asyncio.to_thread(drive)
    assert "API key" in seen["refused"]
    assert seen["path"] == f"/ui/responses/{response_id}"
    assert seen["tokens"] == seen["bars"] == len(WORDS)
    assert seen["perplexity"] == f"{math.exp(-sum(LOGPROBS) / len(LOGPROBS)):.3f}"
    assert seen["reasoning"] == "The user wants a greeting."
    assert seen["key_kept"] is True  # in the tab only


async def test_the_page_is_off_by_default_and_served_with_a_strict_policy(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    off = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}]}))
    async with http.get(f"{off}/ui/") as response:
        assert response.status == 404
    on = await start_proxy(viewer_config(upstream, tmp_path))
    for path, kind in (("/ui/", "text/html"), ("/ui/responses/resp_1", "text/html"), ("/ui/compare/resp_1/resp_2", "text/html"), ("/ui/static/viewer.js", "text/javascript"), ("/ui/static/viewer.css", "text/css")):
        async with http.get(f"{on}{path}") as response:
            assert response.status == 200 and response.content_type == kind
            policy = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    for escape in ("%2e%2e%2fconfig.py", "..%2Fconfig.py", "index.html"):  # only the page's own files
        async with http.get(URL(f"{on}/ui/static/{escape}", encoded=True)) as response:
            assert response.status == 404, escape


# -- what the page shows of scores: the last score, reasoning's, the plot, special tokens ----------

END = "<|im_end|>"  # its score comes with the finish chunk: on `output_text.done` only (rule 3.7)


def _texts(driver: Any, css: str) -> list[str]:
    """What the matches show, read at one instant (the page may be repainting)."""
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map((node) => node.textContent)", css)


def _text(driver: Any, css: str) -> str | None:
    """The first match's text; None when the page shows none."""
    texts = _texts(driver, css)
    return texts[0] if texts else None


def _shown_within(driver: Any, css: str, timeout: float = 5) -> list[Any]:
    """The elements once the page shows them; none if it has not within `timeout`."""
    from selenium.common.exceptions import TimeoutException

    try:
        return _wait(driver, css, timeout)
    except TimeoutException:
        return []


def _live(driver: Any, url: str, prompt: str = "Say it.") -> str:
    """Generate on the live page; the status line once the stream ended."""
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/ui/live")
    _wait(driver, "#live-form textarea")[0].send_keys(prompt)
    driver.find_element(By.CSS_SELECTOR, "#live-form button").click()
    return _wait(driver, "#live-done")[0].get_attribute("textContent")


def _scored(token: str, logprob: float, *others: tuple[str, float]) -> dict[str, Any]:
    """A chat score whose alternatives are named (the fake's `score` makes up its own)."""

    def entry(tok: str, lp: float) -> dict[str, Any]:
        return {"token": tok, "logprob": lp, "bytes": list(tok.encode())}

    return {**entry(token, logprob), "top_logprobs": [entry(token, logprob), *(entry(t, lp) for t, lp in others)]}


async def _store(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> str:
    body = {"model": "qwen3", "input": "The capital of France?", "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    async with http.post(f"{url}/v1/responses", json=body, headers=headers or {}) as made:
        assert made.status == 200, await made.text()
        return (await made.json())["id"]


SAID = ["The", " capital", " of", " France", " is", " Paris", "."]
SAID_LOGPROBS = [-0.9, -0.2, -0.05, -0.6, -0.3, -1.1, -0.4]


@needs_chromium
async def test_the_live_page_ends_with_the_stored_tokens_and_perplexity(upstream: FakeUpstream, start_proxy, tmp_path: Path) -> None:
    """Rule 3.7: the end-of-sequence token's score rides on `output_text.done` alone; the live
    page paints it too, and its counts say what they count."""
    url = await start_proxy(viewer_config(upstream, tmp_path))
    steps = [Step("text", w, [score(w, lp, top=3)]) for w, lp in zip(SAID, SAID_LOGPROBS, strict=True)]
    upstream.script(Reply(Generation([*steps, Step("finish", scores=[score(END, -0.02, top=3)], finish_reason="stop")]), delay=0.03))

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.by import By

        with chromium() as driver:
            done = _live(driver, url)
            live = {
                "tokens": _texts(driver, "#live-tokens .token"),
                "perplexity": _text(driver, "#live-after #meta-perplexity"),
                "scored": _text(driver, "#live-after #meta-scored-tokens"),
                "output": _text(driver, "#live-after #meta-output-tokens"),
                "bars": len(driver.find_elements(By.CSS_SELECTOR, "#live-after .chart rect")),
            }
            driver.find_element(By.CSS_SELECTOR, "#live-done a").click()
            _wait(driver, ".tokens .token")
            stored = {"tokens": _texts(driver, ".tokens .token"), "perplexity": _text(driver, "#meta-perplexity")}
            return {"done": done, "live": live, "stored": stored}

    seen = await asyncio.to_thread(drive)
    every = [*SAID_LOGPROBS, -0.02]
    expected = f"{math.exp(-sum(every) / len(every)):.3f}"
    assert expected != f"{math.exp(-sum(SAID_LOGPROBS) / len(SAID_LOGPROBS)):.3f}"  # the last score moves it
    assert seen["live"]["tokens"] == seen["stored"]["tokens"] == [*SAID, END]
    assert seen["live"]["perplexity"] == seen["stored"]["perplexity"] == expected
    assert seen["live"]["bars"] == len(every)
    # One count of scored tokens, named, beside the usage's count, named: they agree.
    assert seen["done"].startswith(f"completed: 8 scored tokens of the 8 output tokens the usage counts, perplexity {expected}.")
    assert seen["live"]["scored"] == seen["live"]["output"] == "8"


THOUGHT = ["<think>", "\n", "Let", " me", " think", ".", "\n", "</think>"]  # spells "Let me think."
ANSWERED = ["\n\n", "Paris", ".", END]


@needs_chromium
async def test_reasoning_tokens_are_painted_once_scored_in_the_reasoning(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Rule 3.8: reasoning's scores come first on the message's output_text. The page paints
    those that spell the reasoning (with the control tokens and blanks around it) in the
    reasoning, scored, and the rest under the answer, live and stored alike."""
    url = await start_proxy(viewer_config(upstream, tmp_path))

    def generation() -> Generation:
        return Generation(
            [
                Step("reasoning", "Let me", [score(t, -0.1 * (i + 1)) for i, t in enumerate(THOUGHT[:4])]),
                Step("reasoning", " think.", [score(t, -0.15) for t in THOUGHT[4:]]),
                Step("text", "Paris", [score("\n\n", -0.05), score("Paris", -0.7)]),
                Step("text", ".", [score(".", -0.2)]),
                Step("finish", scores=[score(END, -0.01)], finish_reason="stop"),
            ],
            reasoning_tokens=len(THOUGHT),
        )

    upstream.script(Reply(generation()))

    def shown(driver: Any) -> dict[str, Any]:
        return {
            "kinds": _texts(driver, "#view .kind"),
            "reasoning": _texts(driver, ".tokens.reasoning .token"),
            "answer": _texts(driver, ".tokens:not(.reasoning) .token"),
            "unscored": len(driver.find_elements("css selector", ".unscored.reasoning")),
            "scored_reasoning": _text(driver, "#meta-scored-reasoning"),
            "token_classes": {t: c for t, c in zip(_texts(driver, ".token"), [n.get_attribute("class") for n in driver.find_elements("css selector", ".token")], strict=True)},
        }

    def drive(stored_id: str) -> dict[str, Any]:
        with chromium() as driver:
            _live(driver, url, "The capital of France?")
            live = shown(driver)
            driver.get(f"{url}/ui/responses/{stored_id}")
            _wait(driver, ".tokens .token")
            return {"live": live, "stored": shown(driver)}

    stored_id = await _store(http, url)  # the same generation, stored; then streamed live
    upstream.script(Reply(generation(), delay=0.03))
    seen = await asyncio.to_thread(drive, stored_id)
    for where in ("live", "stored"):
        page = seen[where]
        assert page["answer"] == ANSWERED, where  # the reasoning's tokens are not painted again here
        assert page["reasoning"] == THOUGHT, where  # but in the reasoning, scored
        assert page["kinds"] == ["reasoning", "answer"], where  # not "reasoning (not scored)"
        assert page["unscored"] == 0, where
        assert page["scored_reasoning"] == str(len(THOUGHT)), where
        assert "reasoning" in page["token_classes"]["Let"] and "answer" in page["token_classes"]["Paris"], where


def _stored_reasoning(driver: Any, url: str, response_id: str) -> dict[str, Any]:
    """A stored response's page: its strips' kinds, the reasoning's tokens, the answer's."""
    driver.get(f"{url}/ui/responses/{response_id}")
    _wait(driver, ".tokens .token")
    return {
        "kinds": _texts(driver, "#view .kind"),
        "reasoning": _texts(driver, ".tokens.reasoning .token"),
        "answer": _texts(driver, ".tokens.answer .token"),
    }


EDGES = ["<think>", " Let", " me", " think", ".\n", "</think>"]  # blanks the text "Let me think." leaves out


@needs_chromium
async def test_reasoning_whose_tokens_straddle_its_texts_edges_stays_out_of_the_answers_strip(
    upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A tokenizer's token may hold a blank the reasoning's text leaves out (" Let" where it begins
    "Let", ".\n" where it ends "."): those tokens spell the reasoning still, and the answer's
    strip holds the answer's tokens alone (design.md 13.1), live and stored."""
    url = await start_proxy(viewer_config(upstream, tmp_path))

    def generation() -> Generation:
        return Generation(
            [
                Step("reasoning", "Let me think.", [score(t, -0.2) for t in EDGES]),
                Step("text", "Paris", [score("\n\n", -0.05), score("Paris", -0.7)]),
                Step("text", ".", [score(".", -0.2)]),
                Step("finish", scores=[score(END, -0.01)], finish_reason="stop"),
            ],
            reasoning_tokens=len(EDGES),
        )

    upstream.script(Reply(generation()))
    stored_id = await _store(http, url)
    upstream.script(Reply(generation(), delay=0.03))

    def drive() -> dict[str, Any]:
        with chromium() as driver:
            _live(driver, url, "The capital of France?")
            live = {"reasoning": _texts(driver, "#live-output .tokens.reasoning .token"), "answer": _texts(driver, "#live-tokens .token")}
            return {"live": live, "stored": _stored_reasoning(driver, url, stored_id)}

    seen = await asyncio.to_thread(drive)
    for where in ("live", "stored"):
        assert seen[where]["answer"] == ANSWERED, where  # "Let me think." is not under the answer
        assert seen[where]["reasoning"] == EDGES, where
    assert seen["stored"]["kinds"] == ["reasoning", "answer"]


@needs_chromium
async def test_a_later_rounds_reasoning_is_painted_in_its_own_strip(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A Response of two rounds (an MCP call between them): the second round's reasoning comes
    after the first round's tool-call tokens, and its scores are painted in its own reasoning,
    not under the answer (design.md 13.1)."""
    url = await start_proxy(viewer_config(upstream, tmp_path, mcp={"allowed_servers": [tool_server.url]}))
    first = ["<think>", "\n", "Add", " them", ".", "\n", "</think>"]
    call = '{"a": 2, "b": 3}'
    upstream.script(
        Reply(
            Generation(
                [
                    Step("reasoning", "Add them.", [score(t, -0.3) for t in first]),
                    Step("tool", call, [score(call, -0.4)], tool_id="call_1", tool_name="calc__add"),
                    Step("finish", finish_reason="tool_calls"),
                ]
            )
        ),
        Reply(
            Generation(
                [
                    Step("reasoning", "Let me think.", [score(t, -0.1) for t in THOUGHT]),
                    Step("text", "Paris", [score("\n\n", -0.05), score("Paris", -0.7)]),
                    Step("text", ".", [score(".", -0.2)]),
                    Step("finish", scores=[score(END, -0.01)], finish_reason="stop"),
                ]
            )
        ),
    )
    tools = [{"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never"}]
    body = {"model": "qwen3", "input": "2 + 3, then the capital of France?", "tools": tools, "include": ["message.output_text.logprobs"]}
    async with http.post(f"{url}/v1/responses", json=body) as made:
        response = await made.json()
    assert [item["type"] for item in response["output"]] == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "message"], response

    seen = await asyncio.to_thread(lambda: _run(lambda driver: _stored_reasoning(driver, url, response["id"])))
    assert seen["reasoning"] == [*first, *THOUGHT]  # each round's reasoning, scored, in its own strip
    assert seen["answer"] == [call, *ANSWERED]  # the call's token (no text of its own) and the answer's
    assert seen["kinds"] == ["reasoning", "reasoning", "answer"]


def _run(view: Any) -> Any:
    with chromium() as driver:
        return view(driver)


@needs_chromium
async def test_the_plot_has_axes_the_legend_numbers_special_tokens_stand_out_and_the_card_covers_nothing(
    upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    url = await start_proxy(viewer_config(upstream, tmp_path))
    words = [" sky", " is", " blue", ".", END]
    logprobs = [-0.1, -2.3, -0.7, -0.05, -0.02]
    steps = [Step("text", w, [score(w, lp, top=4)]) for w, lp in zip(words[:-1], logprobs, strict=False)]
    upstream.script(Reply(Generation([Step("reasoning", "Colours."), *steps, Step("finish", scores=[score(END, -0.02, top=4)], finish_reason="stop")])))
    response_id = await _store(http, url)

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        covers = """
            const card = document.getElementById("alternatives");
            const box = card.getBoundingClientRect(), token = arguments[0].getBoundingClientRect();
            const hit = (a, b) => a.left < b.right && a.right > b.left && a.top < b.bottom && a.bottom > b.top;
            const headings = [...document.querySelectorAll("h1, h2, .kind")].filter((n) => !card.contains(n));
            return {token: hit(box, token), headings: headings.filter((n) => hit(box, n.getBoundingClientRect())).map((n) => n.textContent)};
        """
        with chromium() as driver:
            driver.get(f"{url}/ui/responses/{response_id}")
            _wait(driver, ".tokens .token")
            tokens = driver.find_elements(By.CSS_SELECTOR, ".tokens:not(.reasoning) .token")
            cards = []
            for token in tokens:
                ActionChains(driver).move_to_element(token).perform()
                card = driver.find_element(By.ID, "alternatives")
                cards.append({"shown": card.is_displayed(), "title": _text(driver, "#alternatives .card-title"), **driver.execute_script(covers, token)})
            special, plain = tokens[-1], tokens[0]
            return {
                "yticks": _texts(driver, ".chart text.ytick"),
                "ytitle": _text(driver, ".chart text.ytitle"),
                "xlabels": _texts(driver, ".chart .xlabel text"),
                "xtitles": _texts(driver, ".chart .xlabel title"),
                "bar_titles": _texts(driver, ".chart rect.bar title"),
                "legend": _texts(driver, ".legend .swatch"),
                "special": {
                    "text": special.get_attribute("textContent"),
                    "title": special.get_dom_attribute("title"),
                    "border": special.value_of_css_property("border-top-style"),
                },
                "plain": {"title": plain.get_dom_attribute("title"), "border": plain.value_of_css_property("border-top-style"), "special": len(driver.find_elements(By.CSS_SELECTOR, ".token.special"))},
                "cards": cards,
            }

    seen = await asyncio.to_thread(drive)
    assert seen["yticks"] == ["0", "-1", "-2", "-3", "-4", "-5"]  # the deepest, -2.3, within -5
    assert seen["ytitle"] == "log p"
    assert seen["xlabels"] == ["\u2423sky", "\u2423is", "\u2423blue", ".", END]  # each bar's token below it
    assert seen["xtitles"][1] == "token 2: \u2423is"
    assert seen["bar_titles"][1] == "token 2: \u2423is  -2.300 (10.0%)"
    assert seen["legend"] == ["5%", "25%", "50%", "75%", "95%"]
    assert seen["special"] == {"text": END, "title": "special token", "border": "dashed"}
    assert seen["plain"] == {"title": None, "border": "none", "special": 1}
    for index, card in enumerate(seen["cards"]):
        assert card["shown"] and card["title"].startswith(f"token {index + 1}"), card
        assert not card["token"] and not card["headings"], card  # never over the token or a heading
    assert seen["cards"][-1]["title"] == f"token {len(words)} \u00b7 special token"


@needs_chromium
async def test_the_live_model_field_lists_the_models_with_the_key(upstream: FakeUpstream, start_proxy, tmp_path: Path) -> None:
    url = await start_proxy(viewer_config(upstream, tmp_path, auth={"api_keys": ["sk-viewer"]}))

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.by import By

        with chromium() as driver:
            driver.get(f"{url}/ui/live")
            refused = [note.get_attribute("textContent") for note in _shown_within(driver, "#models-note:not(:empty)")]
            driver.find_element(By.ID, "key").send_keys("sk-viewer")
            driver.find_element(By.CSS_SELECTOR, "#key-form button").click()
            options = _shown_within(driver, "#models option")
            model = driver.find_element(By.CSS_SELECTOR, "#live-form input[name=model]")
            return {
                "refused": refused,
                "options": [option.get_attribute("value") for option in options],
                "list": model.get_attribute("list"),
                "value": model.get_attribute("value"),
            }

    seen = await asyncio.to_thread(drive)
    assert seen["options"] == ["fake-model"]  # the upstream's list, read with the key
    assert len(seen["refused"]) == 1 and "API key" in seen["refused"][0]  # /v1/models without the key: the API's 401
    assert seen["list"] == "models" and seen["value"] == "fake-model"


@needs_chromium
async def test_two_responses_picked_from_the_list_compare_token_by_token(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(viewer_config(upstream, tmp_path))
    first = [_scored("The", -0.1), _scored(" capital", -0.2), _scored(" is", -0.05), _scored(" Paris", -0.5, (" Lyon", -1.6), (" Nice", -3.0)), _scored(".", -0.01)]
    second = [*first[:3], _scored(" Lyon", -1.6, (" Paris", -0.5), (" Nice", -3.0)), _scored(".", -0.3), _scored(" Or", -2.0)]
    for scores in (first, second, first):
        upstream.script(Reply(Generation([Step("text", s["token"], [s]) for s in scores] + [Step("finish", finish_reason="stop")])))
    a, b, c = [await _store(http, url) for _ in range(3)]  # within a second or so: created_at ties
    async with http.get(f"{url}/v1/responses") as listed:
        api_order = [response["id"] for response in (await listed.json())["data"]]

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.by import By

        with chromium() as driver:
            driver.get(f"{url}/ui/")
            rows = _wait(driver, "#responses tbody tr")
            order = [row.get_attribute("data-id") for row in rows]
            disabled = driver.find_element(By.ID, "compare").get_attribute("disabled")
            for id in (a, b):
                driver.find_element(By.CSS_SELECTOR, f"input.pick[data-id='{id}']").click()
            driver.find_element(By.ID, "compare").click()
            _wait(driver, "#aligned tr.diverge")
            rows = driver.find_elements(By.CSS_SELECTOR, "#aligned tr[data-index]")
            return {
                "order": order,
                "disabled": disabled,
                "path": driver.execute_script("return location.pathname"),
                "summary": _text(driver, "#compare-summary"),
                "kinds": [row.get_attribute("class") for row in rows],
                "diverge": [cell.get_attribute("textContent") for cell in driver.find_elements(By.CSS_SELECTOR, "#aligned tr.diverge td")],
                "background": driver.find_element(By.CSS_SELECTOR, "#aligned tr.diverge td").value_of_css_property("background-color"),
                "same_background": driver.find_element(By.CSS_SELECTOR, "#aligned tr.same td").value_of_css_property("background-color"),
                "a_choice": _text(driver, "#divergence .side-a .choice"),
                "b_choice": _text(driver, "#divergence .side-b .choice"),
                "a_other": _texts(driver, "#divergence .side-a tr.other td"),
                "b_alternatives": _texts(driver, "#divergence .side-b tr td:first-child"),
            }

    seen = await asyncio.to_thread(drive)
    assert seen["order"] == api_order and set(api_order) == {a, b, c}  # as the API lists them
    assert seen["disabled"] is not None  # until two are picked
    assert seen["path"] == f"/ui/compare/{a}/{b}"
    assert seen["summary"] == "The two agree on the first 3 tokens and diverge at token 4."
    assert seen["kinds"] == ["same", "same", "same", "diverge", "after", "after"]
    assert seen["diverge"] == ["4", "\u2423Paris", "60.7%", "\u2423Lyon", "20.2%"]  # each one's token and probability there
    assert seen["background"] != seen["same_background"]  # highlighted
    assert seen["a_choice"].startswith("chose \u2423Paris at 60.7%; the other's token \u2423Lyon was among its alternatives at 20.2%")
    assert seen["a_other"] == ["\u2423Lyon", "20.2%", "-1.600"]  # the other's choice, marked among A's alternatives
    assert seen["b_choice"].startswith("chose \u2423Lyon at 20.2%")
    assert seen["b_alternatives"] == ["\u2423Lyon", "\u2423Paris", "\u2423Nice"]


@needs_chromium
async def test_the_least_likely_tokens_are_listed_and_lead_to_their_tokens(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(viewer_config(upstream, tmp_path))
    words = [f"line {i}\n" for i in range(60)]  # a token a line: a tall answer
    logprobs = [-((i * 37) % 60) / 10 for i in range(60)]  # sixty distinct depths
    upstream.script(Reply(Generation([Step("text", w, [score(w, lp)]) for w, lp in zip(words, logprobs, strict=True)] + [Step("finish", finish_reason="stop")])))
    response_id = await _store(http, url)
    lowest = sorted(range(60), key=lambda i: logprobs[i])[:10]
    rank = next(k for k, i in enumerate(lowest) if i < 20)  # one near the top, out of view at the list

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.by import By

        in_view = "const r = arguments[0].getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight;"
        with chromium() as driver:
            driver.get(f"{url}/ui/responses/{response_id}")
            entries = _wait(driver, "#least-likely li button")
            token = driver.find_element(By.CSS_SELECTOR, f".token[data-index='{lowest[rank]}']")
            driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            before = driver.execute_script(in_view, token)
            entries[rank].click()
            return {
                "entries": [entry.get_attribute("textContent") for entry in entries],
                "before": before,
                "after": driver.execute_script(in_view, token),
                "focused": driver.execute_script("return document.activeElement.dataset.index"),
                "card": _text(driver, "#alternatives .card-title") if driver.find_element(By.ID, "alternatives").is_displayed() else None,
            }

    seen = await asyncio.to_thread(drive)

    def entry(i: int) -> str:
        p = math.exp(logprobs[i])
        return f"token {i + 1} line\u2423{i}\u23ce {100 * p:.{1 if p >= 0.1 else 2}f}%"

    assert seen["entries"] == [entry(i) for i in lowest]  # the ten least likely, lowest first, with positions
    assert seen["before"] is False and seen["after"] is True  # a click scrolls to the token
    assert seen["focused"] == str(lowest[rank]) and seen["card"] == f"token {lowest[rank] + 1}"


@needs_chromium
async def test_the_list_keeps_the_apis_order_across_its_pages(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Responses of the same second (created_at is in seconds) stay in the order the API gave
    them, newest first; an older page is added below, not in place of, the first."""
    url = await start_proxy(viewer_config(upstream, tmp_path))
    upstream.script(Reply(Generation([Step("text", "Hi", [score("Hi")]), Step("finish", finish_reason="stop")])))
    made = [await _store(http, url) for _ in range(23)]
    async with http.get(f"{url}/v1/responses?limit=20") as first:
        first_page = (await first.json())["data"]
    api_order = [r["id"] for r in first_page]
    async with http.get(f"{url}/v1/responses?limit=20&after={api_order[-1]}") as second:
        api_order += [r["id"] for r in (await second.json())["data"]]
    times = {r["created_at"] for r in first_page}

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        with chromium() as driver:
            driver.get(f"{url}/ui/")
            _wait(driver, "table td a")
            first = _texts(driver, "table td a")
            driver.find_element(By.XPATH, "//button[text()='Older']").click()
            WebDriverWait(driver, 10).until(lambda d: _texts(d, "table td a") != first)
            return {"first": first, "all": _texts(driver, "table td a")}

    seen = await asyncio.to_thread(drive)
    assert len(times) < len(first_page)  # some share a second: their order is the API's alone
    assert seen["first"] == api_order[:20]
    assert seen["all"] == api_order and sorted(api_order) == sorted(made)  # both pages, in the API's order


# A realistic answer for the documentation's pictures: a reasoning, then an answer, each token
# with the alternatives a model weighed.
PICTURED_THOUGHT = [
    _scored("The", -0.02, ("So", -4.1)),
    _scored(" user", -0.01, (" question", -5.2)),
    _scored(" asks", -0.3, (" wants", -1.4), (" is", -3.0)),
    _scored(" for", -0.05),
    _scored(" France", -0.4, (" the", -1.2)),
    _scored("'s", -0.02),
    _scored(" capital", -0.01),
    _scored(".", -0.6, (":", -1.0), (",", -2.9)),
]
PICTURED_ANSWER = [
    _scored("The", -0.25, ("Paris", -1.6), ("France", -3.3)),
    _scored(" capital", -0.02),
    _scored(" of", -0.01),
    _scored(" France", -0.03),
    _scored(" is", -0.05, (" has", -4.0)),
    _scored(" Paris", -0.01, (" **", -4.9), (" the", -6.2)),
    _scored(",", -1.3, (".", -0.35), (" —", -3.4)),
    _scored(" on", -0.9, (" which", -1.1), (" a", -2.0)),
    _scored(" the", -0.02),
    _scored(" Seine", -0.04),
    _scored(".", -0.01),
]
REALISTIC = Generation(
    [
        *(Step("reasoning", entry["token"], [entry]) for entry in PICTURED_THOUGHT),
        *(Step("text", entry["token"], [entry]) for entry in PICTURED_ANSWER),
        Step("finish", finish_reason="stop"),
    ]
)


@needs_chromium
async def test_the_documentations_pictures(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """The pictures the quick start and the viewer's guide show: a live answer with a token's
    alternatives, and the stored response with its reasoning, plot and perplexity. Taken on
    every run (into `SCREENSHOTS` where it is set: `make screenshots` keeps docs/images current),
    so a picture shows what the viewer shows today."""
    url = await start_proxy(viewer_config(upstream, tmp_path))
    upstream.script(Reply(REALISTIC, delay=0.02))
    shots = Path(SHOTS) if SHOTS else tmp_path / "shots"
    shots.mkdir(parents=True, exist_ok=True)

    def drive() -> dict[str, Any]:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        with chromium() as driver:
            driver.get(f"{url}/ui/live")
            _wait(driver, "#live-form textarea")[0].send_keys("What is the capital of France?")
            driver.find_element(By.CSS_SELECTOR, "#live-form button").click()
            _wait(driver, "#live-done")
            answer = driver.find_elements(By.CSS_SELECTOR, "#live-tokens .token")
            comma = next(token for token in answer if token.get_attribute("textContent") == ",")
            ActionChains(driver).move_to_element(comma).perform()
            tooltip = driver.find_element(By.ID, "alternatives").text
            driver.save_screenshot(str(shots / "viewer-live.png"))
            driver.get(f"{url}/ui/")
            _wait(driver, "table a")[0].click()
            _wait(driver, ".tokens .token")
            _wait(driver, ".chart rect")
            driver.save_screenshot(str(shots / "viewer-response.png"))
            return {"tooltip": tooltip, "kinds": _texts(driver, "#view .kind"), "strips": _texts(driver, ".tokens")}

    seen = await asyncio.to_thread(drive)
    assert "." in seen["tooltip"] and "70.5%" in seen["tooltip"]  # exp(-0.35): the alternative the model passed over
    assert len(seen["kinds"]) == 2, seen["kinds"]  # the reasoning's strip and the answer's
    thought, said = ("".join(entry["token"] for entry in part) for part in (PICTURED_THOUGHT, PICTURED_ANSWER))
    assert [strip.replace("\u2423", " ") for strip in seen["strips"]][-2:] == [thought, said]
    for name in ("viewer-live.png", "viewer-response.png"):
        assert (shots / name).stat().st_size > 10_000, name
