"""Remote MCP tools the proxy runs itself (design.md 14), driven by real clients: openai-agents'
`HostedMCPTool` in front of the scripted upstream, and a real model (llama-server) calling a real
tool. The MCP server is the official SDK's, on loopback (tests/mcp_servers.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import openai
import pytest
from agents import (
    Agent,
    HostedMCPTool,
    MCPToolApprovalFunctionResult,
    MCPToolApprovalRequest,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    ToolApprovalItem,
    set_tracing_disabled,
)
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools

from tests.e2e.llama import IM_END, SAME_EVERY_TIME, TOOL_END, behind_the_proxy
from tests.e2e.model import answers, calls, script, tool_round
from tests.fake_upstream import FakeUpstream
from tests.harness import config
from tests.mcp_servers import ToolServer

QUESTION = "What is 2 + 3?"
ANSWER = "2 + 3 is 5."
DECLINED = "I was not allowed to add them."
# A run that loops on approvals, or waits on a server that never answers, fails here instead of
# hanging the suite (the SDK's own timeout is the client's, 20 s, per request).
RUN_TIMEOUT = 30


@pytest.fixture
async def mcp_proxy(upstream: FakeUpstream, tool_server: ToolServer, start_proxy) -> str:
    # The exact URL: a loopback server is allowed only by an entry that names its host (14.1).
    return await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url]}))


class Sent:
    """The Responses requests the SDK sends, recorded on the way out: what the SDK itself sends
    back after an approval, not what the proxy made of it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, request: httpx2.Request) -> None:
        if request.url.path.endswith("/responses"):
            self.bodies.append(json.loads(request.content))


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
async def client(mcp_proxy: str, sent: Sent) -> AsyncIterator[openai.AsyncOpenAI]:
    set_tracing_disabled(True)  # else the SDK posts traces to api.openai.com
    async with (
        httpx2.AsyncClient(event_hooks={"request": [sent]}, timeout=20) as http,
        openai.AsyncOpenAI(base_url=f"{mcp_proxy}/v1", api_key="e2e", max_retries=0, http_client=http) as client,
    ):
        yield client


def calc(tool_server: ToolServer, require_approval: str, **hooks: Any) -> HostedMCPTool:
    tool_config = {
        "type": "mcp",
        "server_label": "calc",
        "server_url": tool_server.url,
        "require_approval": require_approval,
    }
    return HostedMCPTool(tool_config=tool_config, **hooks)  # type: ignore[arg-type]


def calc_agent(client: openai.AsyncOpenAI, tool: HostedMCPTool) -> Agent:
    model = OpenAIResponsesModel(model="qwen3", openai_client=client)
    return Agent(name="assistant", instructions="Use the calculator.", model=model, tools=[tool])


async def run(agent: Agent, **options: Any) -> RunResult:
    async with asyncio.timeout(RUN_TIMEOUT):
        return await Runner.run(agent, QUESTION, **options)


def raw_of(result: RunResult, kind: str) -> list[Any]:
    return [item.raw_item for item in result.new_items if item.type == kind]


async def test_a_call_needing_no_approval_runs_in_the_proxy_within_one_response(
    upstream: FakeUpstream, tool_server: ToolServer, client: openai.AsyncOpenAI, sent: Sent
) -> None:
    script(upstream, calls("calc__add", {"a": 2, "b": 3}, "call_add"), answers(ANSWER))
    agent = calc_agent(client, calc(tool_server, "never"))
    async with asyncio.timeout(RUN_TIMEOUT):
        result = Runner.run_streamed(agent, QUESTION)
        named = [event.name async for event in result.stream_events() if event.type == "run_item_stream_event"]

    assert result.final_output == ANSWER
    # The SDK shows the listing as its own item and the call as a tool call item (no output
    # item: the output is on the call), each from the one Response.
    assert [item.type for item in result.new_items] == ["mcp_list_tools_item", "tool_call_item", "message_output_item"]
    assert named == ["mcp_list_tools", "tool_called", "message_output_created"]
    listing, call = result.new_items[0].raw_item, result.new_items[1].raw_item
    assert isinstance(listing, McpListTools) and listing.server_label == "calc"
    assert "add" in [tool.name for tool in listing.tools]
    assert isinstance(call, McpCall)
    assert (call.server_label, call.name, json.loads(call.arguments), call.output, call.status) == (
        "calc",
        "add",
        {"a": 2, "b": 3},
        "5",
        "completed",
    )
    assert tool_server.calls == [("add", {"a": 2, "b": 3})]
    assert len(result.raw_responses) == len(sent.bodies) == 1  # the SDK ran nothing itself
    assert sent.bodies[0]["tools"] == [
        {"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never"}
    ]
    # The model read the call and the server's answer before it answered.
    assistant, tool = tool_round(upstream)
    assert assistant["tool_calls"][0]["function"]["name"] == "calc__add" and tool["content"] == "5"


