"""A Response's lifecycle, in one place: its statuses, the events that end it, the end of a
stream, its ids, its usage object and how a failure reads in it (design.md 4.1-4.3, 4.7, 5.1).

Everything that starts, follows or ends a Response (the translator, background runs, stored
responses) asks this module, so that a status or a terminal event is spelled once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import orjson

from ..errors import ProxyError
from .chat import Usage

RUNNING = ("queued", "in_progress")  # a background response's statuses until it ends (design.md 10.1)
# A status a Response ends in, and the event that carries it: the API has no
# `response.cancelled`, a cancelled response ends with `response.failed` (design.md 10.3).
TERMINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.failed",
}
# The finish reasons that end a Response `incomplete`, and the reason it then gives (design.md 4.3).
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
DONE = b"data: [DONE]\n\n"  # what ends every stream of events (design.md 4.1)
_TERMINAL_HEADS = tuple(f"event: {event}\n".encode() for event in sorted(set(TERMINAL_EVENTS.values())))

# What a Response's client owes each item of its that ended the Response for it: its calls'
# outputs, its approvals (the SDK's `required_input`, design.md 8.14); a Response that ended so
# finished by calling tools (12.1).
OWED = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "mcp_approval_request": "mcp_approval_response",
    "tool_search_call": "tool_search_output",
}
IdSource = Callable[[str], str]  # prefix -> a new unique id with that prefix
Clock = Callable[[], float]  # seconds since the epoch


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"


# The responses of one chain share the first characters of their ids (`resp_` and 8 random
# hex digits, the chain's first response's): a Redis Cluster store keeps a chain on one slot by
# them, so that it is read in one step (design.md 9.9).
CHAIN_TAG = len("resp_") + 8


def response_id(echo: dict[str, Any], ids: IdSource = new_id) -> str:
    """A new Response's id (of `ids`), begun as the response it continues begins, where its
    settings (`echo`) name one."""
    id, previous = ids("resp"), echo["previous_response_id"]
    if not isinstance(previous, str) or not previous.startswith("resp_") or len(previous) < CHAIN_TAG:
        return id
    return previous[:CHAIN_TAG] + id[CHAIN_TAG:]


def running(response: dict[str, Any]) -> bool:
    """Whether a background response is still running (a foreground one is kept once ended)."""
    return bool(response.get("background")) and response["status"] in RUNNING


def response_object(id: str, created_at: int, status: str, output: list[Any], echo: dict[str, Any]) -> dict[str, Any]:
    """A Response as every event and answer shows it: what it made so far, and the request's
    settings as they applied (`echo`); `usage` null until it ends (design.md 5.1)."""
    return {
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "output": output,
        "usage": None,
        **echo,
    }


def is_terminal(event: bytes) -> bool:
    """Whether an encoded event (`encoded_event`) is the one that ends its Response."""
    return event.startswith(_TERMINAL_HEADS)


def encoded_event(fields: dict[str, Any]) -> bytes:
    """An event as SSE, but for the blank line that ends it (design.md 4.1): the form an event
    log keeps it in."""
    return b"event: " + str(fields["type"]).encode() + b"\ndata: " + orjson.dumps(fields)


def usage_object(usage: Usage | None) -> dict[str, Any]:
    """A Response's `usage`: all zeros where the upstream reported none (design.md 5.1)."""
    usage = usage or Usage()
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    details = usage.completion_tokens_details
    reasoning = details.reasoning_tokens if details and details.reasoning_tokens is not None else usage.reasoning_tokens
    input_tokens, output_tokens = usage.prompt_tokens or 0, usage.completion_tokens or 0
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": input_tokens + output_tokens,
    }


def usage_sum(usage: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two calls' `usage` objects as one: a response that also made its summary (design.md 8.10)."""
    return {
        key: usage_sum(value, more[key]) if isinstance(value, dict) else value + more[key]
        for key, value in usage.items()
    }


def error_event(error: ProxyError) -> dict[str, Any]:
    """The fields of the `error` event before `response.failed`, in the SDK's flat shape
    (design.md 4.7): the precise code."""
    return {"code": error.code, "message": error.message, "param": error.param}


def response_error(error: ProxyError) -> dict[str, Any]:
    """A failed Response's `error`, whose code takes only the API's own values (design.md 5.6)."""
    return {"code": error.response_code, "message": error.message}


def failed_ending(response: dict[str, Any], error: ProxyError, first: int) -> list[tuple[int, bytes]]:
    """End a Response that stopped without its translator (its run was lost, design.md 10.4):
    its open items `incomplete`, then the events of a failure numbered from `first`, as the
    translator ends a failed stream (`error`, then `response.failed`). `response` is changed
    into the failed Response."""
    for item in response["output"]:
        if item.get("status") == "in_progress":
            item["status"] = "incomplete"
    response.update(status="failed", error=response_error(error), usage=response["usage"] or usage_object(None))
    ending = [{"type": "error", **error_event(error)}, {"type": TERMINAL_EVENTS["failed"], "response": response}]
    return [(first + i, encoded_event({**event, "sequence_number": first + i})) for i, event in enumerate(ending)]
