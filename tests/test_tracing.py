"""OpenTelemetry traces (design.md 12) through the real proxy, exported over OTLP/HTTP to a real
receiver on loopback: the request's server span in the GenAI conventions, continuing the
caller's trace; the upstream call's client span, whose `traceparent` the upstream receives; the
store's spans; content only when asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.config import parse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.otlp import Collector, ReceivedSpan

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
ANSWER = Generation([Step("text", "Hi there"), Step("finish", finish_reason="stop")], prompt_tokens=12, completion_tokens=3, cached_tokens=4)


@pytest.fixture
async def collector(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Collector]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # export each batch at once, not every 5 s
    found = Collector()
    await found.start()
    yield found
    await found.close()


def config(upstream: FakeUpstream, tmp_path: Any, **tracing: Any) -> Any:
    return parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": {"url": f"sqlite:{tmp_path}/r.db"}, "tracing": tracing})


def one(spans: list[ReceivedSpan], kind: str) -> ReceivedSpan:
    (found,) = [span for span in spans if span.kind == kind]
    return found


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_a_call_is_a_server_span_in_the_genai_conventions_over_the_callers_trace(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path, stream: bool
) -> None:
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    upstream.script(Reply(ANSWER))
    body = {"model": "qwen3", "input": "hi", "max_output_tokens": 64, "temperature": 0.5, "stream": stream, "prompt_cache_key": "conversation-7"}
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    async with http.post(f"{proxy}/v1/responses", json=body, headers=headers) as answer:
        assert answer.status == 200
        raw = await answer.read()
    response_id = json.loads(raw)["id"] if not stream else raw.split(b'"id":"', 2)[1].split(b'"')[0].decode()

    spans = await collector.until(3)  # the server's, the upstream call's, the store's save
    server, client = one(spans, "SPAN_KIND_SERVER"), one(spans, "SPAN_KIND_CLIENT")
    assert (server.name, server.trace_id, server.parent_span_id) == ("chat qwen3", CALLER_TRACE, CALLER_SPAN)
    assert server.service == "responses-proxy"
    assert server.attributes | {} == {
        **server.attributes,
        "gen_ai.operation.name": "chat",
        "openai.api.type": "responses",
        "gen_ai.request.model": "qwen3",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.stream": stream,
        "gen_ai.conversation.id": "conversation-7",
        "gen_ai.response.id": response_id,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 4,
        "http.response.status_code": 200,
    }
    assert ("gen_ai.response.time_to_first_chunk" in server.attributes) == stream
    assert "gen_ai.input.messages" not in server.attributes  # content only when asked for

    assert (client.name, client.trace_id, client.parent_span_id) == ("chat qwen3", CALLER_TRACE, server.span_id)
    assert client.attributes["gen_ai.provider.name"] == "sglang"
    # The engine continues the client span: its own spans nest under the proxy's.
    assert upstream.headers[-1]["traceparent"] == f"00-{CALLER_TRACE}-{client.span_id}-01"

    stored = [span for span in spans if span.attributes.get("db.system.name") == "sqlite"]
    assert "put" in [span.attributes["db.operation.name"] for span in stored]  # and the first write's sweep
    assert {span.parent_span_id for span in stored} == {server.span_id}


async def test_content_goes_into_spans_only_when_asked_for(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path
) -> None:
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url, content=True))
    upstream.script(Reply(ANSWER))
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "hi", "store": False}) as answer:
        assert answer.status == 200
    server = one(await collector.until(2), "SPAN_KIND_SERVER")
    assert json.loads(server.attributes["gen_ai.input.messages"]) == [{"role": "user", "content": "hi"}]
    assert json.loads(server.attributes["gen_ai.output.messages"])[0]["content"][0]["text"] == "Hi there"


async def test_off_unless_configured_and_on_by_the_standard_variable(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.script(Reply(ANSWER))
    quiet = await start_proxy(config(upstream, tmp_path))
    async with http.post(f"{quiet}/v1/responses", json={"model": "qwen3", "input": "hi"}) as answer:
        assert answer.status == 200
    assert "traceparent" not in upstream.headers[-1]

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-7")
    traced = await start_proxy(config(upstream, tmp_path))
    async with http.post(f"{traced}/v1/responses", json={"model": "qwen3", "input": "hi"}) as answer:
        assert answer.status == 200
    spans = await collector.until(3)
    assert {span.service for span in spans} == {"gateway-7"} and "traceparent" in upstream.headers[-1]


async def test_an_upstream_failure_marks_the_client_span(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path
) -> None:
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    upstream.script(Reply(status=503, body={"error": {"message": "overloaded"}}))
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "hi", "store": False}) as answer:
        assert answer.status == 502
    spans = await collector.until(2)
    assert one(spans, "SPAN_KIND_CLIENT").status == "STATUS_CODE_ERROR"
    assert one(spans, "SPAN_KIND_SERVER").status == "STATUS_CODE_ERROR"


async def test_the_sdks_own_switch_turns_it_off(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """design.md 12.1: `OTEL_SDK_DISABLED=true` wins over `tracing.enabled`."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    upstream.script(Reply(ANSWER))
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "hi"}) as answer:
        assert answer.status == 200
    assert "traceparent" not in upstream.headers[-1]
