"""Tool outputs and calls as input (design.md 8.2, 8.13), through the real proxy over HTTP and the
WebSocket transport: a malformed native item is a 400 naming its field, as the openai SDK's types
have it; an output that answers no call (none made, answered already, before its call, of another
kind) is a 400 naming the item, as OpenAI answers, its call looked up in the input and in the
history read from the store; Codex's `function_call_output` for its `local_shell_call` and an
output after a compaction item that stands for its call are what real clients send, and go."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from agents.sandbox.capabilities.compaction import Compaction

from proxy.responses.compaction import HEAD
from tests.client import create, stream
from tests.events import check_stream
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score

SHELL = {"type": "shell", "environment": {"type": "local"}}
TOOLS = [SHELL, {"type": "apply_patch"}, {"type": "local_shell"}, {"type": "function", "name": "exec", "parameters": {"type": "object", "properties": {}}}, {"type": "custom", "name": "patch"}]
ASK = {"type": "message", "role": "user", "content": "go"}
RAN = {"stdout": "hi\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
SHELL_CALL = {"type": "shell_call", "call_id": "c1", "action": {"commands": ["echo hi"]}}
SHELL_OUTPUT = {"type": "shell_call_output", "call_id": "c1", "output": [RAN]}
LOCAL_CALL = {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "action": {"type": "exec", "command": ["true"], "env": {}}}
LOCAL_OUTPUT = {"type": "local_shell_call_output", "call_id": "c1", "output": "ok"}
PATCH_CALL = {"type": "apply_patch_call", "call_id": "c1", "operation": {"type": "delete_file", "path": "x"}}
PATCH_OUTPUT = {"type": "apply_patch_call_output", "call_id": "c1", "status": "completed"}
CALL = {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "done"}


def answering(text: str) -> Generation:
    return Generation([Step("text", text, [score(text)]), Step("finish", finish_reason="stop")])


def calling(name: str, arguments: dict[str, Any], id: str = "call_1") -> Generation:
    text = orjson.dumps(arguments).decode()
    return Generation([Step("tool", text, [score(text)], tool_id=id, tool_name=name), Step("finish", finish_reason="tool_calls")])


def with_(item: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**item, **fields}


# Each malformed item, in the input [ASK, call, output], and the path its 400 names.
MALFORMED = [
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[with_(RAN, outcome="success")]), "input[2].output[0].outcome", id="outcome-a-string"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[with_(RAN, outcome=[0])]), "input[2].output[0].outcome", id="outcome-a-list"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[with_(RAN, outcome={"type": "success"})]), "input[2].output[0].outcome.type", id="outcome-of-no-type"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[with_(RAN, outcome={"type": "exit", "exit_code": "0"})]), "input[2].output[0].outcome.exit_code", id="exit-code-a-string"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[with_(RAN, stdout=7)]), "input[2].output[0].stdout", id="stdout-a-number"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[with_(RAN, stdout=["hi"])]), "input[2].output[0].stdout", id="stdout-a-list"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output=[RAN, {"stdout": "", "outcome": {"type": "timeout"}}]), "input[2].output[1].stderr", id="stderr-left-out"),
    pytest.param(SHELL_CALL, with_(SHELL_OUTPUT, output="hi"), "input[2].output", id="output-a-string"),
    pytest.param(with_(SHELL_CALL, action={"commands": "echo hi"}), SHELL_OUTPUT, "input[1].action.commands", id="commands-a-string"),
    pytest.param(with_(SHELL_CALL, action={"commands": ["ls"], "timeout_ms": "5s"}), SHELL_OUTPUT, "input[1].action.timeout_ms", id="timeout-a-string"),
    pytest.param(LOCAL_CALL, with_(LOCAL_OUTPUT, output=["ok"]), "input[2].output", id="local-output-a-list"),
    pytest.param(with_(LOCAL_CALL, action={"type": "exec", "command": ["true"], "env": {"A": 1}}), LOCAL_OUTPUT, "input[1].action.env", id="env-value-a-number"),
    pytest.param(with_(LOCAL_CALL, action={"type": "exec", "command": "true", "env": {}}), LOCAL_OUTPUT, "input[1].action.command", id="command-a-string"),
    pytest.param(PATCH_CALL, with_(PATCH_OUTPUT, status="done"), "input[2].status", id="patch-status-unknown"),
    pytest.param(PATCH_CALL, with_(PATCH_OUTPUT, output=["x"]), "input[2].output", id="patch-output-a-list"),
    pytest.param(with_(PATCH_CALL, operation={"type": "rename_file", "path": "x"}), PATCH_OUTPUT, "input[1].operation.type", id="operation-unknown"),
    pytest.param(with_(PATCH_CALL, operation={"type": "delete_file", "path": 5}), PATCH_OUTPUT, "input[1].operation.path", id="path-a-number"),
    pytest.param(LOCAL_CALL, {"type": "local_shell_call_output", "output": "ok"}, "input[2].call_id", id="local-output-naming-no-call"),
]


@pytest.mark.parametrize(("call", "output", "param"), MALFORMED)
async def test_a_malformed_native_item_is_a_400_naming_its_field(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, call: dict, output: dict, param: str
) -> None:
    status, body = await create(http, proxy, {"model": "m", "input": [ASK, call, output], "tools": TOOLS})
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []


@pytest.mark.parametrize(("call", "output", "param"), MALFORMED[:8:2])
async def test_a_malformed_native_item_is_an_error_frame_400_on_a_websocket(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, call: dict, output: dict, param: str
) -> None:
    upstream.script(Reply(answering("still here")))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": [ASK, call, output], "tools": TOOLS})
        error = await socket.receive_json(timeout=10)
        assert error["type"] == "error" and error["status"] == 400 and error["error"]["param"] == param, error
        # The connection goes on (design.md 8.9).
        await socket.send_json({"type": "response.create", "model": "m", "input": "hi"})
        events = [await socket.receive_json(timeout=10) for _ in range(3)]
    assert events[0]["type"] == "response.created"


async def test_a_shell_output_the_agents_sdk_sends_with_no_exit_code_is_read(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """openai-agents sends `exit_code: null` where its executor gave none: the SDK's type wants an
    int, but nothing the model reads is lost by taking it."""
    upstream.script(Reply(answering("ok")))
    ran = {"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": None}}
    status, body = await create(http, proxy, {"model": "m", "input": [ASK, SHELL_CALL, with_(SHELL_OUTPUT, output=[ran])], "tools": TOOLS})
    assert status == 200, body
    tool = upstream.requests[0]["messages"][-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "c1" and "a.txt" in tool["content"] and "None" not in tool["content"]


# -- outputs that answer no call --------------------------------------------------------------

UNANSWERED = [
    pytest.param([ASK, OUTPUT], 1, id="no-call-made"),
    pytest.param([ASK, CALL, OUTPUT, OUTPUT], 3, id="answered-twice"),
    pytest.param([ASK, OUTPUT, CALL], 1, id="before-its-call"),
    pytest.param([ASK, CALL, with_(SHELL_OUTPUT)], 2, id="shell-output-for-a-function-call"),
    pytest.param([ASK, CALL, {"type": "custom_tool_call_output", "call_id": "c1", "output": "x"}], 2, id="custom-output-for-a-function-call"),
    pytest.param([ASK, SHELL_CALL, OUTPUT], 2, id="function-output-for-a-shell-call"),
    pytest.param([ASK, PATCH_CALL, LOCAL_OUTPUT], 2, id="local-shell-output-for-a-patch"),
]


@pytest.mark.parametrize(("items", "index"), UNANSWERED)
async def test_an_output_that_answers_no_call_is_a_400_naming_it(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, items: list, index: int
) -> None:
    status, body = await create(http, proxy, {"model": "m", "input": items, "tools": TOOLS})
    assert status == 400, body
    assert body["error"]["param"] == f"input[{index}]"
    kind = items[index]["type"].replace("_", " ")
    assert body["error"]["message"].startswith(f"No tool call found for {kind} with call_id c1")
    assert upstream.requests == []


async def test_an_output_that_answers_no_call_is_an_error_frame_400_on_a_websocket(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": [ASK, CALL, SHELL_OUTPUT], "tools": TOOLS})
        error = await socket.receive_json(timeout=10)
    assert error["type"] == "error" and error["status"] == 400 and error["error"]["param"] == "input[2]", error
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("call", "output"),
    [
        pytest.param(CALL, OUTPUT, id="function"),
        pytest.param(SHELL_CALL, SHELL_OUTPUT, id="shell"),
        pytest.param(PATCH_CALL, PATCH_OUTPUT, id="apply-patch"),
        pytest.param(LOCAL_CALL, LOCAL_OUTPUT, id="local-shell"),
        pytest.param(LOCAL_CALL, OUTPUT, id="codex-function-output-for-local-shell"),
    ],
)
async def test_an_output_answers_its_call_in_the_stored_chain(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, call: dict, output: dict
) -> None:
    """The call is in the chain read from the store (design.md 9.4): the output that answers it
    goes, over HTTP and on a WebSocket; the same output again is answered already. Codex answers
    its `local_shell_call` with a `function_call_output`."""
    upstream.script(Reply(answering("ran")), Reply(answering("first")), Reply(answering("second")))
    status, first = await create(http, proxy, {"model": "m", "input": [ASK, call], "tools": TOOLS})
    assert status == 200, first
    status, second = await create(http, proxy, {"model": "m", "input": [output], "tools": TOOLS, "previous_response_id": first["id"]})
    assert status == 200, second
    tool = upstream.requests[-1]["messages"][-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "c1"
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": [output], "tools": TOOLS, "previous_response_id": first["id"]})
        events = [await socket.receive_json(timeout=10) for _ in range(2)]
        assert events[0]["type"] == "response.created", events
        while events[-1]["type"] != "response.completed":
            events.append(await socket.receive_json(timeout=10))
        await socket.send_json({"type": "response.create", "model": "m", "input": [output], "tools": TOOLS, "previous_response_id": second["id"]})
        error = await socket.receive_json(timeout=10)
    assert error["type"] == "error" and error["status"] == 400 and error["error"]["param"] == "input[0]", error
    assert "answered by an earlier output" in error["error"]["message"]


async def test_an_output_of_a_call_the_chain_never_made_is_a_400(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(answering("hello")))
    status, first = await create(http, proxy, {"model": "m", "input": "hi"})
    assert status == 200
    status, body = await create(http, proxy, {"model": "m", "input": [ASK, OUTPUT], "tools": TOOLS, "previous_response_id": first["id"]})
    assert status == 400 and body["error"]["param"] == "input[1]", body


async def test_an_output_answers_a_call_the_conversation_holds(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """A conversation's items are the history (design.md 9.7): its call is answered by a turn's
    output; an orphan it kept is read as kept, never refused on a later turn."""
    upstream.script(Reply(answering("ran")), Reply(answering("and again")))
    orphan = with_(OUTPUT, call_id="c0")
    async with http.post(f"{proxy}/v1/conversations", json={"items": [ASK, orphan, CALL]}) as made:
        assert made.status == 200, await made.text()
        conversation = (await made.json())["id"]
    status, body = await create(http, proxy, {"model": "m", "input": [OUTPUT], "tools": TOOLS, "conversation": conversation})
    assert status == 200, body
    assert upstream.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "done"}
    status, body = await create(http, proxy, {"model": "m", "input": [OUTPUT], "tools": TOOLS, "conversation": conversation})
    assert status == 400 and body["error"]["param"] == "input[0]", body


# -- compaction: a summary that stands for the calls before it (8.8, 8.10) --------------------

SUMMARY = "The user asked to list the files; exec was called to list them."


async def test_an_output_after_the_compaction_that_stands_for_its_call(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """A turn compacted after it called a tool (design.md 8.10) ends [function_call, compaction];
    openai-agents' sandbox agents send only what follows the last compaction item, so the call's
    output comes after the summary with its call gone: read as a user message naming the call
    (a tool message must follow its call), and a second output for it is still a 400."""
    threshold = [{"type": "compaction", "compact_threshold": 120}]
    called = Generation([Step("tool", "{}", tool_id="c1", tool_name="exec"), Step("finish", finish_reason="tool_calls")], prompt_tokens=150)
    summarised = Generation([Step("text", SUMMARY), Step("finish", finish_reason="stop")])
    upstream.script(Reply(called), Reply(summarised), Reply(answering("a.py b.py")))
    status, first = await create(http, proxy, {"model": "m", "input": "list the files", "tools": TOOLS, "context_management": threshold})
    assert status == 200, first
    assert [item["type"] for item in first["output"]] == ["function_call", "compaction"]
    sent = Compaction().process_context([{"role": "user", "content": "list the files"}, *first["output"], OUTPUT])
    assert [item["type"] for item in sent] == ["compaction", "function_call_output"]  # the call is gone
    status, body = await create(http, proxy, {"model": "m", "input": sent, "tools": TOOLS})
    assert status == 200, body
    assert upstream.requests[-1]["messages"] == [
        {"role": "user", "content": HEAD + SUMMARY},
        {"role": "user", "content": "[output of the tool call c1]\ndone"},
    ]
    status, body = await create(http, proxy, {"model": "m", "input": [*sent, OUTPUT], "tools": TOOLS})
    assert status == 400 and body["error"]["param"] == "input[2]", body


async def test_a_native_call_the_model_wrote_off_its_schema_goes_back_as_the_sdks_type(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """The proxy's own call items are the SDK's types (design.md 8.13), values the model wrote
    off its function's schema left out, so that its client can send them back."""
    upstream.script(
        Reply(calling("shell", {"commands": ["ls"], "timeout_ms": "5s"}, "c1")),
        Reply(calling("local_shell", {"command": ["ls"], "env": {"A": 1}, "working_directory": 3}, "c2")),
        Reply(answering("done")),
    )
    shell = check_stream(await stream(http, proxy, {"model": "m", "input": "look", "tools": TOOLS}))
    (shell_call,) = shell.of_type("shell_call")
    assert shell_call["action"] == {"commands": ["ls"]}
    local = check_stream(await stream(http, proxy, {"model": "m", "input": "look", "tools": TOOLS}))
    (local_call,) = local.of_type("local_shell_call")
    assert local_call["action"] == {"type": "exec", "command": ["ls"], "env": {}}
    history = [ASK, shell_call, with_(SHELL_OUTPUT, call_id="c1"), local_call, with_(LOCAL_OUTPUT, call_id="c2")]
    status, body = await create(http, proxy, {"model": "m", "input": history, "tools": TOOLS})
    assert status == 200, body


