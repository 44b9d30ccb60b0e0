"""Routing: models to upstreams (exact, glob, rewrite, defaults), the model list, the config's
errors (in `parse` and through `--check-config`), and the byte-for-byte pass-through of
/v1/chat/completions and /v1/completions."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from proxy.config import Config, ConfigError, parse
from tests.client import post_json
from tests.events import sse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "configs" / "proxy.example.yaml"
ONE = "upstreams:\n  - name: a\n    urls: [http://a]\n"
HI = Generation(steps=[Step("text", "Hi"), Step("finish", finish_reason="stop")], completion_tokens=1)
MESSAGES = [{"role": "user", "content": "hi"}]


def routed(upstreams: dict[str, FakeUpstream | str], routes: list[dict], **upstream_keys: Any) -> Config:
    """One upstream per name (a fake or a URL), `upstream_keys` added to each, then `routes`."""
    return parse({
        "upstreams": [{"name": name, "urls": [getattr(u, "url", u)], **upstream_keys} for name, u in upstreams.items()],
        "routes": routes,
    })


@pytest.fixture
async def other() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.close()


class Echo:
    """An upstream for any POST path: records the raw body, answers a fixed JSON body."""

    ANSWER = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        async def handle(request: web.Request) -> web.Response:
            self.received.append((request.path, await request.read()))
            return web.json_response(self.ANSWER)

        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    server = Echo()
    yield server
    if server.runner is not None:
        await server.runner.cleanup()


# -- config errors name the key -------------------------------------------------------------

UP = {"name": "a", "urls": ["http://127.0.0.1:1"]}


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"upstreams": [{"name": "a", "urls": ["nope"]}]}, "upstreams[0].urls[0]: not a URL"),
        ({"upstreams": [UP, {"name": "b", "urls": ["http://x", "ftp://y"]}]}, "upstreams[1].urls[1]: not a URL"),
        ({"upstreams": []}, "upstreams: "),
        ({}, "config: "),
        ({"upstreams": [UP, UP]}, "upstreams[1].name: duplicate"),
        ({"upstreams": [UP], "routes": [{"model": "m", "upstream": "b"}]}, "routes[0].upstream: no upstream named 'b'"),
        ({"upstreams": [UP], "routes": [{"model": "m"}]}, "routes[0]: "),
        ({"upstreams": [{**UP, "timeouts": {"conect": 1}}]}, "upstreams[0].timeouts: "),
        ({"upstreams": [{**UP, "timeouts": {"connect": 0}}]}, "upstreams[0].timeouts.connect: "),
        ({"upstreams": [{**UP, "health_check": {"interval": "soon"}}]}, "upstreams[0].health_check.interval: "),
        ({"upstreams": [{**UP, "api_key": "k", "api_key_env": "K"}]}, "upstreams[0]: give api_key or api_key_env"),
        ({"upstreams": [{**UP, "api_key": "${SURELY_UNSET_VAR_42}"}]}, "upstreams[0].api_key: environment variable SURELY_UNSET_VAR_42"),
        ({"upstreams": [UP], "log": {"level": "verbose"}}, "log.level: "),
        ({"upstreams": [UP], "max_body_bytes": 10}, "max_body_bytes: "),
        ({"upstreams": [UP], "listen": {"port": 70000}}, "listen.port: "),
        ({"upstreams": [{**UP, "defaults": {"top_logprobs": 5, "logprobs": True}}]}, "upstreams[0].defaults: logprobs, top_logprobs set by the proxy"),
        ({"upstreams": [UP], "routes": [{"model": "q-*", "upstream": "a", "codex": {"base_instructions": "x"}}]}, "routes[0].codex: a model card names one model"),
        ({"upstreams": [UP], "routes": [{"model": "q", "upstream": "a", "codex": {}}]}, "routes[0].codex: "),
    ],
)
def test_config_errors_name_the_key(data: dict, where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    assert str(caught.value).startswith(where), str(caught.value)


def test_env_vars_expand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWEN_HOST", "sglang:30000")
    config = parse({"upstreams": [{"name": "a", "urls": ["http://${QWEN_HOST}/"]}]})
    assert config.upstreams[0].urls == ["http://sglang:30000/"]


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--check-config", str(path)], capture_output=True, text=True, timeout=30, cwd=ROOT
    )


def test_check_config_prints_the_routes(tmp_path: Path) -> None:
    result = check_config(EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "Qwen/Qwen3-8B -> qwen [http://sglang-qwen-0:30000, http://sglang-qwen-1:30000]",
        "qwen-* -> qwen as Qwen/Qwen3-8B [http://sglang-qwen-0:30000, http://sglang-qwen-1:30000]",
        "* -> vllm [http://vllm:8000]",
    ]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("upstreams:\n  - name: a\n    urls: [not-a-url]\n", "upstreams[0].urls[0]: not a URL"),
        ("upstreams:\n  - name: a\n    urls: [http://a]\n    timeouts: {idle: -1}\n", "upstreams[0].timeouts.idle"),
        ("upstreams: [\n", "broken.yaml"),  # not YAML at all
        (b"upstreams:\n  - name: \xff\n", "broken.yaml"),  # not UTF-8
        (f"{ONE}mcp:\n  servers: [{{server_label: a, url: 'http://a/mcp'}}, {{server_label: a, url: 'http://b/mcp'}}]\n", "mcp.servers[1].server_label: duplicate"),
        (f"{ONE}mcp:\n  servers: [{{server_label: a, url: nowhere}}]\n", "mcp.servers[0].url: not a URL"),
        (f"{ONE}mcp:\n  web_search: {{server: gone, tool: search}}\n", "mcp.web_search.server: no server labelled 'gone'"),
        (f"{ONE}mcp:\n  timeout: 0\n", "mcp.timeout"),
        (f"{ONE}mcp:\n  allowed_servers: ['http://a/*', 'http://[::1']\n", "mcp.allowed_servers[1]: not a URL"),
        (f"{ONE}mcp:\n  allowed_servers: ['http://a:99999/mcp']\n", "mcp.allowed_servers[0]: not a URL"),
        (f"{ONE}mcp:\n  allowed_servers: ['mcp.example.com/*']\n", "mcp.allowed_servers[0]: not an http(s) URL"),
    ],
    ids=[
        "url", "timeout", "yaml", "encoding", "mcp-label", "mcp-url", "mcp-hosted", "mcp-timeout",
        "allowed-unparsed", "allowed-port", "allowed-scheme",
    ],
)
def test_check_config_refuses_a_broken_file(tmp_path: Path, text: str | bytes, where: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = check_config(path)
    assert result.returncode != 0
    assert where in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count(str(path)) == 1 and result.stdout == ""  # the file named once


# -- routes -----------------------------------------------------------------------------------

ROUTES = [
    {"model": "Qwen/Qwen3-8B", "upstream": "qwen"},
    {"model": "qwen-special", "upstream": "other"},  # before the glob that would also match
    {"model": "qwen-*", "upstream": "qwen", "rewrite_model": "Qwen/Qwen3-8B"},
    {"model": "llama-?b", "upstream": "other"},
]


@pytest.mark.parametrize(
    ("model", "target", "sent"),
    [
        ("Qwen/Qwen3-8B", "qwen", "Qwen/Qwen3-8B"),
        ("qwen-small", "qwen", "Qwen/Qwen3-8B"),
        ("qwen-special", "other", "qwen-special"),
        ("llama-8b", "other", "llama-8b"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_route_and_rewrite(upstream, other, start_proxy, http, path: str, model: str, target: str, sent: str) -> None:
    upstream.script(Reply(HI))
    other.script(Reply(HI))
    url = await start_proxy(routed({"qwen": upstream, "other": other}, ROUTES))
    body = {"model": model, "input": "hi"} if path == "/v1/responses" else {"model": model, "messages": MESSAGES}
    status, answer = await post_json(http, url + path, body)
    assert status == 200, answer
    chosen, idle = (upstream, other) if target == "qwen" else (other, upstream)
    assert [r["model"] for r in chosen.requests] == [sent] and idle.requests == []
    if path == "/v1/responses":
        assert answer["model"] == model  # the client's name, whatever was sent upstream


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions", "/v1/completions"])
async def test_unrouted_model_is_404(upstream, other, start_proxy, http, path: str) -> None:
    url = await start_proxy(routed({"qwen": upstream, "other": other}, ROUTES))
    body = {"/v1/responses": {"input": "hi"}, "/v1/chat/completions": {"messages": MESSAGES}}.get(path, {"prompt": "hi"})
    status, answer = await post_json(http, url + path, {"model": "gpt-4o", **body})
    assert status == 404
    error = answer["error"]
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
    assert "gpt-4o" in error["message"]
    assert all(route["model"] in error["message"] for route in ROUTES)
    assert upstream.requests == other.requests == []


async def test_no_routes_send_every_model_to_the_first_upstream(upstream, other, start_proxy, http) -> None:
    upstream.script(Reply(HI))
    url = await start_proxy(routed({"first": upstream, "second": other}, []))
    for model in ("a", "b/c"):
        assert (await post_json(http, f"{url}/v1/chat/completions", {"model": model, "messages": MESSAGES}))[0] == 200
    assert [r["model"] for r in upstream.requests] == ["a", "b/c"] and other.requests == []


async def test_defaults_fill_in_what_the_request_leaves_out(upstream, start_proxy, http) -> None:
    upstream.script(Reply(HI))
    defaults = {"separate_reasoning": True, "chat_template_kwargs": {"enable_thinking": True}, "temperature": 0.1, "top_p": 0.5}
    url = await start_proxy(routed({"qwen": upstream}, [{"model": "*", "upstream": "qwen"}], defaults=defaults))
    status, answer = await post_json(http, f"{url}/v1/responses", {"model": "m", "input": "hi", "temperature": 0.7})
    assert status == 200, answer
    sent = upstream.requests[0]
    assert sent["temperature"] == 0.7  # the request's own value wins
    assert (sent["top_p"], sent["separate_reasoning"], sent["chat_template_kwargs"]) == (0.5, True, {"enable_thinking": True})
    assert sent["messages"] == MESSAGES


async def test_models_lists_what_the_routes_serve(upstream, other, start_proxy, http) -> None:
    url = await start_proxy(routed({"qwen": upstream, "other": other}, ROUTES))
    async with http.get(f"{url}/v1/models") as response:
        assert response.status == 200
        listed = await response.json()
    assert listed["object"] == "list"
    assert [(m["id"], m["owned_by"]) for m in listed["data"]] == [(r["model"], r["upstream"]) for r in ROUTES]
    assert upstream.requests == other.requests == []


async def test_codex_reads_the_model_cards_of_the_routes_that_have_one(upstream, start_proxy, http) -> None:
    """design.md 8.11: Codex asks with its `client_version` and reads `{"models": [...]}`; the
    card's context window is the upstream's."""
    config = {
        "upstreams": [{"name": "qwen", "urls": [upstream.url], "context_window": 32768}],
        "routes": [
            {"model": "qwen3-coder", "upstream": "qwen", "codex": {"base_instructions": "You are a coding agent.", "default_reasoning_level": "medium"}},
            {"model": "*", "upstream": "qwen"},
        ],
    }
    url = await start_proxy(parse(config))
    async with http.get(f"{url}/v1/models", params={"client_version": "0.171.0"}) as response:
        assert response.status == 200
        (card,) = (await response.json())["models"]
    assert (card["slug"], card["context_window"], card["base_instructions"]) == ("qwen3-coder", 32768, "You are a coding agent.")
    assert [level["effort"] for level in card["supported_reasoning_levels"]] == ["low", "medium", "high"]
    assert card["default_reasoning_level"] == "medium"
    async with http.get(f"{url}/v1/models") as response:  # the OpenAI list, for every other client
        assert [m["id"] for m in (await response.json())["data"]] == ["qwen3-coder", "*"]


async def test_models_without_routes_is_the_upstreams_list(upstream, start_proxy, http) -> None:
    url = await start_proxy(routed({"only": upstream}, []))
    async with http.get(f"{url}/v1/models") as response:
        assert response.status == 200
        assert [m["id"] for m in (await response.json())["data"]] == ["fake-model"]


# -- pass-through -------------------------------------------------------------------------------

# Odd spacing, key order, escapes, numbers and fields the proxy knows nothing about.
RAW = b'{ "prompt" :"caf\\u00e9",\n "model": "m", "zz": {"n": [1, 2.50, 1e3]}, "max_tokens" : 3 }'


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_passthrough_forwards_the_body_unchanged(echo, start_proxy, http, path: str) -> None:
    url = await start_proxy(routed({"e": await echo.start()}, [{"model": "m", "upstream": "e"}], defaults={"temperature": 0.1}))
    status, answer = await post_json(http, url + path, RAW)
    assert (status, answer) == (200, Echo.ANSWER)
    assert echo.received == [(path, RAW)]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_passthrough_rewrites_only_the_model(echo, start_proxy, http, path: str) -> None:
    url = await start_proxy(routed({"e": await echo.start()}, [{"model": "m", "upstream": "e", "rewrite_model": "big/model"}]))
    assert (await post_json(http, url + path, RAW))[0] == 200
    ((got_path, sent),) = echo.received
    assert got_path == path
    assert orjson.loads(sent) == {**orjson.loads(RAW), "model": "big/model"}


async def test_completions_error_of_the_upstream_reaches_the_client(upstream, start_proxy, http) -> None:
    """The fake serves only chat: its 404 for /v1/completions comes back, in the envelope."""
    url = await start_proxy(routed({"qwen": upstream}, [{"model": "m", "upstream": "qwen"}]))
    status, answer = await post_json(http, f"{url}/v1/completions", {"model": "m", "prompt": "hi"})
    assert status == 404
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["code"] != "model_not_found"


def sse_bytes(generation: Generation) -> bytes:
    """What the fake writes for a chat stream without logprobs or usage."""
    return sse(generation.chunks(logprobs=False, usage=False))


WORDS = Generation(steps=[*(Step("text", f"w{i} ") for i in range(6)), Step("finish", finish_reason="stop")])
STREAM = {"model": "m", "messages": MESSAGES, "stream": True}


async def test_passthrough_stream_arrives_as_sent(upstream, proxy, http) -> None:
    upstream.script(Reply(WORDS, stall_after=3))
    async with asyncio.timeout(5), http.post(f"{proxy}/v1/chat/completions", json=STREAM) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        received = b""
        while received.count(b"\n\n") < 3:  # the upstream sent three events and now waits
            received += await response.content.readany()
        assert upstream.active_streams == 1
        assert received == sse_bytes(WORDS)[: len(received)]
    # The client left: the proxy hangs up on the upstream too.
    await asyncio.wait_for(upstream.disconnected.wait(), 5)


@pytest.mark.parametrize("knobs", [{"delay": 0.02}, {"write_size": 7}, {"coalesce": True}])
async def test_passthrough_stream_bytes_unchanged(upstream, proxy, http, knobs: dict) -> None:
    upstream.script(Reply(WORDS, **knobs))
    async with http.post(f"{proxy}/v1/chat/completions", json=STREAM) as response:
        assert response.status == 200
        assert await response.read() == sse_bytes(WORDS)
    assert upstream.requests == [STREAM]


@pytest.mark.parametrize(
    ("body", "param"),
    [(b"{not json", None), (b"[1, 2]", "model"), (b'{"model": 3}', "model"), (b'{"messages": []}', "model")],
)
async def test_passthrough_refuses_bodies_without_a_model(upstream, proxy, http, body: bytes, param: str | None) -> None:
    status, answer = await post_json(http, f"{proxy}/v1/chat/completions", body)
    assert status == 400 and answer["error"]["param"] == param
    assert upstream.requests == []


def test_example_config_parses_to_its_documented_defaults() -> None:
    """The example file names every key; its values are the defaults it claims."""
    data = yaml.safe_load(EXAMPLE.read_text())
    config = parse(data)
    qwen = config.upstreams[0]
    assert (config.listen.port, config.shutdown_grace, config.max_body_bytes) == (8080, 30, 32 * 1024 * 1024)
    assert (qwen.timeouts.connect, qwen.timeouts.first_byte, qwen.timeouts.idle, qwen.timeouts.total) == (5, 600, 120, None)
    assert (qwen.health_check.path, qwen.health_check.interval, qwen.eject_seconds) == ("/health", 5, 10)


REPLAYED = [
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "thought"}]},
    {"type": "message", "role": "assistant", "content": "answer"},
    {"type": "message", "role": "user", "content": "again"},
]


@pytest.mark.parametrize(
    ("upstream_keys", "field", "alternatives"),
    [
        ({}, "reasoning_content", 0),
        ({"dialect": "sglang"}, "reasoning_content", 0),
        ({"dialect": "vllm"}, "reasoning", 0),
        ({"dialect": "llama.cpp"}, "reasoning_content", 1),
        ({"dialect": "generic"}, None, 0),
        ({"dialect": "vllm", "reasoning_field": "reasoning_content"}, "reasoning_content", 0),
        ({"dialect": "generic", "reasoning_field": "reasoning"}, "reasoning", 0),
        ({"dialect": "sglang", "reasoning_field": "none"}, None, 0),
        ({"dialect": "llama.cpp", "min_top_logprobs": 0}, "reasoning_content", 0),
    ],
)
async def test_an_upstreams_dialect_and_what_it_sets_of_it(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, upstream_keys: dict[str, Any], field: str | None, alternatives: int
) -> None:
    """design.md 6.14: the dialect says where replayed reasoning goes and how few alternatives
    are asked for; an upstream's own `reasoning_field` or `min_top_logprobs` wins over it."""
    url = await start_proxy(routed({"u": upstream}, [], **upstream_keys))
    upstream.script(Reply(HI))
    body = {"model": "m", "input": REPLAYED, "include": ["message.output_text.logprobs"]}
    status, answer = await post_json(http, f"{url}/v1/responses", body)
    assert status == 200, answer
    sent = upstream.requests[-1]
    assistant = next(message for message in sent["messages"] if message["role"] == "assistant")
    assert {key for key in assistant if key.startswith("reasoning")} == ({field} if field else set())
    if field:
        assert assistant[field] == "thought"
    assert sent["top_logprobs"] == alternatives


def test_an_unknown_dialect_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.dialect"):
        parse({"upstreams": [{"name": "u", "urls": ["http://127.0.0.1:1"], "dialect": "tgi"}]})
