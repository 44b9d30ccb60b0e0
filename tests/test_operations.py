"""Operations: replicas (balancing, failover, revival, no retry once a request was sent),
/metrics, client auth, the body size limit, request ids, upstream keys, readiness."""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from proxy.config import Config, describe, parse
from proxy.logs import JsonFormatter
from proxy.metrics import MAX_MODELS_PER_ROUTE
from tests.client import envelope, eventually, post_json
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, sglang_error
from tests.harness import free_port, sample, scrape

GEN = Generation(steps=[Step("text", "Hi"), Step("finish", finish_reason="stop")], completion_tokens=5)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}
HEALTH_PROBE = {"path": "/health", "interval": 0.1}


def pool(*urls: str, **keys: Any) -> Config:
    """One upstream over these replicas, serving every model, each call balanced alone: the
    balancing these tests are about (sessions are test_sessions.py's, design.md 11)."""
    return parse({"upstreams": [{"name": "pool", "urls": list(urls), "balance": "least_outstanding", **keys}]})


def port_of(fake: FakeUpstream) -> int:
    return int(fake.url.rsplit(":", 1)[1])


async def call(http: aiohttp.ClientSession, url: str, path: str = "/v1/chat/completions", body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    body = body if body is not None else (RESPONSES if path == "/v1/responses" else CHAT)
    return await post_json(http, url + path, body, **kwargs)


async def status_of(http: aiohttp.ClientSession, url: str, **kwargs: Any) -> int:
    async with http.get(url, **kwargs) as response:
        return response.status


@asynccontextmanager
async def stalled_stream(http: aiohttp.ClientSession, url: str) -> AsyncIterator[aiohttp.ClientResponse]:
    """A pass-through stream whose upstream sent one event and then waits for the client to leave."""
    async with http.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status == 200
        await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
        yield response


@pytest.fixture
async def replicas() -> AsyncIterator[list[FakeUpstream]]:
    """Two replicas; a streaming request stalls after its first event, any other completes."""
    fakes = [FakeUpstream(), FakeUpstream()]
    for fake in fakes:
        await fake.start()
        fake.script(Reply(GEN, stall_after=1))
    yield fakes
    for fake in fakes:
        await fake.close()


def counts(*fakes: FakeUpstream) -> tuple[int, ...]:
    return tuple(len(fake.requests) for fake in fakes)


# -- replicas -----------------------------------------------------------------------------------


async def test_concurrent_streams_spread_and_sequential_requests_take_turns(replicas, start_proxy, http) -> None:
    a, b = replicas
    url = await start_proxy(pool(a.url, b.url))
    async with stalled_stream(http, url), stalled_stream(http, url):
        assert (a.active_streams, b.active_streams) == (1, 1)
    await eventually(lambda: a.active_streams == b.active_streams == 0)
    for _ in range(6):
        assert (await call(http, url))[0] == 200
    assert counts(a, b) == (4, 4)


async def test_fewest_outstanding_wins_over_turns(replicas, start_proxy, http) -> None:
    a, b = replicas
    url = await start_proxy(pool(a.url, b.url))
    async with stalled_stream(http, url):
        busy, idle = (a, b) if a.active_streams else (b, a)
        for _ in range(4):
            assert (await call(http, url))[0] == 200
        assert counts(busy, idle) == (1, 4)


@pytest.mark.parametrize(
    "revival",
    [{"health_check": HEALTH_PROBE, "eject_seconds": 600}, {"eject_seconds": 0.3}],
    ids=["health_probe", "ejection_expires"],
)
async def test_replica_down_and_back(replicas, start_proxy, http, revival: dict) -> None:
    a, b = replicas
    url = await start_proxy(pool(a.url, b.url, **revival))
    for _ in range(2):  # one each; both connections now pooled
        assert (await call(http, url))[0] == 200
    assert counts(a, b) == (1, 1)

    port = port_of(a)
    await a.close()
    for _ in range(6):  # none had started when `a` went: each moves to `b`, unseen by the client
        assert await call(http, url) == (200, GEN.completion(logprobs=False))
    assert counts(a, b) == (1, 7)

    await a.start(port=port)

    async def a_serves_again() -> bool:
        assert (await call(http, url))[0] == 200
        return len(a.requests) > 1

    await eventually(a_serves_again)


class Hangup:
    """An upstream that reads a whole request, then drops the connection without a word."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            self.requests.append(await reader.readexactly(int(length[1]) if length else 0))
            writer.transport.abort()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        self.server.close()


FAILURES = {
    # kind: (what each replica does, extra upstream keys, streaming?, status the client sees)
    "status_500": (sglang_error(500, "boom"), {}, False, 502),
    "first_byte_timeout": (Reply(GEN, headers_delay=5), {"timeouts": {"first_byte": 0.2}}, False, 504),
    "hangup_before_headers": (None, {}, False, 502),
    "stream_cut": (Reply(GEN, drop_after=1), {}, True, 200),
}


@pytest.mark.parametrize("kind", FAILURES)
async def test_a_request_that_reached_a_replica_is_not_retried(start_proxy, http, kind: str) -> None:
    reply, keys, streaming, status = FAILURES[kind]
    servers = [Hangup() if reply is None else FakeUpstream() for _ in range(2)]
    try:
        for server in servers:
            await server.start()
            if reply is not None:
                server.script(reply)
        url = await start_proxy(pool(*(s.url for s in servers), **keys))
        body = {**CHAT, "stream": True} if streaming else CHAT
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            assert response.status == status
            if streaming:
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
            else:
                assert set((await response.json())["error"]) == {"message", "type", "param", "code"}
        assert sum(len(s.requests) for s in servers) == 1
    finally:
        for server in servers:
            await server.close()


# -- metrics ------------------------------------------------------------------------------------


async def test_metrics_follow_traffic(upstream, start_proxy, http) -> None:
    upstream.script(Reply(GEN), Reply(GEN), Reply(GEN), Reply(GEN, stall_after=2), sglang_error(500, "boom"))
    config = parse({
        "upstreams": [{"name": "main", "urls": [upstream.url]}, {"name": "down", "urls": [f"http://127.0.0.1:{free_port()}"]}],
        "routes": [{"model": "m", "upstream": "main"}, {"model": "gone", "upstream": "down"}],
    })
    url = await start_proxy(config)
    assert (await call(http, url, "/v1/responses"))[0] == 200
    async with http.post(f"{url}/v1/responses", json={**RESPONSES, "stream": True}) as response:
        assert (await response.read()).endswith(b"data: [DONE]\n\n")
    assert (await call(http, url))[0] == 200
    async with http.post(f"{url}/v1/responses", json={**RESPONSES, "stream": True}) as response:
        await eventually(lambda: upstream.active_streams == 1)
        assert sample(await scrape(http, url), "proxy_streams_in_flight") == 1
    await eventually(lambda: upstream.disconnects == 1)
    assert (await call(http, url))[0] == 502  # the upstream answered 500
    assert (await call(http, url, "/v1/responses", {**RESPONSES, "model": "nope"}))[0] == 404
    assert (await call(http, url, "/v1/responses", {**RESPONSES, "model": "gone"}))[0] == 502

    metrics = await scrape(http, url)
    requests = {
        ("m", "/v1/responses", "200"): 2,
        ("m", "/v1/responses", "499"): 1,  # the client that left mid-stream
        ("m", "/v1/chat/completions", "200"): 1,
        ("m", "/v1/chat/completions", "502"): 1,
        ("", "/v1/responses", "404"): 1,
        ("gone", "/v1/responses", "502"): 1,
    }
    for (route, endpoint, status), count in requests.items():
        assert sample(metrics, "proxy_requests_total", route=route, endpoint=endpoint, status=status) == count, (route, endpoint, status)
    assert sample(metrics, "proxy_output_tokens_total", route="m") == 2 * GEN.completion_tokens
    assert sample(metrics, "proxy_streams_in_flight") == 0
    assert sample(metrics, "proxy_upstream_errors_total", upstream="down", kind="connection") == 1
    assert sample(metrics, "proxy_upstream_errors_total", upstream="main", kind="status_500") == 1
    assert sample(metrics, "proxy_time_to_first_token_seconds_count", route="m") == 2
    assert sample(metrics, "proxy_request_duration_seconds_count", endpoint="/v1/responses") == 5
    # The GenAI conventions' names (design.md 12.2), with the labels they require: the two
    # finished calls, one streamed; the upstream calls' durations, the one that reached nothing
    # by its error, the one the client left not at all (the upstream's time it is not).
    gen_ai = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "sglang", "gen_ai_request_model": "m"}
    assert sample(metrics, "gen_ai_server_time_to_first_token_seconds_count", **gen_ai) == 2
    assert sample(metrics, "gen_ai_server_time_per_output_token_seconds_count", **gen_ai) == 1
    output_usage = sample(metrics, "gen_ai_client_token_usage_sum", **gen_ai, gen_ai_token_type="output")
    assert output_usage == 2 * GEN.completion_tokens
    assert sample(metrics, "gen_ai_client_token_usage_count", **gen_ai, gen_ai_token_type="input") == 2
    assert sample(metrics, "gen_ai_client_operation_duration_seconds_count", **gen_ai, error_type="") == 2
    unreached = {**gen_ai, "gen_ai_request_model": "gone", "error_type": "upstream_unreachable"}
    assert sample(metrics, "gen_ai_client_operation_duration_seconds_count", **unreached) == 1
    durations = [key for key in metrics if key[0] == "gen_ai_client_operation_duration_seconds_count"]
    assert len(durations) == 2


async def families(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """/metrics as prometheus_client's own parser reads the exposition format."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_each_upstream_call_is_timed_in_the_genai_conventions(upstream, start_proxy, http) -> None:
    """gen_ai.client.operation.duration, required of an instrumentation that has the GenAI
    client metrics: a histogram in seconds, with the buckets the conventions advise, by the
    labels they require, and `error_type` where the call failed (the status the upstream
    answered with)."""
    upstream.script(Reply(GEN), sglang_error(500, "boom"))
    url = await start_proxy(parse({"upstreams": [{"name": "main", "urls": [upstream.url], "dialect": "vllm"}]}))
    assert (await call(http, url, "/v1/responses", {**RESPONSES, "model": "qwen3"}))[0] == 200
    assert (await call(http, url, "/v1/responses", {**RESPONSES, "model": "qwen3"}))[0] == 502

    duration = (await families(http, url))["gen_ai_client_operation_duration_seconds"]
    assert duration.type == "histogram"
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm", "gen_ai_request_model": "qwen3"}
    buckets = [s.labels["le"] for s in duration.samples if s.name.endswith("_bucket") and s.labels["error_type"] == ""]
    assert buckets == ["0.01", "0.02", "0.04", "0.08", "0.16", "0.32", "0.64", "1.28", "2.56", "5.12", "10.24", "20.48", "40.96", "81.92", "+Inf"]
    counts = {s.labels["error_type"]: s.value for s in duration.samples if s.name.endswith("_count")}
    assert counts == {"": 1, "500": 1}
    assert all(s.labels | labels == s.labels for s in duration.samples)


async def test_a_routes_model_names_are_labels_up_to_a_cap_then_its_pattern(upstream, start_proxy, http) -> None:
    """design.md 12.2: `gen_ai_request_model` is the model asked for, bounded: a glob route shows
    its first MAX_MODELS_PER_ROUTE names, and counts any name past them under its pattern."""
    upstream.script(Reply(GEN))
    url = await start_proxy(parse({"upstreams": [{"name": "main", "urls": [upstream.url]}], "routes": [{"model": "qwen-*", "upstream": "main"}]}))
    names = [f"qwen-{n}" for n in range(MAX_MODELS_PER_ROUTE + 1)]
    for name in names:
        assert (await call(http, url, "/v1/responses", {**RESPONSES, "model": name}))[0] == 200
    found = await families(http, url)
    for family in ("gen_ai_client_operation_duration_seconds", "gen_ai_client_token_usage"):
        counted = {s.labels["gen_ai_request_model"] for s in found[family].samples if s.name.endswith("_count")}
        assert counted == {*names[:-1], "qwen-*"}, family
    assert sample(await scrape(http, url), "gen_ai_client_operation_duration_seconds_count", gen_ai_operation_name="chat", gen_ai_provider_name="sglang", gen_ai_request_model="qwen-*", error_type="") == 1


async def test_metrics_name_the_text_formats_version(upstream, proxy, http) -> None:
    """Prometheus picks its parser by the content type: the classic text format, 0.0.4."""
    async with http.get(f"{proxy}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


# -- auth and the body limit ----------------------------------------------------------------------

CLIENT_KEY = "sk-client-3c1e"
PROTECTED = [("POST", "/v1/responses"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models")]


@pytest.fixture(params=["api_keys", "api_keys_env"])
async def guarded(request, upstream, start_proxy, monkeypatch) -> str:
    upstream.script(Reply(GEN))
    auth = {"api_keys": ["sk-other", CLIENT_KEY]}
    if request.param == "api_keys_env":
        monkeypatch.setenv("TEST_PROXY_KEYS", f"sk-other, {CLIENT_KEY}")
        auth = {"api_keys_env": "TEST_PROXY_KEYS"}
    return await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "auth": auth}))


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {CLIENT_KEY}", CLIENT_KEY, "Bearer ", f"Bearer {CLIENT_KEY}x"])
async def test_missing_or_wrong_key_is_401(guarded, upstream, http, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    for method, path in PROTECTED:
        async with http.request(method, guarded + path, json={"model": "m", "input": "hi"}, headers=headers) as response:
            assert response.status == 401, path
            envelope(await response.json(), "invalid_api_key", type="invalid_request_error")
    assert upstream.requests == []


async def test_right_key_passes_and_probes_stay_open(guarded, upstream, http) -> None:
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    assert (await call(http, guarded, "/v1/responses", headers=headers))[0] == 200
    assert (await call(http, guarded, headers=headers))[0] == 200
    assert await status_of(http, f"{guarded}/v1/models", headers=headers) == 200
    assert len(upstream.requests) == 2
    for path in ("/health", "/ready", "/metrics"):
        assert await status_of(http, guarded + path) == 200, path


@pytest.mark.parametrize("path", ["/v1//models", "/v1/models/", "/%76%31/models", "/v1/%6dodels", "/./v1/models", "/v1/../v1/models"])
async def test_no_path_spelling_skips_auth(guarded, http, path: str) -> None:
    async with http.get(URL(guarded + path, encoded=True)) as response:
        assert response.status in (401, 404), await response.text()


def big_body(path: str, size: int) -> dict:
    text = "x" * size
    return {**RESPONSES, "input": text} if path == "/v1/responses" else {**CHAT, "messages": [{"role": "user", "content": text}]}


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 500):
        yield data[i : i + 500]


def encode(how: str, data: bytes) -> dict:
    if how == "gzip":
        return {"data": gzip.compress(data), "headers": {"Content-Type": "application/json", "Content-Encoding": "gzip"}}
    if how == "chunked":
        return {"data": chunks(data), "headers": {"Content-Type": "application/json"}}
    return {"data": data, "headers": {"Content-Type": "application/json"}}


@pytest.mark.parametrize("how", ["plain", "gzip", "chunked"])
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_body_over_max_body_bytes_is_413(upstream, start_proxy, http, path: str, how: str) -> None:
    upstream.script(Reply(GEN))
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "max_body_bytes": 2048}))
    async with http.post(url + path, **encode(how, orjson.dumps(big_body(path, 1800)))) as response:
        assert response.status == 200, await response.text()  # under the limit, however sent
    async with http.post(url + path, **encode(how, orjson.dumps(big_body(path, 3000)))) as response:
        assert response.status == 413
        envelope(await response.json(), "request_too_large", type="invalid_request_error")
    assert len(upstream.requests) == 1


