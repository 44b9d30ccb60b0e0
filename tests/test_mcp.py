"""Tools the proxy runs itself (design.md 14): a request's remote MCP server, a real one from
the official SDK on loopback, listed, called between model rounds and answered in one Response,
through the real proxy and the openai SDK; the operator's policy, approvals and secrets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import openai
import orjson
import pytest

from proxy.upstream.mcp import _allows
from tests.client import LOGPROBS, create, eventually, parse_sse, post_json, stream, validate_response
from tests.events import check_stream, sent_scores
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import config
from tests.mcp_servers import ToolServer
from tests.test_background import replay, until_done
from tests.test_websocket import one_turn


def calling(name: str, arguments: str, *more: tuple[str, str]) -> Generation:
    """A round whose model calls tools (`name`: a chat name; `more`: other calls, in parallel),
    every token scored; the calls' ids are `call_1`, `call_2`..."""
    calls = [(name, arguments), *more]
    steps = [Step("tool", args, [score(args)], tool_index=i, tool_id=f"call_{i + 1}", tool_name=tool) for i, (tool, args) in enumerate(calls)]
    return Generation([*steps, Step("finish", finish_reason="tool_calls", scores=[score("<call>")])])


def answering(text: str) -> Generation:
    return Generation([Step("text", text, [score(text)]), Step("finish", finish_reason="stop", scores=[score("<eos>")])])


def server(tool_server: ToolServer, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never", **fields}


@pytest.fixture
async def mcp_proxy(upstream: FakeUpstream, tool_server: ToolServer, start_proxy) -> str:
    return await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url]}))


@pytest.fixture
async def sdk(mcp_proxy: str) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=f"{mcp_proxy}/v1", api_key="unused", max_retries=0, timeout=20, _strict_response_validation=True)
    yield client
    await client.close()


