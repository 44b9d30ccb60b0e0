"""Test-side client helpers: call the proxy over HTTP, read its SSE, validate what it sent."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai.types.responses as sdk
import openresponses_types.types as spec
import orjson
import pydantic

LOGPROBS = ["message.output_text.logprobs"]

SDK_EVENT = pydantic.TypeAdapter(sdk.ResponseStreamEvent)
# The Open Responses model of each event type, found by the `type` each model declares.
_SPEC_EVENTS: dict[str, type[pydantic.BaseModel]] = {}
for _model in vars(spec).values():
    if isinstance(_model, type) and issubclass(_model, pydantic.BaseModel) and _model.__name__.endswith("StreamingEvent"):
        _type = _model.model_fields.get("type")
        if _type is not None and hasattr(_type.annotation, "__members__"):
            for _member in _type.annotation:
                _SPEC_EVENTS[_member.value] = _model


async def create(http: aiohttp.ClientSession, proxy: str, body: dict[str, Any]) -> tuple[int, dict]:
    async with http.post(f"{proxy}/v1/responses", json=body) as response:
        return response.status, await response.json()


async def post_json(http: aiohttp.ClientSession, url: str, body: Any, **kwargs: Any) -> tuple[int, Any]:
    """POST `body` to `url` (bytes as they are, labelled JSON; anything else as JSON); the
    status and the JSON answer, whatever content type it came with."""
    data = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    async with http.post(url, **data, **kwargs) as response:
        return response.status, await response.json(content_type=None)


async def stream(http: aiohttp.ClientSession, proxy: str, body: dict[str, Any]) -> list[dict]:
    """POST with `stream: true`; the events, each checked for its SSE framing."""
    async with http.post(f"{proxy}/v1/responses", json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/event-stream", response.headers["Content-Type"]
        return parse_sse(await response.read())


async def read_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The events of an SSE response as they arrive; linear however large an event."""
    buffer, searched = bytearray(), 0
    async for data in response.content.iter_any():
        buffer += data
        start = 0
        while (end := buffer.find(b"\n\n", max(searched - 1, start))) >= 0:
            frame = bytes(buffer[start:end])
            start = end + 2
            if frame != b"data: [DONE]":
                yield orjson.loads(frame[frame.index(b"\ndata: ") + 7 :])
        del buffer[:start]
        searched = len(buffer)


def parse_sse(raw: bytes) -> list[dict]:
    frames = raw.decode().split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""], frames[-3:]
    events = []
    for frame in frames[:-2]:
        event_line, data_line = frame.split("\n")
        event = orjson.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {event['type']}"
        events.append(event)
    return events


# Output items Open Responses knows; custom tool calls and namespaces are the SDK's alone (design.md 5.1).
_SPEC_ITEMS = {"message", "function_call", "function_call_output", "reasoning"}
# The code OpenAI's API sends for a prompt over the context, which the SDK's list lacks (design.md 8.7).
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def validate_response(response: dict) -> None:
    """Both schemas the proxy promises: the openai SDK's and, for what it can express, Open
    Responses'."""
    error = response.get("error")
    if error and error.get("code") == CONTEXT_LENGTH_EXCEEDED:
        response = {**response, "error": {**error, "code": "invalid_prompt"}}
    sdk.Response.model_validate(response)
    tools = {tool["type"] for tool in response["tools"]}
    items = {item["type"] for item in response["output"]}
    if tools <= {"function"} and items <= _SPEC_ITEMS:
        spec.ResponseResource.model_validate(response)


def validate_event(event: dict) -> None:
    if "response" in event:
        validate_response(event["response"])
        event = {**event, "response": {**event["response"], "error": None}}
    SDK_EVENT.validate_python(event)
    model = _SPEC_EVENTS.get(event["type"])
    # The spec's error event nests its fields; design.md 5.1 follows the SDK's flat one.
    if model is not None and event["type"] != "error" and _SPEC_ITEMS.issuperset(_item_types(event)):
        model.model_validate(event)


def _item_types(event: dict) -> set[str]:
    if "item" in event:
        return {event["item"]["type"]}
    if "response" in event:
        return {item["type"] for item in event["response"]["output"]} | {t["type"] for t in event["response"]["tools"]}
    return set()


def envelope(body: dict, code: str | None = None, *, type: str | None = None) -> dict:
    """The OpenAI error envelope (design.md 5.3), exactly: its one `error` object, with its code
    and type checked when given."""
    assert list(body) == ["error"], body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] is None or isinstance(error["code"], str)
    if code is not None:
        assert error["code"] == code, error
    if type is not None:
        assert error["type"] == type, error
    return error


def output_text(response: dict) -> dict:
    """The response's single output_text part."""
    (message,) = [item for item in response["output"] if item["type"] == "message"]
    (part,) = message["content"]
    return part


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    """Poll `check` (plain or async) until it is true; fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
