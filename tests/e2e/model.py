"""The scripted model behind the fake upstream: a tool turn, then an answer once the chat
request carries the tool's result."""

from __future__ import annotations

import json
from typing import Any

from proxy.responses.compaction import PROMPT
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step


def calls(name: str, arguments: dict[str, Any], call_id: str, *, reasoning: str = "", text: str = "") -> list[Step]:
    """Optional reasoning, then optional text, then one tool call (its arguments in two
    fragments, as a server streams them)."""
    raw = json.dumps(arguments)
    cut = len(raw) // 2
    steps = [Step("reasoning", reasoning)] if reasoning else []
    steps += [Step("text", text)] if text else []
    return [
        *steps,
        Step("tool", raw[:cut], tool_id=call_id, tool_name=name),
        Step("tool", raw[cut:]),
        Step("finish", finish_reason="tool_calls"),
    ]


def answers(text: str) -> list[Step]:
    return [Step("text", text), Step("finish", finish_reason="stop")]


def script(upstream: FakeUpstream, first: list[Step], then: list[Step], summary: str = "") -> None:
    """`first` until a request carries a tool result, `then` after: picked from the request,
    so that a client's retry gets the same reply; `summary` to a compaction's summary call."""

    def choose(body: dict[str, Any]) -> Reply:
        if body["messages"][-1].get("content") == PROMPT:
            return Reply(Generation(answers(summary)))
        answered = any(message["role"] == "tool" for message in body["messages"])
        return Reply(Generation(then if answered else first))

    upstream.choose = choose


def chat_tools(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The chat request's functions by name."""
    return {tool["function"]["name"]: tool["function"] for tool in request.get("tools", [])}


def tool_round(upstream: FakeUpstream) -> tuple[dict[str, Any], dict[str, Any]]:
    """The requests of a tool round: two, the second ending with the assistant's call and
    the tool's result. Returns that assistant message and that tool message."""
    assert len(upstream.requests) == 2, [r["messages"][-1] for r in upstream.requests]
    first, second = (r["messages"] for r in upstream.requests)
    assert not any(m["role"] == "tool" for m in first)
    *_, assistant, result = second
    assert (assistant["role"], result["role"]) == ("assistant", "tool"), second[-2:]
    assert [call["id"] for call in assistant.get("tool_calls", [])] == [result["tool_call_id"]], assistant
    return assistant, result