async def test_a_call_runs_between_rounds_and_the_model_answers_with_its_result(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    first, second = calling("calc__add", '{"a": 2, "b": 3}'), answering("It is 5.")
    upstream.script(Reply(first), Reply(second))
    response = await sdk.responses.create(
        model="m", input="What is 2 + 3?", tools=[server(tool_server)], include=LOGPROBS, max_output_tokens=100
    )
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    listing, call, message = response.output
    assert listing.server_label == "calc" and {tool.name for tool in listing.tools} >= {"add", "echo", "delete_item"}
    add = next(tool for tool in listing.tools if tool.name == "add")
    assert add.input_schema["properties"].keys() == {"a", "b"} and add.annotations["readOnlyHint"] is True
    assert (call.server_label, call.name, call.arguments, call.output, call.error) == ("calc", "add", '{"a": 2, "b": 3}', "5", None)
    assert call.status == "completed" and response.status == "completed"
    assert tool_server.calls == [("add", {"a": 2, "b": 3})]
    # The model saw the server's tools as functions, then the call and its result.
    offered, answered = upstream.requests
    assert "calc__add" in [tool["function"]["name"] for tool in offered["tools"]]
    said, result = answered["messages"][-2:]
    assert said["tool_calls"] == [{"id": call.id, "type": "function", "function": {"name": "calc__add", "arguments": '{"a": 2, "b": 3}'}}]
    assert result == {"role": "tool", "tool_call_id": call.id, "content": "5"}
    # One message, every score of both rounds on it; the usage of both; the output tokens left.
    assert message.content[0].text == "It is 5."
    scores = [entry.model_dump() for entry in message.content[0].logprobs]
    assert scores == sent_scores(first.chunks()) + sent_scores(second.chunks())
    assert response.usage.output_tokens == first.usage()["completion_tokens"] + second.usage()["completion_tokens"]
    assert answered["max_tokens"] == 100 - first.usage()["completion_tokens"]


async def test_a_streamed_turn_has_the_mcp_events_in_order(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    upstream.script(Reply(calling("calc__echo", '{"text": "hi"}')), Reply(answering("Echoed.")))
    events = await stream(http, mcp_proxy, {"model": "m", "input": "echo hi", "tools": [server(tool_server)], "include": LOGPROBS})
    checked = check_stream(events)  # one terminal event, numbers dense, items in order, SDK types
    assert checked.terminal == "response.completed"
    kinds = [event["type"] for event in events if "mcp" in event["type"]]
    assert kinds == [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ]
    (call,) = checked.of_type("mcp_call")
    assert call["output"] == "hi" and checked.text == "Echoed."


async def test_a_server_the_operator_does_not_allow_is_a_400_and_never_contacted(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    for url in ("http://127.0.0.1:1/mcp", f"{tool_server.url}/../other", "ftp://example.com/mcp"):
        tools = [{"type": "function", "name": "f"}, server(tool_server, server_url=url)]
        status, body = await create(http, mcp_proxy, {"model": "m", "input": "hi", "tools": tools})
        assert status == 400 and body["error"]["param"] == "tools[1].server_url", body
    status, body = await create(http, mcp_proxy, {"model": "m", "input": "hi", "tools": [{"type": "mcp", "server_label": "nowhere"}]})
    assert status == 400 and body["error"]["param"] == "tools[0].server_url"
    assert tool_server.headers == [] and upstream.requests == []


async def test_without_an_mcp_section_no_server_is_allowed(
    upstream: FakeUpstream, tool_server: ToolServer, proxy: str, http: aiohttp.ClientSession
) -> None:
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [server(tool_server)]})
    assert status == 400 and body["error"]["param"] == "tools[0].server_url"
    assert tool_server.headers == []


async def test_calls_wait_for_approval_by_default_and_run_once_approved(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    tools = [server(tool_server, require_approval=None)]
    upstream.script(Reply(calling("calc__delete_item", '{"id": "7"}')))
    asked = await sdk.responses.create(model="m", input="delete 7", tools=tools)
    assert [item.type for item in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = asked.output[1]
    assert (request.name, request.arguments, request.server_label) == ("delete_item", '{"id": "7"}', "calc")
    assert asked.status == "completed" and tool_server.calls == []
    validate_response(asked.to_dict())  # the SDK's types, validated: its required fields there

    upstream.script(Reply(answering("Deleted.")))
    approval = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    done = await sdk.responses.create(model="m", previous_response_id=asked.id, input=[approval], tools=tools)
    assert [item.type for item in done.output] == ["mcp_call", "message"]  # listed already: not again
    call = done.output[0]
    assert (call.name, call.output, call.approval_request_id) == ("delete_item", "deleted 7", request.id)
    assert tool_server.calls == [("delete_item", {"id": "7"})]
    messages = upstream.requests[-1]["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == request.id
    assert messages[-1] == {"role": "tool", "tool_call_id": request.id, "content": "deleted 7"}

    # The next turn of the chain does not run it again.
    upstream.script(Reply(answering("Anything else?")))
    again = await sdk.responses.create(model="m", previous_response_id=done.id, input="thanks", tools=tools)
    assert [item.type for item in again.output] == ["message"] and len(tool_server.calls) == 1


async def test_a_compaction_trigger_turn_runs_no_call_it_approves(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    """A trigger turn generates nothing but its summary (design.md 8.8): the call its input approves
    is not run, where it ran and its item was dropped (14.5)."""
    tools = [server(tool_server, require_approval="always")]
    upstream.script(Reply(calling("calc__delete_item", '{"id": "7"}')))
    status, asked = await create(http, mcp_proxy, {"model": "m", "input": "delete 7", "tools": tools})
    assert status == 200 and asked["output"][-1]["type"] == "mcp_approval_request"
    upstream.script(Reply(answering("The user wants item 7 deleted.")))
    approval = {"type": "mcp_approval_response", "approval_request_id": asked["output"][-1]["id"], "approve": True}
    body = {"model": "m", "previous_response_id": asked["id"], "input": [approval, {"type": "compaction_trigger"}], "tools": tools}
    status, compacted = await create(http, mcp_proxy, body)
    assert status == 200, compacted
    assert [item["type"] for item in compacted["output"]] == ["compaction"]
    assert tool_server.calls == []


async def test_a_declined_call_is_not_run_and_the_model_is_told(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    tools = [server(tool_server, require_approval="always")]
    upstream.script(Reply(calling("calc__delete_item", '{"id": "7"}')), Reply(answering("Not deleted.")))
    asked = await sdk.responses.create(model="m", input="delete 7", tools=tools)
    request = asked.output[-1]
    declined = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False, "reason": "keep it"}
    done = await sdk.responses.create(model="m", previous_response_id=asked.id, input=[declined], tools=tools)
    assert [item.type for item in done.output] == ["message"] and tool_server.calls == []
    told = upstream.requests[-1]["messages"][-1]
    assert told["role"] == "tool" and told["tool_call_id"] == request.id and "declined" in told["content"] and "keep it" in told["content"]


async def test_an_approval_filter_lets_read_only_tools_run(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    policy = {"never": {"read_only": True}}
    upstream.script(Reply(calling("calc__add", '{"a": 1, "b": 1}')), Reply(answering("2")))
    response = await sdk.responses.create(model="m", input="1+1", tools=[server(tool_server, require_approval=policy)])
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    upstream.script(Reply(calling("calc__delete_item", '{"id": "1"}')))
    response = await sdk.responses.create(model="m", input="rm 1", tools=[server(tool_server, require_approval=policy)])
    assert response.output[-1].type == "mcp_approval_request"


async def test_allowed_tools_limit_what_is_listed_and_offered(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    upstream.script(Reply(answering("ok")), Reply(answering("ok")))
    response = await sdk.responses.create(model="m", input="hi", tools=[server(tool_server, allowed_tools=["add", "echo"])])
    assert [tool.name for tool in response.output[0].tools] == ["add", "echo"]
    assert [tool["function"]["name"] for tool in upstream.requests[0]["tools"]] == ["calc__add", "calc__echo"]
    response = await sdk.responses.create(model="m", input="hi", tools=[server(tool_server, allowed_tools={"read_only": True})])
    assert {tool.name for tool in response.output[0].tools} == {"add", "echo", "search", "words"}


async def test_a_tool_error_is_the_calls_error_and_the_response_completes(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    upstream.script(Reply(calling("calc__fail", '{"message": "no disk"}')), Reply(answering("It failed.")))
    response = await sdk.responses.create(model="m", input="go", tools=[server(tool_server)])
    call = response.output[1]
    assert call.status == "failed" and call.output is None and call.error.type == "mcp_tool_execution_error"
    assert "no disk" in orjson.dumps(call.error.model_dump()).decode()
    assert response.status == "completed"
    told = upstream.requests[-1]["messages"][-1]
    assert told["role"] == "tool" and "no disk" in told["content"]


async def test_the_request_secrets_reach_the_server_alone_and_are_never_kept(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    tools = [server(tool_server, headers={"X-Api-Key": "s3cret-header"}, authorization="s3cret-token")]
    upstream.script(Reply(calling("calc__echo", '{"text": "x"}')), Reply(answering("done")))
    status, body = await create(http, mcp_proxy, {"model": "m", "input": "hi", "tools": tools})
    assert status == 200, body
    assert all(seen.get("x-api-key") == "s3cret-header" for seen in tool_server.headers)
    assert all(seen.get("authorization") == "Bearer s3cret-token" for seen in tool_server.headers)
    assert body["tools"][0]["headers"] == {"X-Api-Key": "<redacted>"} and body["tools"][0]["authorization"] == "<redacted>"
    async with http.get(f"{mcp_proxy}/v1/responses/{body['id']}") as got:
        kept = await got.read()
    async with http.get(f"{mcp_proxy}/v1/responses/{body['id']}/input_items") as got:
        kept += await got.read()
    for leak in (kept, orjson.dumps(upstream.requests), orjson.dumps(upstream.headers)):
        assert b"s3cret" not in leak


async def test_a_listing_in_the_history_is_used_instead_of_listing_again(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    upstream.script(Reply(answering("one")), Reply(answering("two")), Reply(calling("calc__add", '{"a": 1, "b": 2}')), Reply(answering("3")))
    first = await sdk.responses.create(model="m", input="hi", tools=[server(tool_server)])
    second = await sdk.responses.create(model="m", input="again", previous_response_id=first.id, tools=[server(tool_server)])
    assert [item.type for item in second.output] == ["message"] and tool_server.list_requests == 1
    assert "calc__add" in [tool["function"]["name"] for tool in upstream.requests[1]["tools"]]  # offered from the listing kept
    third = await sdk.responses.create(model="m", input="add", previous_response_id=second.id, tools=[server(tool_server)])
    assert [item.type for item in third.output] == ["mcp_call", "message"]
    assert tool_server.calls == [("add", {"a": 1, "b": 2})]


async def test_max_tool_calls_stops_the_calls_and_then_offers_no_more(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    two = calling("calc__echo", '{"text": "a"}', ("calc__echo", '{"text": "b"}'))
    upstream.script(Reply(two), Reply(answering("only a")))
    response = await sdk.responses.create(model="m", input="echo twice", tools=[server(tool_server)], max_tool_calls=1)
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [(call.status, call.output) for call in calls] == [("completed", "a"), ("incomplete", None)]
    assert tool_server.calls == [("echo", {"text": "a"})]
    last = upstream.requests[-1]
    assert "max_tool_calls" in last["messages"][-1]["content"] and "tools" not in last and "tool_choice" not in last


async def test_max_tool_calls_of_zero_runs_none(upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI) -> None:
    """0 is a bound like any (the schema allows it), not "the operator's default"."""
    upstream.script(Reply(calling("calc__echo", '{"text": "a"}')), Reply(answering("none run")))
    response = await sdk.responses.create(model="m", input="echo", tools=[server(tool_server)], max_tool_calls=0)
    assert [(item.type, item.status) for item in response.output if item.type == "mcp_call"] == [("mcp_call", "incomplete")]
    assert tool_server.calls == []


async def test_a_forced_tool_choice_names_the_server_and_applies_to_the_first_round_alone(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    upstream.script(Reply(calling("calc__search", '{"query": "mcp"}')), Reply(answering("found")))
    choice = {"type": "mcp", "server_label": "calc", "name": "search"}
    response = await sdk.responses.create(model="m", input="look", tools=[server(tool_server)], tool_choice=choice)
    assert response.output[1].name == "search" and response.tool_choice.server_label == "calc"
    first, second = upstream.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "calc__search"}}
    assert second["tool_choice"] == "auto"
    status = 0
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.responses.create(
            model="m", input="x", tools=[server(tool_server)], tool_choice={"type": "mcp", "server_label": "calc", "name": "nope"}
        )
    status = refused.value.status_code
    assert status == 400 and refused.value.body["param"] == "tool_choice"


async def test_a_client_function_in_the_same_round_ends_the_response_for_the_client(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    mixed = calling("calc__echo", '{"text": "a"}', ("local", "{}"))
    upstream.script(Reply(mixed))
    tools = [server(tool_server), {"type": "function", "name": "local", "parameters": {"type": "object", "properties": {}}}]
    response = await sdk.responses.create(model="m", input="both", tools=tools)
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "function_call"]
    assert response.output[1].output == "a" and response.output[2].call_id == "call_2"
    assert len(upstream.requests) == 1


# -- hostile servers (design.md 14.1, 14.7): never a hang, a 5xx or unbounded memory -------------

CALL_FAILURES = {
    "slow": ("http_error", 504),
    "huge": ("http_error", 413),
    "huge_chunked": ("http_error", 413),
    "invalid": ("mcp_protocol_error", None),
    "garbage": ("mcp_protocol_error", None),
    "disconnect": ("http_error", 502),
    "redirect": ("http_error", 307),
    "error_status": ("mcp_protocol_error", None),
}


async def hostile_proxy(upstream: FakeUpstream, server_url: str, start_proxy) -> openai.AsyncOpenAI:
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": [server_url], "timeout": 1}))
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)


@pytest.mark.parametrize("mode", CALL_FAILURES)
async def test_a_call_a_hostile_server_botches_is_the_calls_error(
    mode: str, upstream: FakeUpstream, hostile_server, tool_server: ToolServer, start_proxy
) -> None:
    # The redirect goes to a server that would answer, which must never be asked.
    hostile = await hostile_server(mode, delay=30, redirect_to=tool_server.url)
    sdk = await hostile_proxy(upstream, hostile.url, start_proxy)
    upstream.script(Reply(calling("bad__work", '{"input": "x"}')), Reply(answering("It broke.")))
    response = await sdk.responses.create(model="m", input="work", tools=[{"type": "mcp", "server_label": "bad", "server_url": hostile.url, "require_approval": "never"}])
    await sdk.close()
    call = response.output[1]
    kind, code = CALL_FAILURES[mode]
    assert response.status == "completed" and call.status == "failed" and call.output is None
    assert call.error.type == kind and (code is None or call.error.code == code), call.error
    assert tool_server.headers == []
    assert upstream.requests[-1]["messages"][-1]["content"].startswith("The tool call failed")


@pytest.mark.parametrize("mode", CALL_FAILURES)
async def test_a_server_that_cannot_list_its_tools_is_a_424(
    mode: str, upstream: FakeUpstream, hostile_server, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    hostile = await hostile_server(mode, on="tools/list", delay=30, redirect_to=tool_server.url)
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": [hostile.url], "timeout": 1}))
    tools = [{"type": "mcp", "server_label": "bad", "server_url": hostile.url}]
    for streamed in (False, True):
        status, body = await create(http, url, {"model": "m", "input": "hi", "tools": tools, "stream": streamed})
        assert status == 424, body
        assert body["error"]["type"] == "external_connector_error" and body["error"]["param"] == "tools"
        assert "'bad'" in body["error"]["message"]
    assert upstream.requests == [] and tool_server.headers == []


async def test_an_unreachable_server_is_a_424(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["http://127.0.0.1:1/*"], "timeout": 1}))
    tools = [{"type": "mcp", "server_label": "gone", "server_url": "http://127.0.0.1:1/mcp"}]
    status, body = await create(http, url, {"model": "m", "input": "hi", "tools": tools})
    assert status == 424 and body["error"]["type"] == "external_connector_error", body


@pytest.mark.parametrize("url", ["http://169.254.169.254/mcp", "http://[fe80::1]/mcp", "http://[::1]:9/mcp", "http://0.0.0.0:9/mcp"])
async def test_link_local_metadata_and_loopback_addresses_are_refused_behind_a_wildcard(
    url: str, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["http://*", "http://*:*"], "timeout": 2}))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [{"type": "mcp", "server_label": "x", "server_url": url}]})
    assert status == 424 and "internal address" in body["error"]["message"], body


async def test_the_sdk_streams_a_tool_round_as_typed_events(upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI) -> None:
    upstream.script(Reply(calling("calc__add", '{"a": 4, "b": 5}')), Reply(answering("9")))
    kinds, final = [], None
    async with await sdk.responses.create(model="m", input="add", tools=[server(tool_server)], stream=True) as events:
        async for event in events:
            kinds.append(type(event).__name__)
            if event.type == "response.completed":
                final = event.response
    assert {"ResponseMcpListToolsCompletedEvent", "ResponseMcpCallArgumentsDeltaEvent", "ResponseMcpCallCompletedEvent"} <= set(kinds)
    assert final is not None and final.output[1].type == "mcp_call" and final.output[1].output == "9"


async def test_an_internal_address_needs_the_operator_to_name_its_host(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    """A pattern admits the URL, but a loopback host only where the pattern names it outright:
    a client cannot reach the proxy's own host, or a metadata service, through a wildcard."""
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["http://*/mcp", "http://*:*/mcp"]}))
    tools = [{"type": "mcp", "server_label": "local", "server_url": tool_server.url}]
    status, body = await create(http, url, {"model": "m", "input": "hi", "tools": tools})
    assert status == 424 and "internal address" in body["error"]["message"], body
    assert tool_server.headers == []


# -- the operator's servers (design.md 14.1) and built-in tools answered by them (14.8) ---------


async def test_an_operator_server_is_named_by_its_label_and_brings_its_own_credentials(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy, tmp_path, monkeypatch
) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")
    monkeypatch.setenv("OPS_HEADER", "from-the-environment")
    operator = {"server_label": "ops", "url": tool_server.url, "connector_id": "connector_ops",
                "headers": {"X-Ops": "${OPS_HEADER}"}, "authorization_file": str(secret)}
    url = await start_proxy(config(upstream.url, mcp={"servers": [operator]}))  # no allowed_servers: none for clients
    sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)
    upstream.script(Reply(calling("ops__echo", '{"text": "hi"}')), Reply(answering("ok")), Reply(answering("ok")))
    response = await sdk.responses.create(model="m", input="hi", tools=[{"type": "mcp", "server_label": "ops", "require_approval": "never"}])
    assert response.output[1].output == "hi"
    assert all(seen["authorization"] == "Bearer from-a-file" and seen["x-ops"] == "from-the-environment" for seen in tool_server.headers)
    # By connector id, under the client's own label.
    response = await sdk.responses.create(model="m", input="hi", tools=[{"type": "mcp", "server_label": "mine", "connector_id": "connector_ops"}])
    assert response.output[0].type == "mcp_list_tools" and response.output[0].server_label == "mine"
    await sdk.close()


@pytest.fixture
async def search_proxy(upstream: FakeUpstream, tool_server: ToolServer, start_proxy) -> str:
    operator = {"server_label": "kb", "url": tool_server.url}
    mcp = {"servers": [operator], "web_search": {"server": "kb", "tool": "search"}, "file_search": {"server": "kb", "tool": "search"}}
    return await start_proxy(config(upstream.url, mcp=mcp))


@pytest.mark.parametrize("kind", ["web_search", "web_search_preview", "file_search"])
async def test_a_built_in_tool_the_operator_maps_is_answered_with_its_own_item(
    kind: str, upstream: FakeUpstream, tool_server: ToolServer, search_proxy: str, http: aiohttp.ClientSession
) -> None:
    function = "file_search" if kind == "file_search" else "web_search"
    tool = {"type": kind, "vector_store_ids": ["vs_1"]} if kind == "file_search" else {"type": kind}
    upstream.script(Reply(calling(function, '{"query": "open models"}')), Reply(answering("Here is what I found.")))
    events = await stream(http, search_proxy, {"model": "m", "input": "search", "tools": [tool], "include": LOGPROBS})
    checked = check_stream(events)
    assert [item.type for item in checked.items] == [f"{function}_call", "message"]
    (call,) = checked.of_type(f"{function}_call")
    assert call["status"] == "completed"
    if function == "web_search":
        assert call["action"] == {"type": "search", "query": "open models"}
    else:
        assert call["queries"] == ["open models"] and call["results"] == [{"text": "Results for open models: 1. open models - an overview (https://example.com/open-models)"}]
    kinds = [event["type"] for event in events if event["type"].startswith(f"response.{function}_call")]
    assert kinds == [f"response.{function}_call.{step}" for step in ("in_progress", "searching", "completed")]
    assert tool_server.calls == [("search", {"query": "open models"})]
    offered, answered = upstream.requests
    assert [tool["function"]["name"] for tool in offered["tools"]] == [function]
    assert answered["messages"][-1]["content"].startswith("Results for open models")
    assert checked.response["tools"] == [tool]  # as sent


async def test_a_built_in_tool_the_operator_does_not_map_is_dropped_as_before(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    upstream.script(Reply(answering("no search here")))
    status, body = await create(http, mcp_proxy, {"model": "m", "input": "search", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}})
    assert status == 200 and body["output"][0]["type"] == "message" and body["tools"] == [] and body["tool_choice"] == "auto"
    assert "tools" not in upstream.requests[0] and tool_server.headers == []


# -- every transport (design.md 14.6) ------------------------------------------------------------


async def test_a_background_response_runs_its_calls_and_resumes_from_any_event(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    upstream.script(Reply(calling("calc__add", '{"a": 20, "b": 22}')), Reply(answering("42")))
    status, started = await create(http, mcp_proxy, {"model": "m", "input": "add", "tools": [server(tool_server)], "background": True, "include": LOGPROBS})
    assert status == 200 and started["status"] in ("queued", "in_progress")
    done = await until_done(http, mcp_proxy, started["id"])
    assert done["status"] == "completed" and [item["type"] for item in done["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert done["output"][1]["output"] == "42"
    events = parse_sse(await replay(http, mcp_proxy, started["id"]))
    checked = check_stream(events)
    assert checked.response == done
    cut = next(event["sequence_number"] for event in events if event["type"] == "response.mcp_call.in_progress")
    assert parse_sse(await replay(http, mcp_proxy, started["id"], cut)) == events[cut + 1 :]


async def test_a_background_response_cancelled_during_a_call_ends_cancelled(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    upstream.script(Reply(calling("calc__sleep", '{"seconds": 20}')), Reply(answering("never")))
    _, started = await create(http, mcp_proxy, {"model": "m", "input": "wait", "tools": [server(tool_server)], "background": True})
    await eventually(lambda: tool_server.sleeping == 1)
    async with http.post(f"{mcp_proxy}/v1/responses/{started['id']}/cancel") as response:
        assert response.status == 200, await response.text()
        cancelled = await response.json()
    assert cancelled["status"] == "cancelled"
    call = cancelled["output"][1]
    assert call["type"] == "mcp_call" and call["status"] == "incomplete" and call["output"] is None
    await eventually(lambda: tool_server.sleeping == 0)  # the call was let go
    assert len(upstream.requests) == 1  # no round after it
    events = parse_sse(await replay(http, mcp_proxy, started["id"]))
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.failed" and events[-1]["response"] == cancelled  # as any cancel ends (10.3)
    assert [event["type"] for event in events if event["type"].startswith("response.mcp_call.")][-1] == "response.mcp_call.failed"


async def test_a_websocket_turn_runs_its_calls(upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(calling("calc__echo", '{"text": "ws"}')), Reply(answering("Echoed over the socket.")))
    async with http.ws_connect(f"{mcp_proxy}/v1/responses") as socket:
        events = await one_turn(socket, {"type": "response.create", "model": "m", "input": "echo", "tools": [server(tool_server)]})
    checked = check_stream(events)
    assert [item.type for item in checked.items] == ["mcp_list_tools", "mcp_call", "message"]
    assert checked.of_type("mcp_call")[0]["output"] == "ws"


async def test_a_conversation_keeps_the_listing_and_the_calls(
    upstream: FakeUpstream, tool_server: ToolServer, mcp_proxy: str, http: aiohttp.ClientSession
) -> None:
    status, conversation = await post_json(http, f"{mcp_proxy}/v1/conversations", {})
    assert status == 200, conversation
    upstream.script(Reply(calling("calc__echo", '{"text": "one"}')), Reply(answering("1")), Reply(answering("2")))
    body = {"model": "m", "tools": [server(tool_server)], "conversation": conversation["id"]}
    status, first = await create(http, mcp_proxy, {**body, "input": "first"})
    assert status == 200, first
    status, second = await create(http, mcp_proxy, {**body, "input": "second"})
    assert [item["type"] for item in second["output"]] == ["message"] and tool_server.list_requests == 1
    async with http.get(f"{mcp_proxy}/v1/conversations/{conversation['id']}/items?order=asc") as response:
        items = (await response.json())["data"]
    assert [item["type"] for item in items] == ["message", "mcp_list_tools", "mcp_call", "message", "message", "message"]
    replayed = upstream.requests[-1]["messages"]
    assert {"role": "tool", "tool_call_id": first["output"][1]["id"], "content": "one"} in replayed


async def test_a_server_of_the_older_sse_transport_is_reached_once_it_refuses_streamable_http(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy
) -> None:
    """Its SSE endpoint answers a POST with 405: the proxy goes on over SSE at the same URL."""
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.sse_url]}))
    sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)
    upstream.script(Reply(calling("calc__add", '{"a": 1, "b": 2}')), Reply(answering("3")))
    response = await sdk.responses.create(model="m", input="add", tools=[server(tool_server, server_url=tool_server.sse_url)])
    await sdk.close()
    assert response.output[1].output == "3" and tool_server.calls == [("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("parallel", [True, False])
async def test_a_rounds_calls_run_at_once_unless_parallel_calls_are_off(
    parallel: bool, upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    wait = '{"seconds": 0.3}'
    upstream.script(Reply(calling("calc__sleep", wait, ("calc__sleep", wait))), Reply(answering("both")))
    response = await sdk.responses.create(model="m", input="wait twice", tools=[server(tool_server)], parallel_tool_calls=parallel)
    assert [item.output for item in response.output if item.type == "mcp_call"] == ["slept", "slept"]
    assert tool_server.most_sleeping == (2 if parallel else 1)


async def test_one_keys_calls_wait_for_their_turn(upstream: FakeUpstream, tool_server: ToolServer, start_proxy) -> None:
    mcp = {"allowed_servers": [tool_server.url], "max_calls_per_key": 1}
    url = await start_proxy(config(upstream.url, mcp=mcp, auth={"api_keys": ["one", "two"]}))
    wait = '{"seconds": 0.3}'
    upstream.choose = lambda body: Reply(answering("done") if body["messages"][-1]["role"] == "tool" else calling("calc__sleep", wait))

    async def turn(key: str) -> None:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20) as sdk:
            response = await sdk.responses.create(model="m", input="wait", tools=[server(tool_server)])
            assert response.output[1].output == "slept"

    await asyncio.gather(turn("one"), turn("one"))
    assert tool_server.most_sleeping == 1  # one key: one call at a time
    await asyncio.gather(turn("one"), turn("two"))
    assert tool_server.most_sleeping == 2  # two keys: at once


async def test_output_tokens_spent_by_a_tool_round_end_the_response_incomplete(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    first = calling("calc__echo", '{"text": "x"}')
    upstream.script(Reply(first))
    spent = first.usage()["completion_tokens"]
    response = await sdk.responses.create(model="m", input="echo", tools=[server(tool_server)], max_output_tokens=spent)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[1].output == "x" and len(upstream.requests) == 1  # the call ran; no round was left


async def test_an_answer_too_large_as_an_event_stream_is_the_calls_413(upstream: FakeUpstream, tool_server: ToolServer, start_proxy) -> None:
    """The SDK's server answers a call as an SSE stream: past the budget there too, whatever the SDK makes of it."""
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url], "max_output_bytes": 65536}))
    upstream.script(Reply(calling("calc__big", '{"size": 200000}')), Reply(answering("too big")))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20) as sdk:
        response = await sdk.responses.create(model="m", input="big", tools=[server(tool_server)])
    call = response.output[1]
    assert call.status == "failed" and (call.error.type, call.error.code) == ("http_error", 413)


