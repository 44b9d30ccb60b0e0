"""Compaction (design.md 8.8): POST /v1/responses/compact through the real proxy with the openai
SDK as the client; the model writes the summary, the `compaction` item carries it sealed, and
the item sent back as input becomes the summary in the conversation."""

from __future__ import annotations

import asyncio
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
    # The SDK's CompactedResponse types its output as output items, where the API keeps the
    # user's messages as they were (input_text): read unchecked, as the SDK does by default.
    async with openai.AsyncOpenAI(base_url=str(sdk.base_url), api_key="unused", max_retries=0) as unchecked:
        compacted = await unchecked.responses.compact(model="m", input=HISTORY, extra_body={"tools": TOOLS})  # type: ignore[arg-type]
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
        # The newest SDKs' compaction event, typed by them, names the item it made.
        assert [e["type"] for e in events] == [
            "response.created", "response.in_progress", "response.output_item.added", "response.compaction.compacting",
            "response.output_item.done", "response.completed",
        ]
        assert [e["sequence_number"] for e in events] == list(range(6)) and raw.endswith(b"data: [DONE]\n\n")
        response = events[-1]["response"]
        assert (events[3]["item_id"], events[3]["output_index"]) == (response["output"][0]["id"], 0)
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


# -- context_management: compaction after a turn that crossed its threshold (8.10) ---------------

ANSWER = Generation([Step("text", "Fixed: a.py imports os now."), Step("finish", finish_reason="stop")], prompt_tokens=100, completion_tokens=20)
AT_120 = [{"type": "compaction", "compact_threshold": 120}]


async def _turn(http: aiohttp.ClientSession, proxy: str, body: dict[str, Any]) -> dict[str, Any]:
    """A turn's Response, streamed (its events validated, numbered in order) or not."""
    async with http.post(f"{proxy}/v1/responses", json=body) as answer:
        assert answer.status == 200, await answer.text()
        raw = await answer.read()
    if not body.get("stream"):
        response: dict[str, Any] = orjson.loads(raw)
        validate_response(response)
        return response
    events = parse_sse(raw)
    for event in events:
        validate_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [item["type"] for item in events[-1]["response"]["output"]]
    return dict(events[-1]["response"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_turn_that_reaches_its_threshold_ends_with_a_compaction_item(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, stream: bool
) -> None:
    """design.md 8.10: the answer streams first, then the conversation, the answer included, is
    summarised; the next turn starts from the summary and the user's messages."""
    upstream.script(Reply(ANSWER), Reply(SUMMARISED), Reply(HI))
    body = {"model": "m", "input": HISTORY, "tools": TOOLS, "context_management": AT_120, "stream": stream}
    response = await _turn(http, proxy, body)
    answer, item = response["output"]
    assert (answer["type"], item["type"], response["status"]) == ("message", "compaction", "completed")
    asked = upstream.requests[-1]
    assert asked["stream"] is False and "tools" not in asked
    assert asked["messages"][-2:] == [{"role": "assistant", "content": "Fixed: a.py imports os now."}, {"role": "user", "content": PROMPT}]
    usage = response["usage"]  # the answer's and the summary's
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (190, 37, 227)

    body = {"model": "m", "input": [*HISTORY, *response["output"], {"role": "user", "content": "thanks"}]}
    await _turn(http, proxy, body)
    assert upstream.requests[-1]["messages"] == [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "fix the tests"},
        {"role": "user", "content": "go on"},
        {"role": "user", "content": HEAD + SUMMARY},
        {"role": "user", "content": "thanks"},
    ]


async def test_a_chain_goes_on_from_the_compaction_its_stored_turn_ended_with(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    upstream.script(Reply(ANSWER), Reply(SUMMARISED), Reply(HI))
    first = await _turn(http, proxy, {"model": "m", "input": "fix the tests", "context_management": AT_120})
    await _turn(http, proxy, {"model": "m", "input": "thanks", "previous_response_id": first["id"]})
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["fix the tests", HEAD + SUMMARY, "thanks"]


async def test_a_turn_under_its_threshold_is_not_compacted(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(ANSWER))
    response = await _turn(http, proxy, {"model": "m", "input": "q", "context_management": [{"type": "compaction", "compact_threshold": 121}]})
    assert [item["type"] for item in response["output"]] == ["message"] and len(upstream.requests) == 1


async def test_the_default_threshold_is_a_share_of_the_routes_context_window(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    """An entry without `compact_threshold` compacts at 80% of the upstream's `context_window`;
    without one, the entry is ignored and counted."""
    windowed = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "context_window": 150}]}))
    plain = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}]}))
    body = {"model": "m", "input": "q", "context_management": [{"type": "compaction"}, {"type": "trim_tools"}]}
    upstream.script(Reply(ANSWER), Reply(SUMMARISED), Reply(ANSWER))
    assert [item["type"] for item in (await _turn(http, windowed, body))["output"]] == ["message", "compaction"]  # 120 >= 120
    assert [item["type"] for item in (await _turn(http, plain, body))["output"]] == ["message"]
    metrics = await scrape(http, plain)
    assert sample(metrics, "proxy_ignored_total", what="context_management:compaction") == 1
    assert sample(metrics, "proxy_ignored_total", what="context_management:trim_tools") == 1


