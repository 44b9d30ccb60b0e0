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

WORDS = ["Hello", " world", " <script>window.pwned=1</script>", ' <img src=x onerror="window.pwned=2">', "!"]
LOGPROBS = [-0.05, -0.7, -1.6, -2.3, -0.01]
ANSWER = Generation(
    [Step("reasoning", "The user wants a greeting."), *(Step("text", w, [score(w, lp, top=3)]) for w, lp in zip(WORDS, LOGPROBS, strict=True)), Step("finish", finish_reason="stop")]
)
# Screenshots for the README, when asked for: SCREENSHOTS=docs/images make test ...
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
            _shot(driver, "viewer-live.png")
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
    assert seen["done"].startswith(f"completed: {len(WORDS)} tokens")
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
            _shot(driver, "viewer-response.png")
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
    for path, kind in (("/ui/", "text/html"), ("/ui/responses/resp_1", "text/html"), ("/ui/static/viewer.js", "text/javascript"), ("/ui/static/viewer.css", "text/css")):
        async with http.get(f"{on}{path}") as response:
            assert response.status == 200 and response.content_type == kind
            policy = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    for escape in ("%2e%2e%2fconfig.py", "..%2Fconfig.py", "index.html"):  # only the page's own files
        async with http.get(URL(f"{on}/ui/static/{escape}", encoded=True)) as response:
            assert response.status == 404, escape
