"""Test-side client helpers: call the proxy over HTTP, read its SSE, validate what it sent."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai.types.responses as sdk
import openresponses_types.types as spec
import orjson
import pydantic

LOGPROBS = ["message.output_text.logprobs"]

_SDK_EVENT = pydantic.TypeAdapter(sdk.ResponseStreamEvent)
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


async def stream(http: aiohttp.ClientSession, proxy: str, body: dict[str, Any]) -> list[dict]:
    """POST with `stream: true`; the events, each checked for its SSE framing."""
    async with http.post(f"{proxy}/v1/responses", json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return parse_sse(await response.read())


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


def validate_response(response: dict) -> None:
    """Both schemas the proxy promises: the openai SDK's and Open Responses'."""
    sdk.Response.model_validate(response)
    spec.ResponseResource.model_validate(response)


def validate_event(event: dict) -> None:
    _SDK_EVENT.validate_python(event)
    model = _SPEC_EVENTS.get(event["type"])
    # The spec's error event nests its fields; DESIGN section 5 follows the SDK's flat one.
    if model is not None and event["type"] != "error":
        model.model_validate(event)


def output_text(response: dict) -> dict:
    """The response's single output_text part."""
    (message,) = [item for item in response["output"] if item["type"] == "message"]
    (part,) = message["content"]
    return part
