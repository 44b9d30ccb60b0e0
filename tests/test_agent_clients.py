"""Agent clients' requests through the real proxy (design.md 8): what they send is served, what
the proxy leaves out is counted and logged once, the errors they act on come as they read
them, and sealed reasoning survives a hop to another replica."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from agents import (
    Agent,
    OpenAIResponsesModel,
    Runner,
    ToolSearchTool,
    function_tool,
    set_tracing_disabled,
    tool_namespace,
)

from proxy.config import parse
from tests.agents import codex_turn, web_search
from tests.client import CONTEXT_LENGTH_EXCEEDED, LOGPROBS, envelope, parse_sse, read_events, validate_response
from tests.events import check_stream, framed, sent_scores
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score, sglang_error, vllm_error
from tests.harness import BODY, post, sample, scrape

IGNORED = "proxy_ignored_total"


def agent_turn() -> Generation:
    return Generation([
        Step("reasoning", "I will run ls.", [score("I"), score(" will")]),
        Step("tool", '{"cmd":', [score('{"cmd":')], tool_id="call_1", tool_name="exec_command"),
        Step("tool", '"ls"}', [score('"ls"}')]),
        Step("tool", "{}", [score("{}")], tool_index=1, tool_id="call_2", tool_name="multi_agent_v1__wait_agent"),
        Step("finish", finish_reason="tool_calls"),
    ])


async def streamed(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[bytes, list[dict]]:
    """The raw stream and its events (comments skipped)."""
    async with http.post(f"{url}/v1/responses", json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        raw = await response.read()
    frames = [frame for frame in raw.split(b"\n\n") if frame and not frame.startswith(b":")]
    return raw, parse_sse(b"\n\n".join(frames) + b"\n\n")


async def test_a_codex_turn_is_served(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    gen = agent_turn()
    upstream.script(Reply(gen))
    _, events = await streamed(http, proxy, {**codex_turn(1), "include": ["reasoning.encrypted_content", *LOGPROBS]})
    stream = check_stream(events)
    assert stream.terminal == "response.completed"
    reasoning, command, wait = stream.response["output"][:3]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "I will run ls."}]
    assert isinstance(reasoning["encrypted_content"], str)
    assert (command["name"], command["arguments"], "namespace" in command) == ("exec_command", '{"cmd":"ls"}', False)
    assert (wait["name"], wait["namespace"]) == ("wait_agent", "multi_agent_v1")
    assert stream.logprobs == sent_scores(gen.chunks())
    (sent,) = upstream.requests
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_upstream_that_reports_no_usage_still_gives_a_usage_object(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, stream: bool
) -> None:
    """design.md 5.1: the AI SDK reads `usage` unconditionally (its schema refuses null), so a
    server that ignores `include_usage` gets zeros, not null."""
    gen = agent_turn()
    if stream:
        upstream.script(Reply(frames=[*framed(gen.chunks(usage=False)), b"data: [DONE]\n\n"]))
        _, events = await streamed(http, proxy, BODY)
        response = events[-1]["response"]
    else:
        upstream.script(Reply(body={key: value for key, value in gen.completion().items() if key != "usage"}))
        status, _, raw = await post(http, proxy, BODY)
        assert status == 200, raw
        response = orjson.loads(raw)
    zeros = {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}
    assert response["status"] == "completed" and response["usage"] == zeros


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_refusal_is_a_message_with_a_refusal_part(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, stream: bool) -> None:
    """design.md 4.5: a chat `refusal` (what a server in front of OpenAI's models sends) is
    neither dropped nor made text."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    words = ["I can't", " help with that."]
    if stream:
        chunks = [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "refusal": None}, "finish_reason": None}]},
            *({**head, "choices": [{"index": 0, "delta": {"refusal": word}, "finish_reason": None}]} for word in words),
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        upstream.script(Reply(frames=[*framed(chunks), b"data: [DONE]\n\n"]))
        _, events = await streamed(http, proxy, {"model": "m", "input": "hi"})
        check_stream(events)
        assert [e["delta"] for e in events if e["type"] == "response.refusal.delta"] == words
        assert [e["refusal"] for e in events if e["type"] == "response.refusal.done"] == ["".join(words)]
        response = events[-1]["response"]
    else:
        message = {"role": "assistant", "content": None, "refusal": "".join(words)}
        upstream.script(Reply(body={**head, "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}))
        status, _, raw = await post(http, proxy, {"model": "m", "input": "hi"})
        assert status == 200, raw
        response = orjson.loads(raw)
    validate_response(response)
    assert response["status"] == "completed"
    assert [(item["type"], item["content"]) for item in response["output"]] == [("message", [{"type": "refusal", "refusal": "".join(words)}])]


async def test_left_out_things_are_counted_and_logged_once(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.script(Reply(agent_turn()))
    body = {**BODY, "tools": [web_search()], "frobnicate": {"a": 1}, "input": [{"type": "web_search_call", "id": "ws_1"}, {"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.INFO, logger="proxy"):
        for _ in range(3):
            status, _, raw = await post(http, proxy, body)
            assert status == 200, raw
    metrics = await scrape(http, proxy)
    for what in ("field:frobnicate", "tool:web_search", "input:web_search_call"):
        assert sample(metrics, IGNORED, what=what) == 3
        assert len([r for r in caplog.records if r.getMessage().endswith(what)]) == 1
    assert "frobnicate" not in upstream.requests[0] and "tools" not in upstream.requests[0]


async def test_the_ignored_metric_keeps_its_labels_bounded(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, caplog) -> None:
    """In number and in length: a client that names a field of megabytes grows neither
    /metrics nor the log by it."""
    upstream.script(Reply(agent_turn()))
    caplog.set_level(logging.INFO, logger="proxy")
    long = "x" * 1_000_000
    await post(http, proxy, {**BODY, long: 1})
    await asyncio.gather(*(post(http, proxy, {**BODY, f"field_{i}": 1}) for i in range(300)))
    metrics = await scrape(http, proxy)
    labelled = {dict(labels)["what"] for name, labels in metrics if name == IGNORED}
    assert len(labelled) == 257 and "other" in labelled and all(len(what) < 200 for what in labelled)
    assert sum(value for (name, _), value in metrics.items() if name == IGNORED) == 301
    assert long not in caplog.text


@pytest.mark.parametrize(
    ("setting", "body", "param"),
    [
        ({"requests": {"unknown_fields": "reject"}}, {"frobnicate": 1}, "frobnicate"),
        ({"upstreams": [{"hosted_tools": "reject"}]}, {"tools": [web_search()]}, "tools[0].type"),
    ],
    ids=["unknown-field", "hosted-tool"],
)
@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
async def test_strict_settings_refuse_what_is_otherwise_left_out(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, setting: dict, body: dict, param: str, streaming: bool
) -> None:
    config: dict[str, Any] = {"upstreams": [{"name": "default", "urls": [upstream.url]}]}
    for key, value in setting.items():
        config[key] = [{**config[key][0], **value[0]}] if key == "upstreams" else value

    url = await start_proxy(parse(config))
    status, _, raw = await post(http, url, {**BODY, **body, "stream": streaming})
    assert status == 400, raw
    assert envelope(orjson.loads(raw))["param"] == param
    assert upstream.requests == []


# -- context overflow (8.7) -----------------------------------------------------------------------

OVERFLOWS = {
    "sglang": sglang_error(400, "The input (40000 tokens) is longer than the model's context length (32768 tokens)."),
    "vllm": vllm_error(400, "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens. Please reduce the length of the messages."),
    "llama.cpp": Reply(
        status=400,
        body={"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 1200, "n_ctx": 512}},
    ),
}


@pytest.mark.parametrize("reply", OVERFLOWS.values(), ids=OVERFLOWS.keys())
async def test_a_prompt_over_the_context_fails_the_stream_as_codex_reads_it(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, sdk: openai.AsyncOpenAI, reply: Reply
) -> None:
    upstream.script(reply, reply, reply)
    _, events = await streamed(http, proxy, BODY)
    stream = check_stream(events)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert stream.response["error"]["code"] == events[-2]["code"] == CONTEXT_LENGTH_EXCEEDED
    # Not streamed: a 400 with the code, as the SDK raises it.
    status, _, raw = await post(http, proxy, BODY)
    assert status == 400
    envelope(orjson.loads(raw), CONTEXT_LENGTH_EXCEEDED, type="invalid_request_error")
    with pytest.raises(openai.BadRequestError) as raised:
        await sdk.responses.create(**BODY)
    assert raised.value.code == CONTEXT_LENGTH_EXCEEDED


async def test_other_upstream_refusals_stay_http_errors(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(sglang_error(400, "top_logprobs must be at most 20", "top_logprobs"))
    status, _, raw = await post(http, proxy, {**BODY, "stream": True})
    assert status == 400 and envelope(orjson.loads(raw))["code"] == "invalid_request_error"


# -- keepalive (4.11) -----------------------------------------------------------------------------


async def test_a_silent_upstream_gets_keepalive_comments(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:

    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url], "timeouts": {"idle": 0.75}}], "keepalive": 0.1}))
    gen = Generation([Step("text", "Hel", [score("Hel")]), Step("text", "lo", [score("lo")]), Step("finish", finish_reason="stop")])
    upstream.script(Reply(gen, stall_after=2), Reply(gen, delay=0.03))
    raw, events = await streamed(http, url, BODY)
    stream = check_stream(events)
    assert stream.terminal == "response.failed"  # the idle timeout still ends the silence
    comments = raw.count(b"\n\n: keepalive\n\n")
    assert 4 <= comments <= 8, comments
    assert raw.index(b": keepalive") > raw.index(b"response.output_text.delta")  # during the silence
    # A stream that keeps talking needs none.
    raw, events = await streamed(http, url, BODY)
    assert check_stream(events).terminal == "response.completed" and b"keepalive" not in raw


async def test_a_client_that_leaves_during_keepalives_is_let_go(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:

    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url]}], "keepalive": 0.05}))
    upstream.script(Reply(agent_turn(), stall_after=1))
    async with http.post(f"{url}/v1/responses", json={**BODY, "stream": True}) as response:
        async for event in read_events(response):
            if event["type"] == "response.in_progress":
                await asyncio.sleep(0.2)
                break
        response.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)