async def test_a_result_checked_against_a_hostile_output_schema_cannot_hold_the_proxy(
    upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI
) -> None:
    """The SDK's client checks a result against the tool's output schema on the event loop, with a
    backtracking engine: 2**40 steps here. The proxy sends calls without that check (14.4)."""
    upstream.script(Reply(calling("calc__words", '{"n": 40}')), Reply(answering("words")))
    response = await asyncio.wait_for(sdk.responses.create(model="m", input="words", tools=[server(tool_server)]), 15)
    assert response.output[1].status == "completed" and "a" * 40 + "!" in response.output[1].output


@pytest.mark.parametrize(
    "url",
    ["https://10.0.0.5:6379/x.example.com/", "https://attacker.net/?.example.com/x", "https://a.b.example.com/mcp", "https://me:pw@a.example.com/mcp"],
)
async def test_a_wildcard_entry_admits_its_own_hosts_alone(url: str, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["https://*.example.com/*"]}))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [{"type": "mcp", "server_label": "x", "server_url": url}]})
    assert status == 400 and body["error"]["param"] == "tools[0].server_url", body


@pytest.mark.parametrize(
    ("pattern", "url", "admitted"),
    [
        ("https://*.example.com/*", "https://a.example.com/mcp", True),
        ("https://*.example.com/*", "https://a.example.com:443/mcp", True),  # the port left out: the scheme's
        ("https://*.example.com/*", "https://a.example.com:8443/mcp", False),
        ("https://*.example.com/*", "http://a.example.com/mcp", False),
        ("https://*.example.com/*", "https://a.b.example.com/mcp", False),  # `*` within one label
        ("https://*.example.com/*", "https://example.com/mcp", False),
        ("https://*.example.com/*", "https://a.example.com/mcp#x", False),
        ("https://*.example.com/*", "https://me:pw@a.example.com/mcp", False),
        ("http://*:*/mcp", "http://h:8123/mcp", True),
        ("http://*:*/mcp", "http://h/mcp", True),  # `*`: any port
        ("http://h:8000/mcp", "http://h/mcp", False),
        ("https://h/mcp", "https://h/mcp?x=1", False),  # the path and query as fnmatch reads them
    ],
)
def test_an_allowed_servers_entry_matches_part_by_part(pattern: str, url: str, admitted: bool) -> None:
    """design.md 14.1, each part of an entry against the URL's, as it is sent."""
    assert _allows(pattern, httpx2.URL(url)) is admitted


async def test_an_ipv4_address_inside_an_ipv6_one_is_refused_as_its_ipv4_would_be(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    port = tool_server.url.split(":")[2].split("/")[0]
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["http://*:*/mcp"], "timeout": 2}))
    mapped = f"http://[::ffff:127.0.0.1]:{port}/mcp"
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [{"type": "mcp", "server_label": "x", "server_url": mapped}]})
    assert status == 424 and "internal address" in body["error"]["message"], body
    assert tool_server.headers == []


async def test_a_token_count_runs_no_approved_call(upstream: FakeUpstream, tool_server: ToolServer, sdk: openai.AsyncOpenAI) -> None:
    """Counting tokens, or a turn that generates nothing, runs none of the calls its input approves (14.5)."""
    tools = [server(tool_server, require_approval="always")]
    upstream.script(Reply(calling("calc__delete_item", '{"id": "7"}')))
    asked = await sdk.responses.create(model="m", input="delete 7", tools=tools)
    approval = {"type": "mcp_approval_response", "approval_request_id": asked.output[-1].id, "approve": True}
    counted = await sdk.responses.input_tokens.count(model="m", previous_response_id=asked.id, input=[approval], tools=tools)
    assert counted.input_tokens > 0 and tool_server.calls == []