# -- request ids and upstream keys ----------------------------------------------------------------


@pytest.mark.parametrize("given", [None, "req-4f2a"])
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_request_id_is_kept_or_minted_and_sent_upstream(upstream, proxy, http, caplog, path: str, given: str | None) -> None:
    caplog.set_level(logging.INFO, logger="proxy.access")
    upstream.script(Reply(GEN))
    headers = {"X-Request-ID": given} if given else {}
    ids = []
    for _ in range(2):
        async with http.post(proxy + path, json=RESPONSES if path == "/v1/responses" else CHAT, headers=headers) as response:
            assert response.status == 200
            ids.append(response.headers["X-Request-ID"])
    assert [h["x-request-id"] for h in upstream.headers] == ids
    if given:
        assert ids == [given, given]
    else:
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]
    assert [r.request_id for r in caplog.records if r.name == "proxy.access"] == ids


async def test_error_answers_carry_the_request_id(upstream, start_proxy, http) -> None:
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "routes": [{"model": "m", "upstream": "u"}]}))
    cases = [("/v1/responses", {**RESPONSES, "model": "nope"}, 404), ("/v1/nothing", {}, 404), ("/v1/responses", {"model": "m"}, 400)]
    for path, body, status in cases:
        async with http.post(url + path, json=body, headers={"X-Request-ID": f"id-{status}"}) as response:
            assert (response.status, response.headers.get("X-Request-ID")) == (status, f"id-{status}"), path


