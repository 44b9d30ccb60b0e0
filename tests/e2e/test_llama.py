"""A real inference server behind the proxy: llama.cpp's llama-server with Gemma 3 270M on the
CPU (tests/e2e/llama.py). Each case goes through the proxy and straight to the server at
temperature 0, and the two must agree: the same tokens, the same scores, the streamed deltas
a prefix of the done list.

The model is a base model that repeats the last user message: each prompt is what it should
say, and a stop string ends it (tests/e2e/llama.py)."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesCompactionSession,
    OpenAIResponsesWSModel,
    Runner,
    SQLiteSession,
    set_tracing_disabled,
)

from tests.client import CONTEXT_LENGTH_EXCEEDED, envelope, parse_sse
from tests.e2e.llama import IM_END, SAME_EVERY_TIME, TOOL_END, behind_the_proxy
from tests.events import Stream, as_response_logprob, check_stream
from tests.test_websocket import one_turn

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINKING = "<think>\n2+2 is 4.\n</think>\n\nThe answer is 4."


class Direct:
    """What the server itself answers to the chat request the proxy should have sent."""

    def __init__(self, server: str, http: aiohttp.ClientSession) -> None:
        self.server, self.http = server, http

    async def call(self, body: dict[str, Any], stream: bool) -> dict[str, Any]:
        """The answer, non-streamed as it is; streamed, folded into the same shape."""
        chat = {"model": "m", "temperature": 0, **SAME_EVERY_TIME, **body, "stream": stream}
        async with self.http.post(f"{self.server}/v1/chat/completions", json=chat) as response:
            if not stream:
                assert response.status == 200, await response.text()
                return dict(await response.json())
            assert response.status == 200, await response.text()
            raw = await response.read()
        folded: dict[str, Any] = {"content": "", "reasoning_content": "", "scores": [], "tool_calls": {}, "finish_reason": None}
        for frame in raw.split(b"\n\n"):
            if not frame.startswith(b"data: {"):
                continue
            for choice in orjson.loads(frame[6:]).get("choices", []):
                delta = choice.get("delta") or {}
                folded["content"] += delta.get("content") or ""
                folded["reasoning_content"] += delta.get("reasoning_content") or ""
                folded["scores"] += (choice.get("logprobs") or {}).get("content") or []
                for call in delta.get("tool_calls") or []:
                    slot = folded["tool_calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                    slot["name"] += (call.get("function") or {}).get("name") or ""
                    slot["arguments"] += (call.get("function") or {}).get("arguments") or ""
                folded["finish_reason"] = choice.get("finish_reason") or folded["finish_reason"]
        return folded


async def streamed(http: aiohttp.ClientSession, proxy: str, body: dict[str, Any]) -> Stream:
    async with http.post(f"{proxy}/v1/responses", json={"model": "m", "temperature": 0, **body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        return check_stream(parse_sse(await response.read()))


async def plain(http: aiohttp.ClientSession, proxy: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{proxy}/v1/responses", json={"model": "m", "temperature": 0, **body}) as response:
        assert response.status == 200, await response.text()
        return dict(await response.json())


def scores_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    messages = [item for item in response["output"] if item["type"] == "message"]
    return messages[0]["content"][0]["logprobs"] if messages else []


def text_of(response: dict[str, Any], kind: str = "message") -> str:
    item = next(item for item in response["output"] if item["type"] == kind)
    return "".join(part["text"] for part in item["content"])


def expected(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [as_response_logprob(entry) for entry in entries]


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 3}
CHAT_LOGPROBS = {"logprobs": True, "top_logprobs": 3}


async def test_free_text_token_for_token(start_proxy, http: aiohttp.ClientSession) -> None:
    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, server):
        direct = Direct(server, http)
        chat = {"messages": messages("Say hi to the tests."), "stop": [IM_END], **CHAT_LOGPROBS}
        whole, folded = await direct.call(chat, stream=False), await direct.call(chat, stream=True)
        body = {"input": "Say hi to the tests.", **LOGPROBS}
        response = await plain(http, proxy, body)
        assert text_of(response) == whole["choices"][0]["message"]["content"] != ""
        assert scores_of(response) == expected(whole["choices"][0]["logprobs"]["content"])
        stream = await streamed(http, proxy, body)
        assert stream.text == folded["content"]
        assert stream.logprobs == expected(folded["scores"])  # check_stream: the deltas' scores are a prefix


async def test_json_schema(start_proxy, http: aiohttp.ClientSession) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": False}
    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, server):
        chat = {"messages": messages("Describe Qwen as JSON."), "response_format": {"type": "json_schema", "json_schema": {"name": "who", "schema": schema, "strict": True}}, **CHAT_LOGPROBS}
        whole = await Direct(server, http).call(chat, stream=False)
        text = {"format": {"type": "json_schema", "name": "who", "schema": schema, "strict": True}}
        response = await plain(http, proxy, {"input": "Describe Qwen as JSON.", "text": text, **LOGPROBS})
        assert text_of(response) == whole["choices"][0]["message"]["content"]
        assert set(orjson.loads(text_of(response))) == {"name", "age"}
        assert scores_of(response) == expected(whole["choices"][0]["logprobs"]["content"])


async def test_a_tool_call(start_proxy, http: aiohttp.ClientSession) -> None:
    async with behind_the_proxy(start_proxy, "tools", TOOL_END) as (proxy, server):
        direct = Direct(server, http)
        chat_tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
        chat = {"messages": messages(CALL), "tools": chat_tools, "stop": [TOOL_END]}
        whole = await direct.call({**chat, **CHAT_LOGPROBS}, stream=False)
        (expected_call,) = whole["choices"][0]["message"]["tool_calls"]
        response = await plain(http, proxy, {"input": CALL, "tools": [WEATHER], **LOGPROBS})
        (call,) = [item for item in response["output"] if item["type"] == "function_call"]
        assert (call["name"], orjson.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
        assert call["arguments"] == expected_call["function"]["arguments"]
        assert scores_of(response) == expected(whole["choices"][0]["logprobs"]["content"])  # on the empty message (3.9)
        # Streamed: llama.cpp gives no scores with tools, so none are asked.
        folded = await direct.call(chat, stream=True)
        stream = await streamed(http, proxy, {"input": CALL, "tools": [WEATHER]})
        (call,) = stream.of_type("function_call")
        assert call["arguments"] == folded["tool_calls"][0]["arguments"] and stream.terminal == "response.completed"
        # Asked anyway, its refusal says what to change (design.md 6.13).
        async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": CALL, "tools": [WEATHER], "stream": True, **LOGPROBS}) as refused:
            assert refused.status == 400
            assert envelope(await refused.json())["param"] == "include"


async def test_reasoning(start_proxy, http: aiohttp.ClientSession) -> None:
    async with behind_the_proxy(start_proxy, "reasoning", IM_END, reasoning_field="reasoning_content") as (proxy, server):
        direct = Direct(server, http)
        chat = {"messages": messages(THINKING), "stop": [IM_END], **CHAT_LOGPROBS}
        whole, folded = await direct.call(chat, stream=False), await direct.call(chat, stream=True)
        body = {"input": THINKING, "reasoning": {"summary": "auto"}, **LOGPROBS}
        response = await plain(http, proxy, body)
        message = whole["choices"][0]["message"]
        assert text_of(response, "reasoning") == message["reasoning_content"] and text_of(response) == message["content"] != ""
        assert scores_of(response) == expected(whole["choices"][0]["logprobs"]["content"])
        stream = await streamed(http, proxy, body)
        (reasoning,) = stream.of_type("reasoning")
        assert reasoning["content"][0]["text"] == folded["reasoning_content"] and reasoning["summary"][0]["text"] == folded["reasoning_content"]
        assert stream.text == folded["content"]
        assert stream.logprobs == expected(folded["scores"])


async def test_max_output_tokens_cuts(start_proxy, http: aiohttp.ClientSession) -> None:
    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, server):
        chat = {"messages": messages("Write a long poem about the sea and the sky."), "max_tokens": 5, **CHAT_LOGPROBS}
        whole = await Direct(server, http).call(chat, stream=False)
        body = {"input": "Write a long poem about the sea and the sky.", "max_output_tokens": 5, **LOGPROBS}
        for response in (await plain(http, proxy, body), (await streamed(http, proxy, body)).response):
            assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
            assert response["usage"]["output_tokens"] == 5
            assert text_of(response) == whole["choices"][0]["message"]["content"]
        assert scores_of(response) == expected(whole["choices"][0]["logprobs"]["content"])


async def test_the_top_logprobs_cap(start_proxy, http: aiohttp.ClientSession) -> None:
    async with behind_the_proxy(start_proxy, "tools", IM_END, max_top_logprobs=2) as (proxy, server):
        whole = await Direct(server, http).call({"messages": messages("Say hi."), "stop": [IM_END], "logprobs": True, "top_logprobs": 2}, stream=False)
        response = await plain(http, proxy, {"input": "Say hi.", "include": ["message.output_text.logprobs"], "top_logprobs": 10})
        assert response["top_logprobs"] == 2
        assert {len(score["top_logprobs"]) for score in scores_of(response)} == {2}
        assert scores_of(response) == expected(whole["choices"][0]["logprobs"]["content"])
        # None asked: llama-server, asked for one (asked for none it keeps no scores), and the
        # proxy drops it (design.md 3.1). Its logprobs differ from those with two in the 6th digit.
        response = await plain(http, proxy, {"input": "Say hi.", "include": ["message.output_text.logprobs"]})
        got, want = scores_of(response), expected(whole["choices"][0]["logprobs"]["content"])
        assert response["top_logprobs"] == 0
        assert [(s["token"], s["bytes"], s["top_logprobs"]) for s in got] == [(s["token"], s["bytes"], []) for s in want]
        assert [s["logprob"] for s in got] == pytest.approx([s["logprob"] for s in want], abs=1e-4)


async def test_a_prompt_over_the_context(start_proxy, http: aiohttp.ClientSession) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 150  # well over 512 tokens
    async with behind_the_proxy(start_proxy, "tools", IM_END, ctx=512) as (proxy, _):
        async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": prompt, "stream": True}) as response:
            assert response.status == 200
            events = parse_sse(await response.read())
        assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"] == CONTEXT_LENGTH_EXCEEDED
        async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": prompt}) as response:
            assert response.status == 400
            envelope(await response.json(), CONTEXT_LENGTH_EXCEEDED)


async def test_streams_and_plain_calls_in_turn_on_pooled_connections(start_proxy, http: aiohttp.ClientSession) -> None:
    """llama-server closes the connection after each stream (design.md 6.12): none of these
    calls may fail for a connection it closed."""
    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, _):
        statuses = []
        for i in range(60):
            async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": "Hi.", "max_output_tokens": 3, "stream": i % 2 == 0}) as response:
                await response.read()
                statuses.append(response.status)
        assert set(statuses) == {200}


async def test_the_websocket_transport_and_compaction(start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 8.9, 8.10 with a real server: a turn over the WebSocket is the stream's tokens
    and scores; a turn past its compaction threshold ends with the model's summary, sealed,
    and the next turn that sends it back is answered."""
    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, _):
        body = {"input": "Say hi to the tests.", **LOGPROBS}
        stream = await streamed(http, proxy, body)
        async with http.ws_connect(f"{proxy}/v1/responses") as socket:
            events = await one_turn(socket, {"type": "response.create", "model": "m", "temperature": 0, **body})
        over_the_socket = check_stream(events)
        assert (over_the_socket.text, over_the_socket.logprobs) == (stream.text, stream.logprobs)

        compacting = {"input": "Say hi to the tests.", "context_management": [{"type": "compaction", "compact_threshold": 1}]}
        response = await plain(http, proxy, compacting)
        answer, item = response["output"]
        assert (answer["type"], item["type"], response["status"]) == ("message", "compaction", "completed")
        assert response["usage"]["output_tokens"] > len(stream.logprobs)  # the answer's and the summary's
        after = await plain(http, proxy, {"input": [item, {"role": "user", "content": "Say bye."}]})
        assert text_of(after) != ""


