"""OpenTelemetry traces (design.md 12) through the real proxy, exported over OTLP/HTTP to a real
receiver on loopback: the request's server span in the GenAI and HTTP conventions, continuing the
caller's trace; the upstream call's client span, whose `traceparent` the upstream receives, with
what the upstream answered; failures as the conventions record them (status ERROR and
`error.type`); the store's spans; content only when asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.config import parse
from proxy.errors import UpstreamTimeout
from proxy.tracing import error_type
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import config as upstream_config
from tests.harness import free_port
from tests.mcp_servers import ToolServer
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


def port_of(upstream: FakeUpstream) -> int:
    return int(upstream.url.rsplit(":", 1)[1])


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
        "gen_ai.provider.name": "sglang",  # required of a GenAI span
        "http.request.method": "POST",
        "url.path": "/v1/responses",  # url.path and url.scheme: required of an HTTP server span
        "url.scheme": "http",
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
    assert (server.status, "error.type" in server.attributes) == ("", False)  # unset: no error

    assert (client.name, client.trace_id, client.parent_span_id) == ("chat qwen3", CALLER_TRACE, server.span_id)
    # The inference call's own answer, as the upstream gave it: its completion's id and model,
    # its finish reasons, its usage, and the replica that answered.
    assert client.attributes | {} == {
        **client.attributes,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "sglang",
        "gen_ai.request.model": "qwen3",
        "gen_ai.response.id": ANSWER.id,
        "gen_ai.response.model": "fake-model",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 4,
        "server.address": "127.0.0.1",
        "server.port": port_of(upstream),
    }
    assert (client.status, "error.type" in client.attributes) == ("", False)
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


@pytest.mark.parametrize("status", [500, 503])
async def test_an_upstream_error_status_is_the_error_type_of_both_spans(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path, status: int
) -> None:
    """The HTTP and GenAI conventions: a failed span's status is ERROR, and `error.type` (what
    error-rate searches group by) is the status code as a string: the upstream's on the client
    span, the proxy's own 502 on the server span."""
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    upstream.script(Reply(status=status, body={"error": {"message": "overloaded"}}))
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "hi", "store": False}) as answer:
        assert answer.status == 502
    spans = await collector.until(2)
    client, server = one(spans, "SPAN_KIND_CLIENT"), one(spans, "SPAN_KIND_SERVER")
    assert (client.status, client.attributes["error.type"]) == ("STATUS_CODE_ERROR", str(status))
    assert (server.status, server.attributes["error.type"]) == ("STATUS_CODE_ERROR", "502")
    assert server.attributes["http.response.status_code"] == 502


async def test_an_upstream_that_cannot_be_reached_is_the_error_type_of_the_client_span(
    collector: Collector, start_proxy, http: aiohttp.ClientSession, tmp_path
) -> None:
    """No status came: `error.type` is the proxy's own low-cardinality code for the failure."""
    gone = parse({"upstreams": [{"name": "u", "urls": [f"http://127.0.0.1:{free_port()}"]}], "tracing": {"enabled": True, "endpoint": collector.url}})
    proxy = await start_proxy(gone)
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "hi", "store": False}) as answer:
        assert answer.status == 502
    spans = await collector.until(2)
    client, server = one(spans, "SPAN_KIND_CLIENT"), one(spans, "SPAN_KIND_SERVER")
    assert (client.status, client.attributes["error.type"]) == ("STATUS_CODE_ERROR", "upstream_unreachable")
    assert (server.status, server.attributes["error.type"]) == ("STATUS_CODE_ERROR", "502")


@pytest.mark.parametrize(
    ("failure", "call_error", "response_error"),
    [
        ({"drop_after": 1}, "upstream_unreachable", "server_error"),  # the connection cut after a chunk
        ({"error_frame_after": 1}, "invalid_request_error", "invalid_prompt"),  # SGLang's error frame, code 400
    ],
    ids=["dropped", "error-frame"],
)
async def test_a_stream_that_fails_once_begun_marks_both_spans(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path,
    failure: dict[str, int], call_error: str, response_error: str,
) -> None:
    """The client gets `response.failed` inside a 200: the server span is an error all the same,
    by the failed Response's error code, and the client span by what broke the upstream call."""
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    upstream.script(Reply(ANSWER, **failure))
    body = {"model": "qwen3", "input": "hi", "stream": True, "store": False}
    async with http.post(f"{proxy}/v1/responses", json=body) as answer:
        assert answer.status == 200
        assert b"event: response.failed" in await answer.read()
    spans = await collector.until(2)
    client, server = one(spans, "SPAN_KIND_CLIENT"), one(spans, "SPAN_KIND_SERVER")
    assert (server.status, server.attributes["error.type"]) == ("STATUS_CODE_ERROR", response_error)
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.response.finish_reasons"] == ["error"]
    assert (client.status, client.attributes["error.type"]) == ("STATUS_CODE_ERROR", call_error)
    assert "gen_ai.usage.output_tokens" not in client.attributes  # a failed call's usage never came


