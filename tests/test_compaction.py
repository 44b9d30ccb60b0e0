"""Compaction (design.md 8.8): POST /v1/responses/compact through the real proxy with the openai
SDK as the client; the model writes the summary, the `compaction` item carries it sealed, and
the item sent back as input becomes the summary in the conversation."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.config import parse
from proxy.responses.compaction import HEAD, PROMPT
from proxy.responses.sealing import Sealer, derive_key
from tests.client import parse_sse, validate_event, validate_response
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import sample, scrape

SUMMARY = "The user wants the tests fixed; test_a fails on a missing import in a.py."
SUMMARISED = Generation([Step("text", SUMMARY), Step("finish", finish_reason="stop")], prompt_tokens=90, completion_tokens=17)
HI = Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")], completion_tokens=1)
TOOLS = [{"type": "function", "name": "exec", "parameters": {"type": "object", "properties": {}}}]
HISTORY: list[Any] = [
    {"type": "message", "role": "developer", "content": "You are a coding agent."},
    {"type": "message", "role": "user", "content": "fix the tests"},
    {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": '{"cmd": "pytest"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "test_a failed: ImportError in a.py"},
    {"type": "message", "role": "assistant", "content": "test_a fails on an import."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
]


async def test_a_conversation_compacts_and_goes_on_from_its_summary(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(SUMMARISED), Reply(HI))
    compacted = await sdk.responses.compact(model="m", input=HISTORY, extra_body={"tools": TOOLS})  # type: ignore[arg-type]
    asked = upstream.requests[-1]
    assert asked["messages"][-1] == {"role": "user", "content": PROMPT}
    assert "tools" not in asked and asked["stream"] is False  # the model writes text
    assert [m["role"] for m in asked["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user", "user"]
    assert compacted.object == "response.compaction"
    *kept, item = [entry.model_dump(exclude_none=True) for entry in compacted.output]
    assert [part["text"] for message in kept for part in message["content"]] == ["fix the tests", "go on"]
    assert item["type"] == "compaction" and SUMMARY not in item["encrypted_content"]  # sealed
    assert compacted.usage.input_tokens == 90 and compacted.usage.output_tokens == 17

    answer = await sdk.responses.create(model="m", input=[*(entry.model_dump(exclude_none=True) for entry in compacted.output), {"role": "user", "content": "and now?"}])
    assert answer.status == "completed"
    assert upstream.requests[-1]["messages"] == [
        {"role": "user", "content": "fix the tests"},
        {"role": "user", "content": "go on"},
        {"role": "user", "content": HEAD + SUMMARY},
        {"role": "user", "content": "and now?"},
    ]


async def test_codexs_older_name_of_the_item_is_read(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(HI))
    body = {"model": "m", "input": [{"type": "compaction_summary", "encrypted_content": "The user asked for a poem."}, {"role": "user", "content": "next"}]}
    async with http.post(f"{proxy}/v1/responses", json=body) as response:
        assert response.status == 200, await response.text()
    assert upstream.requests[-1]["messages"][0] == {"role": "user", "content": HEAD + "The user asked for a poem."}


@pytest.mark.parametrize(
    ("blob", "read"),
    [
        pytest.param("The user asked for a haiku about rivers; one was written.", True, id="a-peers-plain-text"),
        pytest.param(Sealer(derive_key("another proxy's key")).seal(SUMMARY), False, id="sealed-with-another-key"),
        pytest.param("gAAAAABn" + "x" * 200, False, id="openais-own-blob"),
    ],
)
async def test_a_compaction_item_it_cannot_read(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, blob: str, read: bool
) -> None:
    """design.md 8.8: another server's plain text is read as the summary; a blob that does not
    open is dropped and counted, never a 400."""
    upstream.script(Reply(HI))
    body = {"model": "m", "input": [{"type": "compaction", "encrypted_content": blob}, {"role": "user", "content": "next"}]}
    async with http.post(f"{proxy}/v1/responses", json=body) as response:
        assert response.status == 200, await response.text()
    messages = upstream.requests[-1]["messages"]
    assert messages[:-1] == ([{"role": "user", "content": HEAD + blob}] if read else [])
    dropped = sample(await scrape(http, proxy), "proxy_ignored_total", what="input:unreadable_compaction")
    assert dropped == (0 if read else 1)


async def test_a_chain_compacts_with_its_stored_turns(upstream: FakeUpstream, start_proxy, tmp_path) -> None:
    """The chain's user messages are the compacted output's too (`previous_response_id`)."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": {"url": f"sqlite:{tmp_path}/r.db"}}))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)
    try:
        upstream.script(Reply(HI), Reply(SUMMARISED))
        first = await client.responses.create(model="m", input="first question")
        compacted = await client.responses.compact(model="m", input="second question", previous_response_id=first.id)  # type: ignore[arg-type]
    finally:
        await client.close()
    texts = [entry.model_dump()["content"][0]["text"] for entry in compacted.output[:-1]]
    assert texts == ["first question", "second question"]
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["first question", "Hi", "second question", PROMPT]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_turn_ending_with_a_compaction_trigger_is_answered_by_one_compaction_item(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, stream: bool
) -> None:
    """design.md 8.8: Codex's default (compaction v2) ends a normal turn with a
    `compaction_trigger` and requires exactly one `compaction` item back, streamed as any item."""
    upstream.script(Reply(SUMMARISED), Reply(HI))
    body = {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "tools": TOOLS, "tool_choice": "required", "stream": stream}
    async with http.post(f"{proxy}/v1/responses", json=body) as answer:
        assert answer.status == 200, await answer.text()
        raw = await answer.read()
    asked = upstream.requests[-1]
    assert asked["messages"][-1] == {"role": "user", "content": PROMPT}
    # The model writes text, all at once: nothing a chat server refuses with stream false.
    assert asked["stream"] is False and not {"tools", "tool_choice", "stream_options", "parallel_tool_calls"} & asked.keys()
    if stream:
        events = parse_sse(raw)
        for event in events:
            validate_event(event)
        assert [e["type"] for e in events] == [
            "response.created", "response.in_progress", "response.output_item.added", "response.output_item.done", "response.completed",
        ]
        assert [e["sequence_number"] for e in events] == list(range(5)) and raw.endswith(b"data: [DONE]\n\n")
        response = events[-1]["response"]
    else:
        response = orjson.loads(raw)
        validate_response(response)
    (item,) = response["output"]
    assert item["type"] == "compaction" and response["status"] == "completed" and response["usage"]["output_tokens"] == 17
    async with http.get(f"{proxy}/v1/responses/{response['id']}") as kept:  # kept as any turn is
        assert kept.status == 200 and (await kept.json())["output"] == [item]
    async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": [item, {"role": "user", "content": "go on"}]}) as answer:
        assert answer.status == 200
    assert upstream.requests[-1]["messages"] == [{"role": "user", "content": HEAD + SUMMARY}, {"role": "user", "content": "go on"}]
