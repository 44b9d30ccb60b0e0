"""What the newest openai SDK sends and streams (design.md 8.1, 8.8, 8.15), through the real proxy
with the SDK as the client, its own types checking every answer: OpenAI's prompt-cache options and
breakpoints accepted and kept, what cannot be honoured refused by name, and the compaction event
its streams type."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import openai
import pydantic
import pytest
from openai.types.responses import ResponseInputText, ResponsesServerEvent

from proxy.config import parse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.test_websocket import one_turn

HI = Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")])
SERVER_EVENT = pydantic.TypeAdapter(ResponsesServerEvent)


@pytest.fixture
async def strict(upstream: FakeUpstream, start_proxy) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK against a proxy that refuses every field it does not know."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "requests": {"unknown_fields": "reject"}}))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10, _strict_response_validation=True)
    yield client
    await client.close()


async def test_prompt_cache_options_and_breakpoints_are_accepted_and_kept(upstream: FakeUpstream, strict: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(HI))
    part = {"type": "input_text", "text": "Hello", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}
    made = await strict.responses.create(
        model="m",
        input=[{"role": "user", "content": [part]}],  # type: ignore[list-item]
        prompt_cache_options={"mode": "explicit", "ttl": "12h"},
        access_programs={"cyber": "standard"},
        background_options={"continuation_id": "c1"},
    )
    assert made.status == "completed"
    sent = upstream.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "Hello"}]
    assert not {"prompt_cache_options", "access_programs", "background_options"} & sent.keys()
    (kept,) = [item async for item in strict.responses.input_items.list(made.id)]
    assert kept.type == "message" and isinstance(kept.content[0], ResponseInputText)
    breakpoint = kept.content[0].prompt_cache_breakpoint
    assert breakpoint is not None and (breakpoint.mode, breakpoint.ttl) == ("explicit", "12h")  # kept with its item


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"image": {"context_compression": "enabled"}}, "image.context_compression"),
    ],
)
async def test_what_no_chat_server_here_does_is_a_400_naming_it(upstream: FakeUpstream, strict: openai.AsyncOpenAI, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await strict.responses.create(model="m", input="hi", **fields)
    assert (refused.value.param, refused.value.code) == (param, "unsupported_parameter")
    assert upstream.requests == []


async def test_a_compaction_trigger_turn_over_the_websocket_streams_the_compaction_event(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """design.md 8.8: the SDK's `response.compaction.compacting` names the compaction item, between
    its added and done, as over HTTP."""
    upstream.script(Reply(Generation([Step("text", "The user said hello."), Step("finish", finish_reason="stop")])))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        events = await one_turn(socket, {"type": "response.create", "model": "m", "input": [{"role": "user", "content": "hello"}, {"type": "compaction_trigger"}]})
    for event in events:
        SERVER_EVENT.validate_python(event)
    kinds = [event["type"] for event in events]
    at = kinds.index("response.compaction.compacting")
    assert kinds[at - 1 : at + 2] == ["response.output_item.added", "response.compaction.compacting", "response.output_item.done"]
    (item,) = events[-1]["response"]["output"]
    assert item["type"] == "compaction" and events[at]["item_id"] == item["id"]