async def test_every_request_span_has_what_the_http_server_conventions_require(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path
) -> None:
    """`http.request.method`, `url.path` and `url.scheme` are required of an HTTP server span,
    whatever the endpoint: the path as asked, the route its pattern."""
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    upstream.script(Reply(ANSWER))
    async with http.post(f"{proxy}/v1/chat/completions", json={"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}) as answer:
        assert answer.status == 200
    async with http.get(f"{proxy}/v1/responses/resp_nowhere") as answer:
        assert answer.status == 404
    spans = await collector.until(2)
    found = {span.attributes["url.path"]: span.attributes for span in spans if span.kind == "SPAN_KIND_SERVER"}
    assert found["/v1/chat/completions"] | {} == {
        **found["/v1/chat/completions"], "http.request.method": "POST", "url.scheme": "http", "http.route": "/v1/chat/completions",
    }
    missing = found["/v1/responses/resp_nowhere"]
    assert missing | {} == {**missing, "http.request.method": "GET", "url.scheme": "http", "http.route": "/v1/responses/{id}"}
    assert "error.type" not in missing  # a 4xx is the client's doing: no error of the server's


async def test_each_model_round_of_a_response_is_a_client_span_with_its_own_answer(
    collector: Collector, upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    """A Response of two rounds (an MCP call between them, design.md 14.4) is two inference calls:
    each span has the finish reason of its own round; the first, the id the upstream gave it;
    neither the Response's usage, which is both rounds' together."""
    tracing = {"enabled": True, "endpoint": collector.url}
    proxy = await start_proxy(upstream_config(upstream.url, mcp={"allowed_servers": [tool_server.url]}, tracing=tracing))
    call = Step("tool", '{"a": 2, "b": 3}', tool_id="call_1", tool_name="calc__add")
    first = Generation([call, Step("finish", finish_reason="tool_calls")])
    upstream.script(Reply(first), Reply(ANSWER))
    tool = {"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never"}
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "2 + 3?", "tools": [tool]}) as answer:
        assert answer.status == 200
    spans = await collector.until(3)  # the server's, the two rounds'
    server, clients = one(spans, "SPAN_KIND_SERVER"), [span for span in spans if span.kind == "SPAN_KIND_CLIENT"]
    assert [span.attributes["gen_ai.response.finish_reasons"] for span in clients] == [["tool_calls"], ["stop"]]
    assert [span.attributes.get("gen_ai.response.id") for span in clients] == [first.id, None]
    assert not [span for span in clients if "gen_ai.usage.input_tokens" in span.attributes]
    assert {span.parent_span_id for span in clients} == {server.span_id}


@pytest.mark.parametrize(
    ("tool", "name", "arguments"),
    [
        ({"type": "shell", "environment": {"type": "local"}}, "shell", '{"commands": ["ls"]}'),
        ({"type": "apply_patch"}, "apply_patch", '{"type": "delete_file", "path": "x"}'),
        ({"type": "function", "name": "lookup", "parameters": {"type": "object"}}, "lookup", "{}"),
    ],
)
async def test_a_response_that_ends_with_its_clients_call_finished_by_calling_tools(
    collector: Collector, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path, tool: dict, name: str, arguments: str
) -> None:
    """design.md 8.13, 12.1: a Response that ended for its client to run a call, of any kind the
    client runs (its native shell and apply_patch too), finished with `tool_calls`."""
    proxy = await start_proxy(config(upstream, tmp_path, enabled=True, endpoint=collector.url))
    call = Step("tool", arguments, tool_id="call_1", tool_name=name)
    upstream.script(Reply(Generation([call, Step("finish", finish_reason="tool_calls")])))
    async with http.post(f"{proxy}/v1/responses", json={"model": "qwen3", "input": "go", "tools": [tool]}) as answer:
        assert answer.status == 200
    server = one(await collector.until(3), "SPAN_KIND_SERVER")
    assert server.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]


def test_error_type_is_the_status_else_the_proxys_code_else_the_class() -> None:
    """The values the proxy reports as `error.type` (the conventions ask that they be listed, design.md 12.1)."""
    refused = UpstreamTimeout("upstream u sent nothing for 5 s")
    assert error_type(refused) == "upstream_timeout"
    refused.upstream_status = 500
    assert error_type(refused) == "500"
    assert error_type(ValueError("x")) == "ValueError"
    assert error_type(aiohttp.ClientPayloadError("x")) == "aiohttp.client_exceptions.ClientPayloadError"


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
