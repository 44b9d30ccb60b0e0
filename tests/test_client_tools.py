"""Tools the client runs in the newest SDKs' own shapes (design.md 8.13): `shell` with a local
environment, `local_shell` and `apply_patch` offered to the model as functions, its calls answered
as the native items with their events, the client's outputs read back; and openai-agents' own
`ShellTool` and `ApplyPatchTool` running through the proxy, streamed and not."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest
from agents import Agent, ApplyPatchTool, ModelSettings, OpenAIResponsesModel, Runner, ShellTool, set_tracing_disabled
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.tool import ShellCommandOutput, ShellCommandRequest, ShellResult

from tests.client import create, stream
from tests.events import check_stream
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score

SHELL = {"type": "shell", "environment": {"type": "local"}}
set_tracing_disabled(True)  # it would post traces to api.openai.com


def calling(name: str, arguments: dict[str, Any], id: str = "call_1") -> Generation:
    text = orjson.dumps(arguments).decode()
    return Generation([Step("tool", text, [score(text)], tool_id=id, tool_name=name), Step("finish", finish_reason="tool_calls")])


def answering(text: str) -> Generation:
    return Generation([Step("text", text, [score(text)]), Step("finish", finish_reason="stop")])


async def test_a_shell_call_comes_back_as_a_shell_call_with_its_command_events(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    upstream.script(Reply(calling("shell", {"commands": ["ls -la", "pwd"], "timeout_ms": 5000})))
    events = await stream(http, proxy, {"model": "m", "input": "look around", "tools": [SHELL, {"type": "apply_patch"}]})
    checked = check_stream(events)  # the SDK's own types for every event and item
    (call,) = checked.of_type("shell_call")
    assert call["call_id"] == "call_1" and call["status"] == "completed"
    assert call["action"] == {"commands": ["ls -la", "pwd"], "timeout_ms": 5000}
    commands = [(event["type"].rsplit(".", 1)[1], event["command_index"], event.get("command", event.get("delta"))) for event in events if event["type"].startswith("response.shell_call_command.")]
    assert commands == [("added", 0, ""), ("delta", 0, "ls -la"), ("done", 0, "ls -la"), ("added", 1, ""), ("delta", 1, "pwd"), ("done", 1, "pwd")]
    offered = upstream.requests[0]["tools"]
    assert [tool["function"]["name"] for tool in offered] == ["shell", "apply_patch"]
    assert offered[0]["function"]["parameters"]["required"] == ["commands"]
    assert checked.response["tools"] == [SHELL, {"type": "apply_patch"}]


@pytest.mark.parametrize(
    ("tool", "name", "arguments", "item", "field", "value"),
    [
        ({"type": "apply_patch"}, "apply_patch", {"type": "create_file", "path": "a.txt", "diff": "+hi\n"}, "apply_patch_call", "operation", {"type": "create_file", "path": "a.txt", "diff": "+hi\n"}),
        ({"type": "local_shell"}, "local_shell", {"command": ["ls"], "timeout_ms": 100}, "local_shell_call", "action", {"type": "exec", "command": ["ls"], "env": {}, "timeout_ms": 100}),
    ],
)
async def test_a_native_call_is_its_own_item(
    upstream: FakeUpstream, sdk: openai.AsyncOpenAI, tool: dict, name: str, arguments: dict, item: str, field: str, value: dict
) -> None:
    upstream.script(Reply(calling(name, arguments)))
    response = await sdk.responses.create(model="m", input="go", tools=[tool])
    (call,) = response.output
    assert call.type == item and call.call_id == "call_1"
    assert getattr(call, field).model_dump(exclude_none=True) == value


async def test_the_clients_outputs_are_the_models_tool_messages(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    history = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "shell_call", "id": "sh_1", "call_id": "c1", "status": "completed", "action": {"commands": ["echo hi"]}},
        {"type": "shell_call_output", "call_id": "c1", "output": [{"stdout": "hi\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
        {"type": "apply_patch_call", "id": "apc_1", "call_id": "c2", "status": "completed", "operation": {"type": "delete_file", "path": "x"}},
        {"type": "apply_patch_call_output", "call_id": "c2", "status": "failed", "output": "no such file"},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c3", "status": "completed", "action": {"type": "exec", "command": ["true"], "env": {}}},
        {"type": "local_shell_call_output", "call_id": "c3", "output": "ok"},
    ]
    upstream.script(Reply(answering("done")))
    status, body = await create(http, proxy, {"model": "m", "input": history, "tools": [SHELL, {"type": "apply_patch"}, {"type": "local_shell"}]})
    assert status == 200, body
    messages = upstream.requests[0]["messages"][1:]
    calls = [(message["tool_calls"][0]["function"]["name"], orjson.loads(message["tool_calls"][0]["function"]["arguments"])) for message in messages if message["role"] == "assistant"]
    assert calls == [("shell", {"commands": ["echo hi"]}), ("apply_patch", {"type": "delete_file", "path": "x"}), ("local_shell", {"command": ["true"], "env": {}})]
    results = [(message["tool_call_id"], message["content"]) for message in messages if message["role"] == "tool"]
    assert results == [("c1", "hi\n\n(exit code 0)"), ("c2", "no such file"), ("c3", "ok")]


async def test_a_shell_in_a_hosted_container_stays_a_hosted_tool(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(answering("no shell")))
    container = {"type": "shell", "environment": {"type": "container_auto"}}
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [container]})
    assert status == 200 and "tools" not in upstream.requests[0] and body["tools"] == []


async def test_tool_choice_forces_shell_or_apply_patch(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(answering("a")), Reply(answering("b")))
    for kind in ("shell", "apply_patch"):
        status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [SHELL, {"type": "apply_patch"}], "tool_choice": {"type": kind}})
        assert status == 200, body
        assert upstream.requests[-1]["tool_choice"] == {"type": "function", "function": {"name": kind}}
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [SHELL], "tool_choice": {"type": "apply_patch"}})
    assert status == 400 and body["error"]["param"] == "tool_choice"


# -- openai-agents' own tools through the proxy -----------------------------------------------------


class Editor:
    """An editor that keeps its files in memory, so that a test sees what the agent did."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.files[operation.path] = operation.diff or ""
        return ApplyPatchResult(output=f"created {operation.path}")

    def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.files[operation.path] += operation.diff or ""
        return ApplyPatchResult(output=f"updated {operation.path}")

    def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        del self.files[operation.path]
        return ApplyPatchResult(output=f"deleted {operation.path}")