@pytest.mark.parametrize("source", ["api_key", "api_key_env"])
async def test_upstream_key_is_sent_and_never_logged(upstream, start_proxy, http, caplog, monkeypatch, source: str) -> None:
    secret = "up-secret-9d8e7f"
    caplog.set_level(logging.DEBUG)
    keys = {"api_key": secret}
    if source == "api_key_env":
        monkeypatch.setenv("TEST_UPSTREAM_KEY", secret)
        keys = {"api_key_env": "TEST_UPSTREAM_KEY"}
    config = parse({
        "upstreams": [{"name": "u", "urls": [upstream.url], "headers": {"X-Team": "blue"}, **keys}],
        "auth": {"api_keys": [CLIENT_KEY]},
    })
    upstream.script(Reply(GEN), Reply(GEN), sglang_error(500, "boom"))
    url = await start_proxy(config)
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    assert (await call(http, url, "/v1/responses", headers=headers))[0] == 200
    assert (await call(http, url, headers=headers))[0] == 200
    assert (await call(http, url, headers=headers))[0] == 502
    assert [(h["authorization"], h["x-team"]) for h in upstream.headers] == [(f"Bearer {secret}", "blue")] * 3

    assert any(r.name == "proxy.access" for r in caplog.records)
    logged = "\n".join([caplog.text, *(JsonFormatter().format(r) for r in caplog.records)])
    assert secret not in logged and CLIENT_KEY not in logged
    assert secret not in describe(config)