async def test_a_summary_that_fails_leaves_the_answer_whole(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """Its compaction item, added as the summary began, ends empty; a later turn drops it."""
    upstream.script(Reply(ANSWER), Reply(status=500, body={"error": {"message": "out of memory"}}), Reply(HI))
    response = await _turn(http, proxy, {"model": "m", "input": "q", "context_management": AT_120, "stream": True})
    answer, item = response["output"]
    assert (answer["type"], item["type"], item["encrypted_content"], response["status"]) == ("message", "compaction", "", "completed")
    assert response["usage"]["input_tokens"] == 100
    await _turn(http, proxy, {"model": "m", "input": [{"role": "user", "content": "q"}, *response["output"], {"role": "user", "content": "next"}]})
    assert [m["role"] for m in upstream.requests[-1]["messages"]] == ["user", "assistant", "user"]


@pytest.mark.parametrize("trigger", [True, False], ids=["compaction_trigger", "context_management"])
async def test_compacting_streams_while_the_summary_is_sampled(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, trigger: bool
) -> None:
    """design.md 8.8, 8.10: the compaction item is added and `response.compaction.compacting`
    leaves before the summary's upstream call, which takes its time; the item is done once the
    summary came."""
    sampling = 1.0
    summary = Reply(SUMMARISED, headers_delay=sampling)
    if trigger:
        upstream.script(summary)
        body = {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "stream": True}
    else:
        upstream.script(Reply(ANSWER), summary)
        body = {"model": "m", "input": HISTORY, "context_management": AT_120, "stream": True}
    arrived: list[float] = []  # when each event came
    raw = b""
    async with http.post(f"{proxy}/v1/responses", json=body) as answer:
        async for line in answer.content:
            raw += line
            if line.startswith(b"event: "):
                arrived.append(asyncio.get_running_loop().time())
    events = parse_sse(raw)
    for event in events:
        validate_event(event)
    kinds = [event["type"] for event in events]
    assert kinds[-4:] == ["response.output_item.added", "response.compaction.compacting", "response.output_item.done", "response.completed"]
    added, compacting, done = events[-4:-1]
    item = events[-1]["response"]["output"][-1]
    assert added["item"] == {**item, "encrypted_content": ""} and done["item"] == item and item["encrypted_content"]
    assert (compacting["item_id"], compacting["output_index"]) == (item["id"], len(events[-1]["response"]["output"]) - 1)
    # The event came as the summary's call began, not with its end.
    assert arrived[-2] - arrived[-3] > sampling / 2


async def test_a_tool_call_answered_after_the_compaction_stays_with_its_output(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """A turn that ends in a tool call compacts too: the call is moved after the summary, so
    that its output follows it."""
    calling = Generation([Step("tool", '{"cmd": "ls"}', tool_id="c2", tool_name="exec"), Step("finish", finish_reason="tool_calls")], prompt_tokens=150)
    upstream.script(Reply(calling), Reply(SUMMARISED), Reply(HI))
    response = await _turn(http, proxy, {"model": "m", "input": HISTORY, "tools": TOOLS, "context_management": AT_120, "stream": True})
    assert [item["type"] for item in response["output"]] == ["function_call", "compaction"]
    output = {"type": "function_call_output", "call_id": "c2", "output": "a.py b.py"}
    await _turn(http, proxy, {"model": "m", "input": [*HISTORY, *response["output"], output], "tools": TOOLS})
    assert [m["role"] for m in upstream.requests[-1]["messages"]] == ["system", "user", "user", "user", "assistant", "tool"]
    assert upstream.requests[-1]["messages"][-2]["tool_calls"][0]["id"] == "c2"


async def test_compaction_after_a_turn_in_the_background_and_on_a_websocket(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """Every transport that runs a turn ends it the same way (design.md 8.9, 10)."""
    upstream.script(Reply(ANSWER), Reply(SUMMARISED))
    queued = await _turn(http, proxy, {"model": "m", "input": "q", "context_management": AT_120, "background": True})
    async with asyncio.timeout(10):
        while (ended := await _stored(http, proxy, queued["id"]))["status"] in ("queued", "in_progress"):
            await asyncio.sleep(0.05)
    assert [item["type"] for item in ended["output"]] == ["message", "compaction"]

    upstream.script(Reply(ANSWER), Reply(SUMMARISED))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "q", "context_management": AT_120})
        events = []
        while not events or events[-1]["type"] != "response.completed":
            events.append(await socket.receive_json(timeout=10))
    for event in events:
        validate_event(event)
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["message", "compaction"]


async def _stored(http: aiohttp.ClientSession, proxy: str, id: str) -> dict[str, Any]:
    async with http.get(f"{proxy}/v1/responses/{id}") as response:
        assert response.status == 200
        return dict(await response.json())


async def test_a_chain_alone_compacts_with_no_input(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """openai-agents' compaction session in its `previous_response_id` mode sends no `input`:
    the conversation is the chain's; with neither, `input` is missing (a 400 naming it)."""
    upstream.script(Reply(HI), Reply(SUMMARISED))
    first = await _turn(http, proxy, {"model": "m", "input": "first question"})
    async with http.post(f"{proxy}/v1/responses/compact", json={"model": "m", "previous_response_id": first["id"]}) as answer:
        assert answer.status == 200, await answer.text()
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["first question", "Hi", PROMPT]
    async with http.post(f"{proxy}/v1/responses", json={"model": "m"}) as refused:
        assert refused.status == 400 and (await refused.json())["error"]["param"] == "input"


async def test_the_summary_gets_the_answers_connection(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    """The summary is asked once the answer's upstream call is over: an upstream of one
    connection compacts too."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "max_connections": 1, "timeouts": {"connect": 1}}]}))
    for stream in (True, False):
        upstream.script(Reply(ANSWER), Reply(SUMMARISED))
        response = await _turn(http, url, {"model": "m", "input": "q", "context_management": AT_120, "stream": stream})
        assert [item["type"] for item in response["output"]] == ["message", "compaction"]


async def test_a_cancel_during_the_summary_completes_the_answer(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """A background run cancelled while its summary is made ends with its answer, whole, and
    `completed`, its compaction item empty: nothing waits on it forever."""
    upstream.script(Reply(ANSWER), Reply(SUMMARISED, headers_delay=5))
    queued = await _turn(http, proxy, {"model": "m", "input": "q", "context_management": AT_120, "background": True})
    async with asyncio.timeout(5):
        while len(upstream.requests) < 2:  # the summary asked
            await asyncio.sleep(0.02)
    async with http.post(f"{proxy}/v1/responses/{queued['id']}/cancel") as cancelled:
        assert cancelled.status == 200
    async with asyncio.timeout(5):
        while (ended := await _stored(http, proxy, queued["id"]))["status"] in ("queued", "in_progress"):
            await asyncio.sleep(0.05)
    assert ended["status"] == "completed" and [item["type"] for item in ended["output"]] == ["message", "compaction"]
    assert ended["output"][1]["encrypted_content"] == ""


async def test_a_client_that_leaves_during_the_summary_leaves_its_answer_kept(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(ANSWER), Reply(SUMMARISED, headers_delay=5))
    body = {"model": "m", "input": "q", "context_management": AT_120, "stream": True}
    async with http.post(f"{proxy}/v1/responses", json=body) as answer:
        seen = b""
        while b"response.output_item.done" not in seen:
            seen += await answer.content.readany()
        id = seen.split(b'"id":"', 2)[1].split(b'"')[0].decode()
        async with asyncio.timeout(5):
            while len(upstream.requests) < 2:
                await asyncio.sleep(0.02)
        answer.close()  # gone while the summary is made
    async with asyncio.timeout(5):
        while upstream.disconnects < 1:  # the summary call is left, not waited for
            await asyncio.sleep(0.02)
    kept = await _stored(http, proxy, id)
    assert kept["status"] == "completed" and [item["type"] for item in kept["output"]] == ["message", "compaction"]
    assert kept["output"][1]["encrypted_content"] == ""  # added as the summary began, left empty


async def test_a_compaction_trigger_turn_in_the_background_is_a_400(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 8.8: a `compaction_trigger` turn is answered at once, never queued; nothing is
    asked of the upstream (the trigger was dropped, the user's message asked instead)."""
    upstream.script(Reply(SUMMARISED), Reply(HI))
    body = {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "background": True}
    async with http.post(f"{proxy}/v1/responses", json=body) as answer:
        assert answer.status == 400, await answer.text()
        assert (await answer.json())["error"]["param"] == "background"
    assert upstream.requests == []