@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_shell_and_apply_patch_tools_run_through_the_proxy(upstream: FakeUpstream, proxy: str, streamed: bool) -> None:
    ran: list[list[str]] = []

    def executor(request: ShellCommandRequest) -> ShellResult:
        ran.append(list(request.data.action.commands))
        return ShellResult(output=[ShellCommandOutput(stdout="notes.txt\n", command=command) for command in request.data.action.commands])

    editor = Editor()
    upstream.script(
        Reply(calling("shell", {"commands": ["ls"]})),
        Reply(calling("apply_patch", {"type": "create_file", "path": "todo.txt", "diff": "+buy milk\n"}, "call_2")),
        Reply(answering("Listed and wrote todo.txt.")),
    )
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=20)
    model = OpenAIResponsesModel("m", client)
    agent = Agent(
        name="coder",
        model=model,
        tools=[ShellTool(executor=executor, environment={"type": "local"}), ApplyPatchTool(editor=editor)],
        model_settings=ModelSettings(store=False),
    )
    if streamed:
        result = Runner.run_streamed(agent, "list the files, then write todo.txt")
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, "list the files, then write todo.txt")
    await client.close()
    assert result.final_output == "Listed and wrote todo.txt."
    assert ran == [["ls"]] and editor.files == {"todo.txt": "+buy milk\n"}
    # The model read each tool's result as its call's tool message.
    second, third = upstream.requests[1]["messages"], upstream.requests[2]["messages"]
    assert second[-1]["role"] == "tool" and "notes.txt" in second[-1]["content"]
    assert third[-1]["role"] == "tool" and third[-1]["content"] == "created todo.txt"