# -- readiness ------------------------------------------------------------------------------------


async def test_ready_follows_the_health_probe(upstream, start_proxy, http) -> None:
    url = await start_proxy(pool(upstream.url, health_check=HEALTH_PROBE))
    assert await status_of(http, f"{url}/ready") == 200
    port = port_of(upstream)
    await upstream.close()

    async def ready_is(status: int) -> bool:
        return await status_of(http, f"{url}/ready") == status

    await eventually(lambda: ready_is(503))
    assert await status_of(http, f"{url}/health") == 200
    await upstream.start(port=port)
    await eventually(lambda: ready_is(200))


@pytest.mark.parametrize("routes", [[{"model": "m", "upstream": "live"}], []], ids=["routed", "first-serves-all"])
async def test_an_upstream_no_route_uses_leaves_ready_alone(upstream, start_proxy, http, routes) -> None:
    """/ready is every route with a healthy replica (with no routes, the first upstream's)."""
    dead = f"http://127.0.0.1:{free_port()}"
    config = parse({
        "upstreams": [{"name": "live", "urls": [upstream.url], "health_check": HEALTH_PROBE}, {"name": "spare", "urls": [dead], "health_check": HEALTH_PROBE}],
        "routes": routes,
    })
    url = await start_proxy(config)
    await asyncio.sleep(0.5)  # probes of the dead one have failed by now
    assert await status_of(http, f"{url}/ready") == 200


async def test_ready_is_503_after_the_only_replica_refused(start_proxy, http) -> None:
    url = await start_proxy(pool(f"http://127.0.0.1:{free_port()}", eject_seconds=600))
    assert await status_of(http, f"{url}/ready") == 200
    assert (await call(http, url))[0] == 502
    assert await status_of(http, f"{url}/ready") == 503