async def test_input_tokens_are_counted_as_the_call_takes_them(start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 8.12 with a real server: llama-server renders the chat template
    (/apply-template) and tokenizes it; the count is the prompt the call then reports."""
    async with behind_the_proxy(start_proxy, "tools", IM_END, dialect="llama.cpp") as (proxy, _):
        body = {"model": "m", "instructions": "Be brief.", "input": "Say hi to the tests.", "tools": [WEATHER]}
        async with http.post(f"{proxy}/v1/responses/input_tokens", json=body) as counted:
            assert counted.status == 200, await counted.text()
            count = (await counted.json())["input_tokens"]
        response = await plain(http, proxy, body)
        assert count == response["usage"]["input_tokens"] > 0


async def test_openai_agents_compacts_over_the_websocket(start_proxy, tmp_path) -> None:
    """design.md 8.8, 8.9 with a real server and a real client: openai-agents over the WebSocket
    transport, with its compaction session (the model writes the summary). The AI SDK's tool
    loop is not run here: this model calls its tool until the token limit, at every run."""
    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, _):
        set_tracing_disabled(True)
        async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
            model = OpenAIResponsesWSModel(model="gpt-oss-20b", openai_client=client)
            session = OpenAIResponsesCompactionSession(
                "llama", SQLiteSession("llama", str(tmp_path / "session.db")), client=client, model="gpt-oss-20b", should_trigger_compaction=lambda _: True
            )
            agent = Agent(name="echo", model=model, model_settings=ModelSettings(temperature=0))
            result = Runner.run_streamed(agent, "Say hi to the tests.", session=session)
            async for _ in result.stream_events():
                pass
            await model.close()
            items = await session.get_items()
        assert result.final_output.startswith("Say h")  # the model repeats (near enough) what it is asked
        assert items[-1]["type"] == "compaction"
