"""Requests shaped as agent clients send them: Codex CLI 0.171's first turn and the turn after a
tool call (every field and item shape as Codex sends them, with short texts of our own)."""

from __future__ import annotations

from typing import Any


def function(name: str, description: str = "", **properties: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": description or f"{name} does its job",
        "strict": False,
        "parameters": {"type": "object", "properties": properties or {"x": {"type": "string"}}, "additionalProperties": False},
    }


def namespace(name: str, *members: str) -> dict[str, Any]:
    return {"type": "namespace", "name": name, "description": f"the {name} tools", "tools": [function(m) for m in members]}


def web_search() -> dict[str, Any]:
    return {"type": "web_search", "external_web_access": False}


def _message(role: str, *texts: str, id: str) -> dict[str, Any]:
    return {"type": "message", "id": id, "role": role, "content": [{"type": "input_text", "text": text} for text in texts]}


def codex_turn(turn: int, **overrides: Any) -> dict[str, Any]:
    """Codex's request body for turn 1, or for turn 2: the same history plus the model's
    reasoning, its `exec_command` call and the command's output."""
    history = [
        _message("developer", "You are Codex.", id="msg_a"),
        _message("developer", "Skills and permissions.", id="msg_b"),
        _message("user", "<environment_context>cwd: /tmp</environment_context>", id="msg_c"),
        _message("user", "list the files here", id="msg_d"),
    ]
    if turn == 2:
        history += [
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "I will run ls."}], "encrypted_content": None},
            {"type": "function_call", "status": "completed", "id": "fc_1", "name": "exec_command", "arguments": '{"cmd":"ls"}', "call_id": "call_1"},
            {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "hello.txt\n"},
        ]
    return {
        "model": "qwen",
        "stream": True,
        "input": history,
        "tools": [function("exec_command", cmd={"type": "string"}), namespace("multi_agent_v1", "spawn_agent", "wait_agent"), web_search()],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "00000000-0000-0000-0000-000000000000",
        "client_metadata": {"turn_id": "t1", "session_id": "s1", "thread_id": "th1", "x-codex-installation-id": "i1"},
        **overrides,
    }
