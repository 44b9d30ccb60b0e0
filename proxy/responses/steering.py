"""Steering a WebSocket turn (design.md 8.14), the pure part: a `response.steer` frame's input
checked, the events that answer it, and what a response that stopped for its client still
needs before the steered input can follow it."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest
from .lifecycle import OWED
from .schema import parse_items

_PARTS = frozenset({"input_text", "input_image", "input_file"})
_MESSAGE_FIELDS = frozenset({"type", "role", "content", "id", "status"})


class SteerRefused(Exception):
    """A steer that cannot be taken or committed, with the SDK's code for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def steer_input(value: Any) -> list[dict[str, Any]]:
    """A steer's input as the user messages it adds: a string, or user messages alone, as the
    SDK's `ResponseSteerInput` allows, each read as a request's input items are."""
    if isinstance(value, str) and value:
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise SteerRefused("invalid_input", "'input' is a string, or a non-empty array of user messages.")
    messages = []
    for index, item in enumerate(value):
        content = item.get("content") if isinstance(item, dict) else None
        if (
            not isinstance(item, dict)
            or item.get("role") != "user"
            or item.get("type", "message") != "message"
            or not _MESSAGE_FIELDS.issuperset(item)
            or (isinstance(content, list) and not all(isinstance(p, dict) and p.get("type") in _PARTS for p in content))
        ):
            raise SteerRefused(
                "invalid_input",
                f"input[{index}]: steering takes user messages alone, their content text, images or files.",
            )
        messages.append({"type": "message", "role": "user", "content": content})
    try:  # each part whole, as a request's input reads it
        parse_items(messages, "input")
    except InvalidRequest as error:
        raise SteerRefused("invalid_input", error.message) from None
    return messages


def required_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stubs of what a response's client owes it (its calls' outputs, its approvals) before
    a continuation can carry steered input."""
    stubs = []
    for item in output:
        kind = item.get("type")
        if kind == "mcp_approval_request":
            stubs.append({"type": "mcp_approval_response", "approval_request_id": item["id"]})
        elif kind in OWED:
            stub = {"type": OWED[kind], "call_id": item["call_id"]}
            stubs.append(stub | {"name": item["name"]} if kind == "function_call" else stub)
    return stubs


def accepted(id: str, target: str) -> dict[str, Any]:
    return {"type": "response.steer.accepted", "steer": {"id": id, "previous_response_id": target}}


def pending(id: str, target: str, stubs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "response.steer.pending",
        "reason": "waiting_for_required_input",
        "required_input": stubs,
        "steer": {"id": id, "previous_response_id": target},
    }


def failed(refused: SteerRefused, target: str, input: Any, id: str | None = None) -> dict[str, Any]:
    """The steer returned, uncommitted, for the client to carry into a `response.create`."""
    steer: dict[str, Any] = {"input": input, "previous_response_id": target}
    if id is not None:
        steer["id"] = id
    error = {"type": "invalid_request_error", "code": refused.code, "message": refused.message}
    return {"type": "response.steer.failed", "error": error, "steer": steer}
