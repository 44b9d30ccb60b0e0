"""Deferred tools and the tool search (design.md 8.17) through the real proxy, the openai SDK as
the client (its own types checking every answer and event): a deferred tool is offered to no
model until a `tool_search_output` loads it, then in every turn whose history holds it (a stored
chain, a WebSocket's chain, a conversation, a compacted history). The client's search comes back
as a `tool_search_call` that ends the Response for the client; the proxy runs its own (OpenAI's
default), and the model goes on with what it found, on every transport."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import ResponseToolSearchCall, ResponseToolSearchOutputItem

from tests.client import SDK_EVENT, create, envelope, parse_sse, validate_event
from tests.events import check_stream
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import config
from tests.mcp_servers import ToolServer
from tests.test_background import replay, until_done
from tests.test_websocket import one_turn

WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
LOOKUP = {"type": "function", "name": "lookup", "description": "Find a customer.", "parameters": {"type": "object", "properties": {"email": {"type": "string"}}}, "defer_loading": True}
CRM = {"type": "namespace", "name": "crm", "description": "The customer records.", "tools": [LOOKUP]}
SEARCH_PARAMETERS = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}
SEARCH = {"type": "tool_search", "execution": "client", "description": "Find deferred tools by what they do.", "parameters": SEARCH_PARAMETERS}
TOOLS = [WEATHER, CRM, SEARCH]
FOUND = {"type": "namespace", "name": "crm", "description": "The customer records.", "tools": [LOOKUP]}  # as Codex sends it back


def searching(arguments: str = '{"query": "customer records", "limit": 3}') -> Generation:
    return Generation([Step("tool", arguments, tool_id="call_s1", tool_name="tool_search"), Step("finish", finish_reason="tool_calls")])


def calling_lookup() -> Generation:
    return Generation([Step("tool", '{"email": "a@b.c"}', tool_id="call_l1", tool_name="crm__lookup"), Step("finish", finish_reason="tool_calls")])


ANSWER = Generation([Step("text", "Done."), Step("finish", finish_reason="stop")])


def offered(request: dict[str, Any]) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


def loaded_by(call_id: str) -> dict[str, Any]:
    return {"type": "tool_search_output", "call_id": call_id, "execution": "client", "status": "completed", "tools": [FOUND]}


async def test_a_deferred_tool_is_offered_once_the_clients_search_loads_it(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(searching()), Reply(calling_lookup()), Reply(ANSWER))
    first = await sdk.responses.create(model="m", input="Look up a@b.c", tools=TOOLS)  # type: ignore[arg-type]
    asked = upstream.requests[-1]
    assert offered(asked) == {"weather", "tool_search"}  # the deferred one is not offered
    search = next(tool["function"] for tool in asked["tools"] if tool["function"]["name"] == "tool_search")
    assert search == {"name": "tool_search", "description": SEARCH["description"], "parameters": SEARCH_PARAMETERS}
    # The model's search: the client's to run, which ends the Response for it.
    (call,) = first.output
    assert isinstance(call, ResponseToolSearchCall)
    assert (call.execution, call.call_id, call.arguments, call.status) == ("client", "call_s1", {"query": "customer records", "limit": 3}, "completed")
    assert first.status == "completed"
    assert [tool["type"] for tool in first.model_dump()["tools"]] == ["function", "namespace", "tool_search"]  # echoed as sent

    second = await sdk.responses.create(model="m", previous_response_id=first.id, input=[loaded_by("call_s1")], tools=TOOLS)  # type: ignore[list-item, arg-type]
    asked = upstream.requests[-1]
    assert offered(asked) == {"weather", "tool_search", "crm__lookup"}
    assert asked["messages"][-2:] == [
        {"role": "assistant", "tool_calls": [{"id": "call_s1", "type": "function", "function": {"name": "tool_search", "arguments": '{"query":"customer records","limit":3}'}}]},
        {"role": "tool", "tool_call_id": "call_s1", "content": "Tools loaded, now callable: crm__lookup."},
    ]
    (lookup,) = second.output
    assert (lookup.type, lookup.name, lookup.namespace) == ("function_call", "lookup", "crm")  # type: ignore[union-attr]

    # A later turn of the chain replays the search: the tool stays offered.
    await sdk.responses.create(model="m", previous_response_id=second.id, input=[{"type": "function_call_output", "call_id": "call_l1", "output": "Ana"}], tools=TOOLS)  # type: ignore[list-item, arg-type]
    assert offered(upstream.requests[-1]) == {"weather", "tool_search", "crm__lookup"}


async def test_the_search_call_streams_as_the_sdk_types_it(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(searching('not json')))
    async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": "hi", "tools": TOOLS, "stream": True}) as answer:
        raw = await answer.read()
    from tests.client import parse_sse

    events = parse_sse(raw)
    for event in events:
        validate_event(event)
    added = [event["item"] for event in events if event["type"] == "response.output_item.added"]
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    assert [item["type"] for item in added] == [item["type"] for item in done] == ["tool_search_call"]
    assert done[0]["arguments"] == "not json" and done[0]["execution"] == "client"  # the text, where no JSON
    assert events[-1]["type"] == "response.completed"


async def test_a_websocket_chain_and_a_conversation_keep_the_loaded_tools(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(searching()), Reply(ANSWER), Reply(ANSWER))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        first = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "input": "hi", "tools": TOOLS})
        for event in first:
            SDK_EVENT.validate_python(event)
        second = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "tools": TOOLS, "previous_response_id": first[-1]["response"]["id"], "input": [loaded_by("call_s1")]})
        assert second[-1]["type"] == "response.completed"
        assert offered(upstream.requests[-1]) == {"weather", "tool_search", "crm__lookup"}
        third = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "tools": TOOLS, "previous_response_id": second[-1]["response"]["id"], "input": "again"})
        assert third[-1]["type"] == "response.completed"
    assert offered(upstream.requests[-1]) == {"weather", "tool_search", "crm__lookup"}

    upstream.script(Reply(searching()), Reply(ANSWER), Reply(ANSWER))
    conversation = await sdk.conversations.create()
    await sdk.responses.create(model="m", conversation=conversation.id, input="hi", tools=TOOLS)  # type: ignore[arg-type]
    await sdk.responses.create(model="m", conversation=conversation.id, input=[loaded_by("call_s1")], tools=TOOLS)  # type: ignore[list-item, arg-type]
    await sdk.responses.create(model="m", conversation=conversation.id, input="again", tools=TOOLS)  # type: ignore[arg-type]
    assert offered(upstream.requests[-1]) == {"weather", "tool_search", "crm__lookup"}
    types = [item.type async for item in sdk.conversations.items.list(conversation.id, order="asc")]
    assert "tool_search_call" in types and "tool_search_output" in types


async def test_a_compacted_history_keeps_the_loaded_tools(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    summary = Generation([Step("text", "The user looked up a customer."), Step("finish", finish_reason="stop")])
    upstream.script(Reply(summary), Reply(ANSWER))
    history = [
        {"role": "user", "content": "Look up a@b.c"},
        {"type": "tool_search_call", "call_id": "call_s1", "execution": "client", "arguments": {"query": "customers"}},
        loaded_by("call_s1"),
    ]
    async with openai.AsyncOpenAI(base_url=str(sdk.base_url), api_key="unused", max_retries=0) as unchecked:
        compacted = await unchecked.responses.compact(model="m", input=history, extra_body={"tools": TOOLS})  # type: ignore[arg-type]
    output = [entry.model_dump(exclude_none=True) for entry in compacted.output]
    assert [entry["type"] for entry in output] == ["message", "tool_search_call", "tool_search_output", "compaction"]
    await sdk.responses.create(model="m", input=[*output, {"role": "user", "content": "And now?"}], tools=TOOLS)  # type: ignore[list-item, arg-type]
    assert offered(upstream.requests[-1]) == {"weather", "tool_search", "crm__lookup"}


@pytest.mark.parametrize(
    ("tools", "param", "says"),
    [
        pytest.param([WEATHER, CRM], "tools", "Deferred tools require tools.tool_search", id="deferred-without-search"),
        pytest.param([WEATHER, {"type": "tool_search"}], "tools", "requires at least one deferred tool", id="server-search-without-deferred"),
        pytest.param([CRM, SEARCH, {"type": "tool_search"}], "tools[2]", "Only one tool_search", id="two-searches"),
    ],
)
async def test_a_deferral_that_cannot_be_honoured_is_a_400(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, tools: list[Any], param: str, says: str) -> None:
    async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": "hi", "tools": tools}) as answer:
        assert answer.status == 400
        error = envelope(await answer.json())
    assert error["param"] == param and says in error["message"]
    assert upstream.requests == []


async def test_a_clients_search_needs_no_deferred_tool_in_the_request(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    """Codex 0.171 holds its deferred MCP tools itself: it sends its `tool_search` alone, and the
    tools its search found in its `tool_search_output`."""
    upstream.script(Reply(searching()), Reply(calling_lookup()))
    first = await sdk.responses.create(model="m", input="Look up a@b.c", tools=[WEATHER, SEARCH])  # type: ignore[arg-type]
    assert [item.type for item in first.output] == ["tool_search_call"]
    assert offered(upstream.requests[-1]) == {"weather", "tool_search"}
    await sdk.responses.create(model="m", previous_response_id=first.id, input=[loaded_by("call_s1")], tools=[WEATHER, SEARCH])  # type: ignore[list-item, arg-type]
    assert offered(upstream.requests[-1]) == {"weather", "tool_search", "crm__lookup"}


async def test_openais_own_search_items_in_a_history_are_dropped(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(ANSWER))
    history = [
        {"role": "user", "content": "hi"},
        {"type": "tool_search_call", "id": "tsc_1", "execution": "server", "arguments": {"query": "x"}, "status": "completed"},
        {"type": "tool_search_output", "id": "tso_1", "execution": "server", "status": "completed", "tools": [FOUND]},
    ]
    await sdk.responses.create(model="m", input=[*history, {"role": "user", "content": "go on"}], tools=[WEATHER])  # type: ignore[list-item, arg-type]
    asked = upstream.requests[-1]
    assert [message["role"] for message in asked["messages"]] == ["user", "user"] and offered(asked) == {"weather"}


# -- the search the proxy runs (execution server, OpenAI's default) --------------------------------

CALENDAR = {"type": "namespace", "name": "calendar", "description": "The team's calendar.", "tools": [
    {"type": "function", "name": "create_event", "description": "Book a meeting.", "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "start": {"type": "string"}}}, "defer_loading": True},
]}
FORECAST = {"type": "function", "name": "get_forecast", "description": "Tomorrow's weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "defer_loading": True}
SERVER_TOOLS = [WEATHER, CRM, CALENDAR, FORECAST, {"type": "tool_search"}]
LOOKUP_FOUND = {"type": "namespace", "name": "crm", "description": "The customer records.", "tools": [LOOKUP]}


def searched_by_the_proxy(query: str = "customer email") -> Generation:
    arguments = f'{{"query":"{query}"}}'
    return Generation([Step("tool", arguments, tool_id="call_s1", tool_name="tool_search"), Step("finish", finish_reason="tool_calls")])


def functions(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {tool["function"]["name"]: tool["function"] for tool in request.get("tools", [])}


async def test_the_proxy_searches_the_deferred_tools_and_the_model_calls_what_it_found(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(searched_by_the_proxy()), Reply(calling_lookup()), Reply(ANSWER))
    first = await sdk.responses.create(model="m", input="Look up a@b.c", tools=SERVER_TOOLS)  # type: ignore[arg-type]
    (searching_round, _), (found_round, _) = [(request, None) for request in upstream.requests]
    offered_first = functions(searching_round)
    assert set(offered_first) == {"weather", "tool_search"}
    # The model is told what it may find, as OpenAI shows it the searchable namespaces and functions.
    described = offered_first["tool_search"]["description"]
    assert all(source in described for source in ("crm: The customer records.", "calendar: The team's calendar.", "get_forecast: Tomorrow's weather."))
    assert offered_first["tool_search"]["parameters"]["required"] == ["query"]
    # Found by its member's description and parameter name, the customer records alone are loaded.
    assert set(functions(found_round)) == {"weather", "tool_search", "crm__lookup"}
    assert found_round["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_s1", "type": "function", "function": {"name": "tool_search", "arguments": '{"query":"customer email"}'}}]},
        {"role": "tool", "tool_call_id": "call_s1", "content": "Tools loaded, now callable: crm__lookup."},
    ]
    call, output, lookup = first.output
    assert isinstance(call, ResponseToolSearchCall) and isinstance(output, ResponseToolSearchOutputItem)
    assert (call.execution, call.call_id, call.arguments, call.status) == ("server", "call_s1", {"query": "customer email"}, "completed")
    assert (output.execution, output.call_id, output.status) == ("server", "call_s1", "completed")
    assert [tool.model_dump(exclude_none=True) for tool in output.tools] == [LOOKUP_FOUND]
    assert (lookup.type, lookup.name, lookup.namespace, first.status) == ("function_call", "lookup", "crm", "completed")  # type: ignore[union-attr]

    # Stored and chained: a later turn replays the search as it was sent, and keeps what it loaded.
    await sdk.responses.create(model="m", previous_response_id=first.id, input=[{"type": "function_call_output", "call_id": "call_l1", "output": "Ana"}], tools=SERVER_TOOLS)  # type: ignore[list-item, arg-type]
    chained = upstream.requests[-1]
    assert chained["tools"] == found_round["tools"]  # what the search loaded, after the rest, as its round had it
    said = [{key: value for key, value in message.items() if value is not None} for message in found_round["messages"]]
    assert chained["messages"][: len(said)] == said  # a content of null is no content to a chat template


async def test_the_search_streams_its_items_as_the_sdk_types_them(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(searched_by_the_proxy("book a meeting")), Reply(ANSWER))
    async with http.post(f"{proxy}/v1/responses", json={"model": "m", "input": "Book it", "tools": SERVER_TOOLS, "stream": True}) as answer:
        events = parse_sse(await answer.read())
    stream = check_stream(events)  # the SDK's types, sequence numbers, each item added then done
    assert [item["type"] for item in stream.response["output"]] == ["tool_search_call", "tool_search_output", "message"]
    added = next(event["item"] for event in events if event["type"] == "response.output_item.added")
    assert (added["type"], added["execution"], added["status"]) == ("tool_search_call", "server", "in_progress")
    found = stream.response["output"][1]
    assert [tool["name"] for tool in found["tools"]] == ["calendar"] and found["tools"][0]["tools"][0]["name"] == "create_event"
    assert "calendar__create_event" in functions(upstream.requests[-1])


async def test_a_search_past_max_tool_calls_is_not_run(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    """A search is a call of a tool the proxy runs (design.md 14.4): within `max_tool_calls`, and
    past it not offered again."""
    upstream.script(Reply(searched_by_the_proxy()), Reply(searched_by_the_proxy("weather tomorrow")), Reply(ANSWER))
    response = await sdk.responses.create(model="m", input="Look up a@b.c", tools=SERVER_TOOLS, max_tool_calls=1)  # type: ignore[arg-type]
    assert [(item.type, getattr(item, "status", None)) for item in response.output] == [
        ("tool_search_call", "completed"), ("tool_search_output", "completed"), ("tool_search_call", "incomplete"), ("message", "completed"),
    ]
    last = upstream.requests[-1]
    assert set(functions(last)) == {"weather", "crm__lookup"}  # no search past the budget, and no forecast
    assert last["messages"][-1]["content"].startswith("The call was not run")


async def test_a_background_run_and_a_websocket_turn_search_too(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(searched_by_the_proxy()), Reply(ANSWER))
    status, started = await create(http, proxy, {"model": "m", "input": "Look up a@b.c", "tools": SERVER_TOOLS, "background": True})
    assert status == 200
    done = await until_done(http, proxy, started["id"])
    assert [item["type"] for item in done["output"]] == ["tool_search_call", "tool_search_output", "message"]
    assert check_stream(parse_sse(await replay(http, proxy, started["id"]))).response == done
    assert "crm__lookup" in functions(upstream.requests[-1])

    upstream.script(Reply(searched_by_the_proxy()), Reply(ANSWER), Reply(ANSWER))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        first = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "input": "hi", "tools": SERVER_TOOLS})
        for event in first:
            SDK_EVENT.validate_python(event)
        assert [item["type"] for item in first[-1]["response"]["output"]] == ["tool_search_call", "tool_search_output", "message"]
        again = {"type": "response.create", "model": "m", "store": False, "tools": SERVER_TOOLS, "previous_response_id": first[-1]["response"]["id"], "input": "again"}
        assert (await one_turn(socket, again))[-1]["type"] == "response.completed"
    assert set(functions(upstream.requests[-1])) == {"weather", "tool_search", "crm__lookup"}  # the connection's chain keeps it


async def test_a_deferred_mcp_server_is_found_by_its_tools_and_run(upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession) -> None:
    """A deferred MCP server is listed as any (14.3), found by its tools' names and descriptions,
    and its tools, once loaded, are the proxy's to run."""
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url]}))
    calc = {"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never", "defer_loading": True}
    adding = Generation([Step("tool", '{"a": 2, "b": 3}', tool_id="call_a", tool_name="calc__add"), Step("finish", finish_reason="tool_calls")])
    upstream.script(Reply(searched_by_the_proxy("add two integers")), Reply(adding), Reply(ANSWER))
    status, body = await create(http, proxy, {"model": "m", "input": "2 + 3?", "tools": [calc, {"type": "tool_search"}]})
    assert status == 200, body
    assert [item["type"] for item in body["output"]] == ["mcp_list_tools", "tool_search_call", "tool_search_output", "mcp_call", "message"]
    assert body["output"][2]["tools"][0]["server_label"] == "calc" and body["output"][3]["output"] == "5"
    assert "calc__add" not in functions(upstream.requests[0]) and "calc__add" in functions(upstream.requests[1])
    assert tool_server.calls == [("add", {"a": 2, "b": 3})]
