"""Non-streaming `POST /v1/responses` through the real proxy and a fake upstream: what the
upstream was asked, and the Response the client got (design.md 3, 5 and 6)."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

import openai.types.responses as sdk_types
import pytest

from proxy.config import parse, single_upstream
from tests.client import LOGPROBS, create, envelope, output_text, validate_response
from tests.events import as_response_logprob
from tests.fake_upstream import Generation, Reply, Step, score, sglang_error, vllm_error
from tests.harness import sample, scrape

BODY = {"model": "m", "input": "hi"}
DIALECTS = ["sglang", "vllm"]


def scores(generation: Generation) -> list[dict]:
    """Every chat logprob entry the generation carries, in order."""
    return [entry for step in generation.steps for entry in step.scores]


def text_generation(dialect: str = "sglang", finish: str = "stop") -> Generation:
    return Generation(
        [
            Step("text", "Hel", [score("Hel", -0.1, top=3)]),
            Step("text", "lo", [score("lo", -0.2, top=3)]),
            Step("finish", finish_reason=finish, scores=[score("<eos>", -0.3, top=3)]),
        ],
        dialect=dialect,
    )


def full_generation(dialect: str = "sglang") -> Generation:
    """Reasoning, text and a tool call in one answer."""
    return Generation(
        [
            Step("reasoning", "Let me think.", [score("Let"), score(" think.")]),
            Step("text", "Checking.", [score("Checking.")]),
            Step("tool", '{"city":', [score('{"city":')], tool_id="call_abc", tool_name="weather"),
            Step("tool", ' "Paris"}', [score(' "Paris"}')]),
            Step("finish", finish_reason="tool_calls", scores=[score("<eos>")]),
        ],
        reasoning_tokens=2,
        dialect=dialect,
    )


@pytest.fixture
def ask(upstream, proxy, http):
    """Script one reply, POST a Response request, check it validates; (chat request, Response)."""

    async def ask(reply: Generation | Reply, **body: Any) -> tuple[dict, dict]:
        upstream.script(reply if isinstance(reply, Reply) else Reply(reply))
        status, response = await create(http, proxy, {**BODY, **body})
        assert status == 200, response
        validate_response(response)
        assert len(upstream.requests) == 1
        return upstream.requests[-1], response

    return ask


def logprob_keys(chat: dict) -> dict:
    return {key: chat[key] for key in ("logprobs", "top_logprobs") if key in chat}


# -- logprobs -----------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("include", "requested", "sent", "echo"),
    [
        (True, 15, 15, 15),
        (True, None, 0, 0),
        (False, 5, None, 5),
        (True, 21, 20, 20),
        (False, 21, None, 20),
    ],
)
async def test_logprobs_requested_and_returned(ask, dialect, include, requested, sent, echo):
    generation = text_generation(dialect)
    body: dict[str, Any] = {"include": LOGPROBS} if include else {}
    if requested is not None:
        body["top_logprobs"] = requested
    chat, response = await ask(generation, **body)
    assert logprob_keys(chat) == ({} if sent is None else {"logprobs": True, "top_logprobs": sent})
    assert chat["stream"] is False and "stream_options" not in chat
    assert response["top_logprobs"] == echo
    part = output_text(response)
    assert part["text"] == "Hello"
    assert part["logprobs"] == (scores(generation) if include else [])


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_scores_sent_anyway_without_include_are_not_returned(ask, dialect):
    generation = text_generation(dialect)
    chat, response = await ask(Reply(body=generation.completion(logprobs=True)), top_logprobs=2)
    assert logprob_keys(chat) == {}
    assert output_text(response)["logprobs"] == []


async def test_null_logprob_and_missing_bytes(ask):
    entries = [score("é", None, top=3, with_bytes=False), score("x", -1.5, with_bytes=False), score("!", None)]
    generation = Generation([Step("text", "éx!", entries), Step("finish", finish_reason="stop")])
    _, response = await ask(generation, include=LOGPROBS, top_logprobs=3)
    returned = output_text(response)["logprobs"]
    assert returned == [as_response_logprob(entry) for entry in entries]
    assert returned[0]["logprob"] == -9999.0 and returned[0]["bytes"] == [0xC3, 0xA9]


@pytest.mark.parametrize("cap", [3, 0])
async def test_route_cap(upstream, start_proxy, http, cap):
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "max_top_logprobs": cap}]}))
    upstream.script(Reply(text_generation()))
    status, response = await create(http, url, {**BODY, "include": LOGPROBS, "top_logprobs": 15})
    assert status == 200, response
    assert logprob_keys(upstream.requests[-1]) == {"logprobs": True, "top_logprobs": cap}
    assert response["top_logprobs"] == cap


async def test_route_without_logprobs_refuses_include(upstream, start_proxy, http):
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "logprobs": False}]}))
    status, body = await create(http, url, {**BODY, "include": LOGPROBS})
    assert status == 400
    assert body["error"]["param"] == "include"
    assert upstream.requests == []


# -- output items -------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("include", [True, False])
async def test_reasoning_text_and_tool_call(ask, dialect, include):
    generation = full_generation(dialect)
    _, response = await ask(generation, **({"include": LOGPROBS} if include else {}))
    assert response["status"] == "completed" and response["completed_at"] is not None
    assert response["model"] == BODY["model"] and response["id"].startswith("resp_")
    reasoning, message, call = response["output"]
    assert [item["type"] for item in response["output"]] == ["reasoning", "message", "function_call"]
    assert all(item["status"] == "completed" for item in response["output"])
    assert reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert message["id"].startswith("msg_") and message["role"] == "assistant"
    assert message["content"] == [
        {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": scores(generation) if include else []}
    ]
    assert call["id"].startswith("fc_")
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_abc", "weather", '{"city": "Paris"}')
    if include:
        assert len(output_text(response)["logprobs"]) == response["usage"]["output_tokens"]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("step", "kind"),
    [
        (Step("tool", "{}", [score("{}")], tool_id="call_x", tool_name="ping"), "function_call"),
        (Step("reasoning", "Hmm.", [score("Hmm.")]), "reasoning"),
    ],
    ids=["tool-only", "reasoning-only"],
)
@pytest.mark.parametrize("include", [True, False])
async def test_answer_without_text(ask, dialect, step, kind, include):
    """design.md 3.9: scores but no text part -> an empty output_text carries them, after the
    other items; without the include no message is made up."""
    finish = "tool_calls" if kind == "function_call" else "stop"
    generation = Generation([step, Step("finish", finish_reason=finish, scores=[score("<eos>")])], dialect=dialect)
    _, response = await ask(generation, **({"include": LOGPROBS} if include else {}))
    assert [item["type"] for item in response["output"]] == ([kind, "message"] if include else [kind])
    if include:
        assert response["output"][-1]["content"] == [
            {"type": "output_text", "text": "", "annotations": [], "logprobs": scores(generation)}
        ]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_parallel_tool_calls(ask, dialect):
    calls = [("call_0", "weather", '{"city": "Paris"}'), ("call_1", "time", '{"tz": "CET"}')]
    steps = [Step("tool", args, [score(name)], tool_index=i, tool_id=cid, tool_name=name) for i, (cid, name, args) in enumerate(calls)]
    generation = Generation([*steps, Step("finish", finish_reason="tool_calls")], dialect=dialect)
    _, response = await ask(generation)
    assert [(item["call_id"], item["name"], item["arguments"]) for item in response["output"]] == calls


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("finish", "status", "reason"),
    [("stop", "completed", None), ("length", "incomplete", "max_output_tokens"), ("content_filter", "incomplete", "content_filter")],
)
async def test_finish_reason(ask, dialect, finish, status, reason):
    chat, response = await ask(text_generation(dialect, finish), max_output_tokens=3)
    assert (chat["max_completion_tokens"], chat["max_tokens"]) == (3, 3)
    assert response["max_output_tokens"] == 3
    assert response["status"] == status
    assert response["incomplete_details"] == (reason and {"reason": reason})
    assert (response["completed_at"] is not None) == (status == "completed")
    (message,) = response["output"]
    assert message["status"] == status


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("reasoning", "cached"), [(0, 0), (3, 4)])
async def test_usage(ask, dialect, reasoning, cached):
    generation = Generation(
        text_generation().steps, prompt_tokens=11, completion_tokens=5,
        reasoning_tokens=reasoning, cached_tokens=cached, dialect=dialect,
    )
    _, response = await ask(generation)
    assert response["usage"] == {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": 16,
    }


async def test_request_translation_reaches_upstream(ask):
    tool = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}
    chat, response = await ask(
        text_generation(),
        instructions="be brief",
        input=[{"role": "user", "content": "hi"}],
        tools=[tool],
        tool_choice={"type": "function", "name": "weather"},
        temperature=0.2,
        reasoning={"effort": "low"},
    )
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "weather", "parameters": tool["parameters"]}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert (chat["temperature"], chat["reasoning_effort"]) == (0.2, "low")
    assert (response["instructions"], response["temperature"], response["tool_choice"]) == (
        "be brief", 0.2, {"type": "function", "name": "weather"},
    )
    assert response["reasoning"]["effort"] == "low"


async def test_json_schema_format(upstream, proxy, http):
    """Checked against the openai SDK's model only: openresponses-types 2.4.0 types
    `JsonSchemaResponseFormat.schema` as None, so no echo of a real schema can pass it."""
    fmt = {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
    upstream.script(Reply(text_generation()))
    status, response = await create(http, proxy, {**BODY, "text": {"format": fmt}})
    assert status == 200, response
    sdk_types.Response.model_validate(response)
    expected = {k: fmt[k] for k in ("name", "schema", "strict")}
    assert upstream.requests[-1]["response_format"] == {"type": "json_schema", "json_schema": expected}
    assert {k: v for k, v in response["text"]["format"].items() if v is not None} == fmt


async def test_route_rewrites_model_and_refuses_unknown(upstream, start_proxy, http):
    """The upstream gets the route's model name, the client sees its own; a model no route
    serves is a 404 on `model`, the upstream never asked."""
    routes = [{"model": "chat-*", "upstream": "u", "rewrite_model": "Qwen/Qwen3-8B"}]
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "routes": routes}))
    status, body = await create(http, url, {**BODY, "model": "other"})
    assert status == 404
    assert envelope(body)["param"] == "model"
    assert upstream.requests == []
    upstream.script(Reply(text_generation()))
    status, response = await create(http, url, {**BODY, "model": "chat-small"})
    assert status == 200, response
    assert upstream.requests[-1]["model"] == "Qwen/Qwen3-8B"
    assert response["model"] == "chat-small"


async def test_openai_sdk(upstream, sdk):
    generation = full_generation()
    upstream.script(Reply(generation))
    response = await sdk.responses.create(model="m", input="hi", include=LOGPROBS, top_logprobs=2)
    assert logprob_keys(upstream.requests[-1]) == {"logprobs": True, "top_logprobs": 2}
    assert response.output_text == "Checking."
    assert response.top_logprobs == 2
    message = next(item for item in response.output if item.type == "message")
    assert [lp.model_dump() for lp in message.content[0].logprobs] == scores(generation)
    call = next(item for item in response.output if item.type == "function_call")
    assert (call.call_id, call.name, call.arguments) == ("call_abc", "weather", '{"city": "Paris"}')


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "input": "hi"', None),
        (b'["hi"]', None),
        ({**BODY, "include": ["message.output_text.logprobs", "everything"]}, "include[1]"),
        ({**BODY, "previous_response_id": "resp_1"}, "previous_response_id"),
        ({**BODY, "top_logprobs": -1}, "top_logprobs"),
        ({**BODY, "top_logprobs": "3"}, "top_logprobs"),
        ({**BODY, "input": []}, "input"),
    ],
    ids=["malformed", "array", "include", "previous_response_id",
         "top_logprobs-negative", "top_logprobs-string", "empty-input"],
)
async def test_bad_input(upstream, proxy, http, body, param):
    kwargs = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    async with http.post(f"{proxy}/v1/responses", **kwargs) as response:
        assert response.status == 400
        error = envelope(await response.json())
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("reply", "status", "code"),
    [
        (sglang_error(400, "This model's maximum context length is 32768 tokens.", "messages"), 400, "context_length_exceeded"),
        (vllm_error(400, "top_logprobs must be at most 20"), 400, "invalid_request_error"),
        (vllm_error(404, "The model `m` does not exist."), 404, "not_found"),
        (vllm_error(408, "the request took too long"), 408, "request_timeout"),
        (vllm_error(429, "too many requests"), 429, "rate_limit_exceeded"),
        (sglang_error(500, "CUDA out of memory"), 502, "server_error"),
        (vllm_error(503, "overloaded"), 502, "server_error"),
        (Reply(status=200, body=b"<html>not json</html>"), 502, "upstream_protocol_error"),
        (Reply(status=200, body=b""), 502, "upstream_protocol_error"),
        (Reply(status=200, body={"object": "chat.completion", "choices": []}), 502, "upstream_protocol_error"),
    ],
    ids=["sglang-400", "vllm-400", "vllm-404", "vllm-408", "vllm-429", "sglang-500", "vllm-503", "non-json-200", "empty-200", "no-choices-200"],
)
async def test_upstream_error(upstream, proxy, http, reply, status, code):
    upstream.script(reply)
    answered, body = await create(http, proxy, BODY)
    assert answered == status
    error = envelope(body, code)
    if status < 500:  # the upstream's own words reach the client (SGLang flat, vLLM nested)
        sent = reply.body.get("error", reply.body)
        assert (error["message"], error["param"]) == (sent["message"], sent["param"])
        assert error["type"] == "invalid_request_error"
    assert len(upstream.requests) == 1


async def test_upstream_unreachable(start_proxy, http):
    url = await start_proxy(single_upstream("http://127.0.0.1:1"))
    status, body = await create(http, url, BODY)
    assert status == 502
    assert envelope(body)["type"] == "server_error"


# -- other endpoints ----------------------------------------------------------------------


async def test_health_and_the_metrics_name_the_installed_version(proxy, http):
    """design.md 12.2: what runs is the distribution's version, as its metadata has it."""
    installed = importlib.metadata.version("responses-proxy")
    async with http.get(f"{proxy}/health") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok", "version": installed}
    metrics = await scrape(http, proxy)
    assert sample(metrics, "proxy_build_info", version=installed, python=platform.python_version()) == 1


async def test_models_pass_through(upstream, proxy, http):
    async with http.get(f"{upstream.url}/v1/models") as direct, http.get(f"{proxy}/v1/models") as proxied:
        assert proxied.status == direct.status == 200
        assert await proxied.json() == await direct.json()