async def test_a_native_call_answered_after_the_compaction_stays_with_its_output(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """As a function call is (design.md 8.8): a shell call whose output comes after the summary
    is moved after it, so that its output is the tool message that follows it."""
    threshold = [{"type": "compaction", "compact_threshold": 120}]
    text = orjson.dumps({"commands": ["ls"]}).decode()
    called = Generation([Step("tool", text, tool_id="c1", tool_name="shell"), Step("finish", finish_reason="tool_calls")], prompt_tokens=150)
    summarised = Generation([Step("text", SUMMARY), Step("finish", finish_reason="stop")])
    upstream.script(Reply(called), Reply(summarised), Reply(answering("a.py b.py")))
    asked = {"role": "user", "content": "list the files"}
    status, first = await create(http, proxy, {"model": "m", "input": [asked], "tools": TOOLS, "context_management": threshold})
    assert status == 200 and [item["type"] for item in first["output"]] == ["shell_call", "compaction"], first
    status, body = await create(http, proxy, {"model": "m", "input": [asked, *first["output"], SHELL_OUTPUT], "tools": TOOLS})
    assert status == 200, body
    *_, summary, call, output = upstream.requests[-1]["messages"]
    assert summary == {"role": "user", "content": HEAD + SUMMARY}
    assert call["role"] == "assistant" and call["tool_calls"][0]["id"] == "c1" and call["tool_calls"][0]["function"]["name"] == "shell"
    assert output == {"role": "tool", "tool_call_id": "c1", "content": "hi\n\n(exit code 0)"}
