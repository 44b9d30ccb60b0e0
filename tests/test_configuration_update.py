"""`configuration_update` input items (design.md 8.2) through the real proxy, the openai SDK as the
client (its own types checking every answer): each sets the reasoning effort and the text format
of the generations after it until a later one replaces it, in a request's input, a stored chain,
a conversation, a WebSocket's chain and a compacted history, and the chat's earlier messages stay
as they were sent, so that the upstream's prefix cache holds."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
from openai.types.responses import ResponseConfigurationUpdateItem

from tests.client import SDK_EVENT
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.test_websocket import one_turn

ANSWER = Generation([Step("text", '{"city": "Paris"}'), Step("finish", finish_reason="stop")])
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_SCHEMA = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}


def update(effort: str | None = None, text: dict[str, Any] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "configuration_update"}
    if effort is not None:
        item["reasoning"] = {"effort": effort}
    if text is not None:
        item["text"] = {"format": text}
    return item


def settings(request: dict[str, Any]) -> tuple[Any, Any]:
    """What an upstream request was sent of the two settings an update sets."""
    return request.get("reasoning_effort"), request.get("response_format")


async def test_an_update_applies_over_a_stored_chain_until_a_later_one_replaces_it(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(ANSWER))
    first = await sdk.responses.create(
        model="m", reasoning={"effort": "low"}, input=[{"role": "user", "content": "Where?"}, update("high", JSON_SCHEMA)]  # type: ignore[list-item]
    )
    assert settings(upstream.requests[-1]) == ("high", CHAT_FORMAT)
    assert first.reasoning is not None and first.reasoning.effort == "high"  # as applied
    assert first.text is not None and first.text.format is not None and first.text.format.type == "json_schema"
    # Kept with the response's input, as the SDK types it.
    listed = [item async for item in sdk.responses.input_items.list(first.id, order="asc")]
    kept = [item for item in listed if isinstance(item, ResponseConfigurationUpdateItem)]
    assert len(kept) == 1 and kept[0].reasoning is not None and kept[0].reasoning.effort == "high" and kept[0].id

    # The next turn, streamed, continues the chain: the update still applies, over the request's
    # own effort, and the earlier messages are the bytes the first turn sent.
    async with await sdk.responses.create(model="m", reasoning={"effort": "low"}, previous_response_id=first.id, input="And then?", stream=True) as events:
        async for event in events:
            SDK_EVENT.validate_python(event.model_dump(mode="json", by_alias=True, exclude_unset=True))
    before, after = upstream.requests[-2:]
    assert settings(after) == ("high", CHAT_FORMAT)
    assert after["messages"][: len(before["messages"])] == before["messages"]
    # A later update replaces what it sets, the text format back to text, and nothing else.
    third = await sdk.responses.create(model="m", previous_response_id=event.response.id, input=[update(text={"type": "text"}), {"role": "user", "content": "Plainly?"}])  # type: ignore[list-item]
    assert settings(upstream.requests[-1]) == ("high", None)
    assert third.status == "completed"
    await sdk.responses.create(model="m", previous_response_id=third.id, input=[update("minimal"), {"role": "user", "content": "Briefly?"}])  # type: ignore[list-item]
    assert settings(upstream.requests[-1]) == ("low", None)  # minimal, as chat servers take it (8.1)


async def test_a_conversation_keeps_its_updates(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(ANSWER))
    conversation = await sdk.conversations.create(items=[update("high", JSON_SCHEMA)])  # type: ignore[list-item]
    await sdk.responses.create(model="m", conversation=conversation.id, input="Where?")
    assert settings(upstream.requests[-1]) == ("high", CHAT_FORMAT)
    await sdk.conversations.items.create(conversation.id, items=[update("medium")])  # type: ignore[list-item]
    await sdk.responses.create(model="m", conversation=conversation.id, input="And then?")
    assert settings(upstream.requests[-1]) == ("medium", CHAT_FORMAT)
    types = [item.type async for item in sdk.conversations.items.list(conversation.id, order="asc")]
    assert types.count("configuration_update") == 2


async def test_a_websocket_chain_keeps_its_updates(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(ANSWER))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        first = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "input": [{"role": "user", "content": "Where?"}, update("high", JSON_SCHEMA)]})
        for event in first:
            SDK_EVENT.validate_python(event)  # (Open Responses' model holds a json_schema format's schema as null)
        assert settings(upstream.requests[-1]) == ("high", CHAT_FORMAT)
        second = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "previous_response_id": first[-1]["response"]["id"], "input": "And then?"})
        assert second[-1]["type"] == "response.completed"
    assert settings(upstream.requests[-1]) == ("high", CHAT_FORMAT)


async def test_a_compacted_history_keeps_its_updates(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    summary = Generation([Step("text", "The user asked where; the answer was Paris."), Step("finish", finish_reason="stop")])
    upstream.script(Reply(summary), Reply(ANSWER))
    history = [{"role": "user", "content": "Where?"}, update("high", JSON_SCHEMA), {"role": "assistant", "content": "Paris."}]
    # The SDK's CompactedResponse types its output as output items, where the API keeps the
    # user's messages as they were (input_text): read unchecked, as the SDK does by default.
    async with openai.AsyncOpenAI(base_url=str(sdk.base_url), api_key="unused", max_retries=0) as unchecked:
        compacted = await unchecked.responses.compact(model="m", input=history)  # type: ignore[arg-type]
    output = [entry.model_dump(exclude_none=True) for entry in compacted.output]
    assert [entry["type"] for entry in output] == ["message", "configuration_update", "compaction"]
    ResponseConfigurationUpdateItem.model_validate(output[1])
    await sdk.responses.create(model="m", input=[*output, {"role": "user", "content": "And then?"}])  # type: ignore[list-item]
    assert settings(upstream.requests[-1]) == ("high", CHAT_FORMAT)