# -- sealed reasoning across replicas (8.6) --------------------------------------------------------


async def test_sealed_reasoning_opens_on_a_replica_with_the_same_key(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:

    def replica(key: str) -> Any:
        return start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url]}], "reasoning": {"key": key}}))

    first, same, other = await replica("k1"), await replica("k1"), await replica("k2")
    upstream.script(Reply(agent_turn()))
    _, events = await streamed(http, first, codex_turn(1))
    reasoning = events[-1]["response"]["output"][0]
    # As a client that keeps only the blob sends it (with its summary, the text would be there).
    replayed = {**reasoning, "content": None, "summary": []}
    turn = codex_turn(2)
    turn["input"][4] = replayed
    for url, expected in ((same, "I will run ls."), (other, None)):
        upstream.script(Reply(agent_turn()))
        await streamed(http, url, turn)
        assistant = next(m for m in upstream.requests[-1]["messages"] if m["role"] == "assistant")
        assert assistant.get("reasoning_content") == expected
    metrics = await scrape(http, other)
    assert sample(metrics, IGNORED, what="input:unreadable_encrypted_content") == 1


@pytest.mark.parametrize(("asked", "shown"), [(None, "auto"), ("detailed", "detailed")])
async def test_a_routes_reasoning_summary_is_the_default(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, asked: str | None, shown: str
) -> None:
    """design.md 8.5: with the upstream's `reasoning_summary: auto`, a request that asks for no
    summary (the AI SDK's, for a model name it does not know) gets its reasoning as summary
    events too, which is all such a client shows; one that asks keeps what it asked."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "reasoning_summary": "auto"}]}))
    upstream.script(Reply(agent_turn()))
    body = {"model": "m", "input": "hi", **({"reasoning": {"summary": asked}} if asked else {})}
    _, events = await streamed(http, url, body)
    stream = check_stream(events)
    assert [e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta"] == ["I will run ls."]
    assert stream.response["reasoning"]["summary"] == shown
    (reasoning,) = stream.of_type("reasoning")
    assert reasoning["summary"] == [{"type": "summary_text", "text": "I will run ls."}]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_openai_agents_tool_search_finds_a_deferred_function_and_the_run_completes(
    upstream: FakeUpstream, proxy: str, streamed: bool
) -> None:
    """openai-agents' `ToolSearchTool()` is a search the server runs (design.md 8.17), which its
    runner leaves to the server: the proxy searches the deferred functions, the model calls the
    one it found, the runner runs it and sends the run's items back, and the run completes."""
    looked_up: list[str] = []

    @function_tool(defer_loading=True)
    def lookup_customer(email: str) -> str:
        """Find a customer's record by email."""
        looked_up.append(email)
        return "Ana Lima, a customer since 2021"

    @function_tool(defer_loading=True)
    def book_meeting(title: str, start: str) -> str:
        """Book a meeting in the team's calendar."""
        raise AssertionError("not found by the search, never called")

    def calls(name: str, arguments: str, id: str) -> Reply:
        return Reply(Generation([Step("tool", arguments, tool_id=id, tool_name=name), Step("finish", finish_reason="tool_calls")]))

    upstream.script(
        calls("tool_search", '{"query": "customer record by email"}', "call_s"),
        calls("crm__lookup_customer", '{"email": "a@b.c"}', "call_l"),
        Reply(Generation([Step("text", "Ana Lima, since 2021."), Step("finish", finish_reason="stop")])),
    )
    set_tracing_disabled(True)  # else the SDK posts traces to api.openai.com
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=20) as client:
        crm = tool_namespace(name="crm", description="The customer records.", tools=[lookup_customer])
        agent = Agent(name="desk", model=OpenAIResponsesModel("m", client), tools=[*crm, book_meeting, ToolSearchTool()])
        if streamed:
            result = Runner.run_streamed(agent, "Who is a@b.c?")
            named = [event.name async for event in result.stream_events() if event.type == "run_item_stream_event"]
            assert named[:2] == ["tool_search_called", "tool_search_output_created"]
        else:
            result = await Runner.run(agent, "Who is a@b.c?")

    assert result.final_output == "Ana Lima, since 2021." and looked_up == ["a@b.c"]
    assert [item.type for item in result.new_items] == [
        "tool_search_call_item", "tool_search_output_item", "tool_call_item", "tool_call_output_item", "message_output_item",
    ]
    sent = upstream.requests[0]["tools"]
    assert [tool["function"]["name"] for tool in sent] == ["tool_search"]  # the deferred ones wait
    # The runner's next request carries the search's items back: the tool it loaded stays offered.
    found, last = upstream.requests[1:]
    assert [tool["function"]["name"] for tool in last["tools"]] == ["tool_search", "crm__lookup_customer"]
    assert last["tools"] == found["tools"]
    assert [message["role"] for message in last["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]
    assert last["messages"][2]["content"] == "Tools loaded, now callable: crm__lookup_customer."