@pytest.mark.parametrize("chained", [False, True], ids=["whole-history", "previous-response-id"])
async def test_an_approved_call_is_sent_back_and_run_by_the_proxy(
    upstream: FakeUpstream, tool_server: ToolServer, client: openai.AsyncOpenAI, sent: Sent, chained: bool
) -> None:
    """The SDK's callback approves; the SDK sends its `mcp_approval_response` in the next
    request (with the whole history, or only it after `previous_response_id`), and that
    request's Response opens with the call the proxy ran."""
    script(upstream, calls("calc__add", {"a": 2, "b": 3}, "call_add"), answers(ANSWER))
    asked: list[McpApprovalRequest] = []

    def approve(request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
        asked.append(request.data)
        assert tool_server.calls == []  # nothing runs before the answer
        return {"approve": True}

    result = await run(
        calc_agent(client, calc(tool_server, "always", on_approval_request=approve)), auto_previous_response_id=chained
    )

    assert result.final_output == ANSWER
    assert [item.type for item in result.new_items] == [
        "mcp_list_tools_item",
        "mcp_approval_request_item",
        "mcp_approval_response_item",
        "tool_call_item",
        "message_output_item",
    ]
    [request] = asked
    assert (request.server_label, request.name, json.loads(request.arguments)) == ("calc", "add", {"a": 2, "b": 3})
    [call] = raw_of(result, "tool_call_item")
    assert isinstance(call, McpCall)
    assert (call.name, call.output, call.approval_request_id) == ("add", "5", request.id)
    assert tool_server.calls == [("add", {"a": 2, "b": 3})]

    _, second = sent.bodies
    approval = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    if chained:
        assert second["previous_response_id"] == result.raw_responses[0].response_id
        assert second["input"] == [approval]
    else:
        assert "previous_response_id" not in second
        assert [item.get("type") for item in second["input"]] == [
            None,
            "mcp_list_tools",
            "mcp_approval_request",
            "mcp_approval_response",
        ]
        assert second["input"][-1] == approval
    # The listing in the history (sent back, or the chain's) is used: the second Response lists nothing.
    assert [item.type for item in result.raw_responses[1].output] == ["mcp_call", "message"]
    assistant, tool = tool_round(upstream)
    assert assistant["tool_calls"][0]["id"] == request.id and tool["content"] == "5"


async def test_a_rejected_call_is_never_run_and_the_model_is_told(
    upstream: FakeUpstream, tool_server: ToolServer, client: openai.AsyncOpenAI, sent: Sent
) -> None:
    script(upstream, calls("calc__add", {"a": 2, "b": 3}, "call_add"), answers(DECLINED))

    def reject(request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
        return {"approve": False, "reason": "no arithmetic today"}

    result = await run(calc_agent(client, calc(tool_server, "always", on_approval_request=reject)))

    assert result.final_output == DECLINED
    assert [item.type for item in result.new_items] == [
        "mcp_list_tools_item",
        "mcp_approval_request_item",
        "mcp_approval_response_item",
        "message_output_item",
    ]
    [request] = raw_of(result, "mcp_approval_request_item")
    assert sent.bodies[-1]["input"][-1] == {
        "type": "mcp_approval_response",
        "approval_request_id": request.id,
        "approve": False,
        "reason": "no arithmetic today",
    }
    assert tool_server.calls == []
    assert [item.type for item in result.raw_responses[-1].output] == ["message"]
    _, tool = tool_round(upstream)
    assert tool["tool_call_id"] == request.id and "no arithmetic today" in tool["content"]


async def test_without_a_callback_the_run_stops_for_approval_and_resumes_from_its_state(
    upstream: FakeUpstream, tool_server: ToolServer, client: openai.AsyncOpenAI, sent: Sent
) -> None:
    """The SDK's human-in-the-loop path: no `on_approval_request`, so the request is an
    interruption; approved on the run's state, the resumed run sends the approval."""
    script(upstream, calls("calc__add", {"a": 2, "b": 3}, "call_add"), answers(ANSWER))
    agent = calc_agent(client, calc(tool_server, "always"))

    stopped = await run(agent)
    [pending] = stopped.interruptions
    assert isinstance(pending, ToolApprovalItem) and pending.tool_name == "add"
    assert stopped.final_output is None and tool_server.calls == []

    state = stopped.to_state()
    state.approve(pending)
    async with asyncio.timeout(RUN_TIMEOUT):
        resumed = await Runner.run(agent, state)

    assert resumed.final_output == ANSWER and resumed.interruptions == []
    assert tool_server.calls == [("add", {"a": 2, "b": 3})]
    approval = sent.bodies[-1]["input"][-1]
    assert (approval["type"], approval["approve"], approval["approval_request_id"]) == (
        "mcp_approval_response",
        True,
        pending.raw_item.id,
    )


# -- a real model -----------------------------------------------------------------------------------

# The model repeats the last user message (tests/e2e/llama.py): this one makes it call the tool.
# llama-server does not enforce a named (or `required`) tool_choice with this template, so the
# forced choice below is what a client sends, and the prompt is what makes the call.
ADD_CALL = '<tool_call>\n{"name": "calc__add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


async def test_a_real_model_calls_a_real_mcp_tool_then_answers(
    start_proxy, tool_server: ToolServer, http: aiohttp.ClientSession
) -> None:
    # The first round stops at the call's end; the second, after the tool's result, at the end of
    # its turn (the model writes markup, never EOS).
    defaults = {"stop": [TOOL_END, IM_END], **SAME_EVERY_TIME}
    mcp = {"allowed_servers": [tool_server.url]}
    async with behind_the_proxy(start_proxy, "tools", TOOL_END, mcp=mcp, defaults=defaults) as (proxy, _):
        # allowed_tools: one function in the prompt keeps the rounds short on the CPU.
        tool = {
            "type": "mcp",
            "server_label": "calc",
            "server_url": tool_server.url,
            "require_approval": "never",
            "allowed_tools": ["add"],
        }
        body = {
            "model": "m",
            "temperature": 0,
            "input": ADD_CALL,
            "tools": [tool],
            "tool_choice": {"type": "mcp", "server_label": "calc", "name": "add"},
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "max_output_tokens": 300,
        }
        async with asyncio.timeout(180), http.post(f"{proxy}/v1/responses", json=body) as answered:
            assert answered.status == 200, await answered.text()
            response = await answered.json()

    assert response["status"] == "completed", response["incomplete_details"]
    assert [item["type"] for item in response["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    _, call, message = response["output"]
    arguments = json.loads(call["arguments"])
    assert (call["server_label"], call["name"], call["status"], call["error"]) == ("calc", "add", "completed", None)
    assert call["output"] == str(arguments["a"] + arguments["b"])  # what the server computed from what the model said
    assert tool_server.calls == [("add", arguments)]

    [part] = message["content"]
    scores = part["logprobs"]
    assert part["text"] != "" and scores and all(len(score["top_logprobs"]) == 2 for score in scores)
    # Both rounds' tokens are on the one message (design.md 3.8): the call, then the answer.
    said = "".join(score["token"] for score in scores)
    assert said.endswith(part["text"]), (said, part["text"])
    call_text = said[: len(said) - len(part["text"])].strip()
    assert call_text.startswith("<tool_call>"), call_text
    assert json.loads(call_text.removeprefix("<tool_call>")) == {"name": "calc__add", "arguments": arguments}
