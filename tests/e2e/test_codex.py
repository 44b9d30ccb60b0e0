"""Codex CLI (`codex exec`, defaults but for a custom provider) through the proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from proxy.config import parse
from proxy.responses.compaction import HEAD, PROMPT
from tests.e2e.clients import Codex, CodexRun
from tests.e2e.model import answers, calls, chat_tools, script, tool_round
from tests.fake_upstream import FakeUpstream, Generation, Reply
from tests.mcp_servers import ToolServer

DONE = "All done."
# codex-rs' count of MCP tools past which it deferred them behind its tool search, before 0.171.
DIRECT_MCP_TOOL_EXPOSURE_THRESHOLD = 100


async def test_exec_command_turn(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    # Text before the call: the message stays open while the call streams (design.md 4.3).
    # The arithmetic shows that a shell ran the command: its text alone has no 42.
    script(upstream, calls("exec_command", {"cmd": "echo e2e-$((6*7))"}, "call_echo", text="Running it."), answers(DONE))

    run = await codex.exec(proxy, "Print the marker.", tmp_path)

    assert run.rc == 0, run.transcript
    commands = run.completed("command_execution")
    assert [(c["exit_code"], c["status"]) for c in commands] == [(0, "completed")], run.transcript
    assert "e2e-42" in commands[0]["aggregated_output"], run.transcript
    assert [m["text"] for m in run.completed("agent_message")] == ["Running it.", DONE], run.transcript
    assert "exec_command" in chat_tools(upstream.requests[0])
    assistant, result = tool_round(upstream)
    assert assistant.get("content") == "Running it.", assistant
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == "exec_command"
    assert json.loads(call["function"]["arguments"]) == {"cmd": "echo e2e-$((6*7))"}
    assert "e2e-42" in result["content"]


async def test_reasoning_is_shown_and_replayed(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    thought = "The user wants the date; running date shows it."
    script(upstream, calls("exec_command", {"cmd": "date"}, "call_date", reasoning=thought), answers(DONE))

    run = await codex.exec(proxy, "What is the date?", tmp_path)

    assert run.rc == 0, run.transcript
    # Codex shows reasoning only from summary events (design.md 8.5).
    assert [item["text"] for item in run.completed("reasoning")] == [thought], run.transcript
    assert run.answer == DONE, run.transcript
    assistant, _ = tool_round(upstream)
    assert assistant.get("reasoning_content") == thought, assistant


async def test_namespace_tool_call(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    # A multi_agent_v1 member: Codex runs it only when the call names its namespace.
    name = "multi_agent_v1__wait_agent"
    script(upstream, calls(name, {"targets": ["no-such-agent"], "timeout_ms": 10000}, "call_wait"), answers(DONE))

    run = await codex.exec(proxy, "Wait for the agent.", tmp_path)

    assert run.rc == 0, run.transcript
    assert run.answer == DONE, run.transcript
    assert name in chat_tools(upstream.requests[0])
    assistant, result = tool_round(upstream)
    # The namespace tool ran and refused the made-up id; a call it could not route reads
    # "unsupported call: wait_agent".
    assert result["content"].startswith("invalid agent id no-such-agent"), result
    assert assistant["tool_calls"][0]["function"]["name"] == name


async def test_custom_tool_call(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    # gpt-5.5 models get the custom (freeform, lark grammar) apply_patch tool.
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi from the model\n*** End Patch\n"
    script(upstream, calls("apply_patch", {"input": patch}, "call_patch"), answers(DONE))

    run = await codex.exec(proxy, "Create hello.txt.", tmp_path, model="gpt-5.5-local", flags=("--sandbox", "workspace-write"))

    assert run.rc == 0, run.transcript
    assert [change["status"] for change in run.completed("file_change")] == ["completed"], run.transcript
    assert (tmp_path / "hello.txt").read_text() == "hi from the model\n"
    assert run.answer == DONE, run.transcript
    apply_patch = chat_tools(upstream.requests[0])["apply_patch"]
    assert list(apply_patch["parameters"]["properties"]) == ["input"]
    assert "begin_patch hunk+ end_patch" in apply_patch["description"]  # the lark grammar, so the model knows the syntax
    assistant, result = tool_round(upstream)
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"input": patch}
    assert "Success. Updated the following files:\nA hello.txt" in result["content"], result


SUMMARY = "The user asked for the marker; echo printed it."


def compacting(upstream: FakeUpstream) -> None:
    """A first answer whose prompt is 9000 tokens long, a summary when asked for one, then the
    end once the summary is in the conversation."""
    first = Generation(calls("exec_command", {"cmd": "echo e2e-marker"}, "call_echo"), prompt_tokens=9000)

    def choose(body: dict[str, Any]) -> Reply:
        said = [m.get("content") for m in body["messages"]]
        if said[-1] == PROMPT:
            return Reply(Generation(answers(SUMMARY)))
        if any(isinstance(text, str) and text.startswith(HEAD) for text in said):
            return Reply(Generation(answers(DONE)))
        return Reply(first)

    upstream.choose = choose


def compacted(run: CodexRun, upstream: FakeUpstream) -> None:
    assert run.rc == 0, run.transcript
    asked = [r["messages"][-1].get("content") for r in upstream.requests]
    assert PROMPT in asked, asked  # Codex compacted through the proxy
    assert run.answer == DONE, run.transcript
    after = upstream.requests[-1]["messages"]
    assert {"role": "user", "content": HEAD + SUMMARY} in after, after


async def test_a_provider_named_openai_compacts_through_the_proxy(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    """design.md 8.8: Codex compacts remotely when its provider is named OpenAI, and has no
    fallback. A first answer that reports a prompt past the auto-compact limit makes it compact
    (its compaction_trigger turn, or /v1/responses/compact); it then goes on from the summary."""
    compacting(upstream)
    flags = ("-c", "model_context_window=16000", "-c", "model_auto_compact_token_limit=4000")
    compacted(await codex.exec(proxy, "Print the marker.", tmp_path, flags=flags, name="OpenAI"), upstream)


async def test_codex_reads_the_context_window_from_the_model_card(codex: Codex, upstream: FakeUpstream, start_proxy, tmp_path: Path) -> None:
    """design.md 8.11: with a model card (its key from a command, so that Codex asks for one),
    Codex takes the card's instructions and context window: the 9000-token prompt is past 90%
    of its 4400, and Codex compacts with no context flag of its own (its default is 272k)."""
    instructions = "You are an e2e coding agent; be brief."
    config = {
        "upstreams": [{"name": "u", "urls": [upstream.url], "context_window": 4400}],
        "routes": [{"model": "qwen3", "upstream": "u", "codex": {"base_instructions": instructions}}],
    }
    url = await start_proxy(parse(config))
    compacting(upstream)
    run = await codex.exec(url, "Print the marker.", tmp_path, command_auth=True, name="OpenAI")
    compacted(run, upstream)
    assert not [e for e in run.events if e.get("item", {}).get("type") == "error"], run.transcript  # no fallback metadata
    assert upstream.requests[0]["messages"][0]["content"].startswith(instructions), upstream.requests[0]["messages"][0]


async def test_a_turn_over_the_websocket_transport(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    """design.md 8.9: a provider with `supports_websockets` makes Codex open a WebSocket to
    /v1/responses; the tool round runs over it."""
    script(upstream, calls("exec_command", {"cmd": "echo e2e-$((6*7))"}, "call_echo"), answers(DONE))

    flags = ("-c", "model_providers.local.supports_websockets=true")
    run = await codex.exec(proxy, "Print the marker.", tmp_path, flags=flags)

    assert run.rc == 0, run.transcript
    assert run.answer == DONE, run.transcript
    assert "e2e-42" in run.completed("command_execution")[0]["aggregated_output"], run.transcript
    async with aiohttp.ClientSession() as http, http.get(f"{proxy}/metrics") as metrics:
        text = await metrics.text()
    # One request to /v1/responses carried both turns: the WebSocket (Codex leaves without a close
    # frame, so it counts as a client gone, 499, not 101).
    served = [line for line in text.splitlines() if line.startswith('proxy_requests_total{endpoint="/v1/responses"')]
    assert len(served) == 1 and served[0].endswith(" 1.0") and len(upstream.requests) == 2, text


async def test_deferred_mcp_tools_are_found_by_codexs_tool_search(codex: Codex, upstream: FakeUpstream, proxy: str, tmp_path: Path) -> None:
    """design.md 8.17: Codex 0.171 defers its MCP tools behind its own `tool_search`
    (`execution: client`) for a model whose card supports the search (its gpt-5.x cards), where
    older Codex did past 100 MCP tools (codex-rs' DIRECT_MCP_TOOL_EXPOSURE_THRESHOLD; 0.171's
    `tool_search_always_defer_mcp_tools` is on, whatever the count): the request carries the
    search and no MCP tool. The model's search comes back as a `tool_search_call`, Codex ranks
    its deferred tools and answers with a `tool_search_output`, the proxy offers what it loaded,
    and Codex runs the MCP tool the model calls."""
    server = ToolServer(catalog=DIRECT_MCP_TOOL_EXPOSURE_THRESHOLD)  # past the old threshold too
    loaded = "mcp__archive__record_7"

    def choose(body: dict[str, Any]) -> Reply:
        said = [message for message in body["messages"] if message["role"] == "tool"]
        if not said:
            return Reply(Generation(calls("tool_search", {"query": "archive entry seven"}, "call_search")))
        if len(said) == 1:
            return Reply(Generation(calls(loaded, {"id": "A-1"}, "call_record")))
        return Reply(Generation(answers(DONE)))

    upstream.choose = choose
    await server.start()
    try:
        run = await codex.exec(
            proxy, "Read entry seven of the archive.", tmp_path, model="gpt-5.5-local",
            flags=("-c", f'mcp_servers.archive.url="{server.url}"'),
        )
    finally:
        await server.close()

    assert run.rc == 0, run.transcript
    assert run.answer == DONE, run.transcript
    assert server.calls == [("record_7", {"id": "A-1"})], run.transcript
    searching, found, answered = upstream.requests
    assert "tool_search" in chat_tools(searching) and not any(name.startswith("mcp__archive") for name in chat_tools(searching))
    assert loaded in chat_tools(found) and len([name for name in chat_tools(found) if name.startswith("mcp__archive")]) <= 8
    call, result = found["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == "tool_search" and result["role"] == "tool"
    assert loaded in result["content"], result  # the names the search made callable
    assert answered["messages"][-1] == {"role": "tool", "tool_call_id": "call_record", "content": answered["messages"][-1]["content"]}
    assert "record 7: A-1" in answered["messages"][-1]["content"]
