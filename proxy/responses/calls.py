"""A tool call as the model generates it, for the translator: its deltas gathered until its id
and name are known, then the output item it opens (design.md 8.3, 8.4, 14.4, 14.5)."""

from __future__ import annotations

from typing import Any

import orjson

from . import native
from .events import OpenItem
from .lifecycle import IdSource
from .mcp import RUN_ITEMS, builtin_item, query_of, whole_call
from .tools import ToolRef, custom_input

_UNNAMED = ToolRef("")
_PREFIXES = {"shell": "sh", "local_shell": "lsh", "apply_patch": "apc", "tool_search": "tsc"}
NAMELESS_CALL = "the upstream sent a tool call without a name"


class ToolCall:
    """A tool call as its deltas accumulate; it becomes an item once its id and name are known."""

    __slots__ = ("call_id", "name", "ref", "arguments", "item", "delta_event")

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.name: str | None = None  # the chat function's name
        self.ref = _UNNAMED  # the client's tool behind it, once the name is known
        self.arguments: list[str] = []
        self.item: OpenItem | None = None
        self.delta_event: str | None = None  # of its arguments, where its item streams them

    def opened(self, new_id: IdSource) -> dict[str, Any]:
        """The item it opens: a function call, or a custom tool call, under the client's name
        (design.md 8.4); a call of an MCP server's tool, or its request for approval (14.4,
        14.5)."""
        ref = self.ref
        if ref.native is not None:  # its action shows once whole (design.md 8.13)
            return native.opened(ref.native, new_id(_PREFIXES[ref.native]), self.call_id or new_id("call"))
        if ref.search:  # the proxy's own, run after the round (8.17)
            return native.opened("tool_search", new_id("tsc"), self.call_id or new_id("call"), "server")
        if ref.builtin is not None:  # its query shows once whole (design.md 14.8)
            return builtin_item(ref.builtin, new_id("ws" if ref.builtin == "web_search" else "fs"), None)
        if ref.server is not None:
            kind, prefix = ("mcp_approval_request", "mcpr") if ref.approval else ("mcp_call", "mcp")
            self.delta_event = None if ref.approval else "response.mcp_call_arguments.delta"
            opened = {"id": new_id(prefix), "type": kind, "server_label": ref.server, "name": ref.name}
            return opened | ({"arguments": ""} if ref.approval else {"status": "in_progress", "arguments": ""})
        fields: dict[str, Any] = {"call_id": self.call_id or new_id("call"), "name": ref.name}
        if ref.namespace is not None:
            fields["namespace"] = ref.namespace
        if ref.custom:  # its input streams once whole (design.md 8.4)
            return {"id": new_id("ctc"), "type": "custom_tool_call", "status": "in_progress", **fields, "input": ""}
        self.delta_event = "response.function_call_arguments.delta"
        return {"id": new_id("fc"), "type": "function_call", "status": "in_progress", **fields, "arguments": ""}

    def run(self) -> dict[str, Any]:
        """What the proxy runs of a call of a tool it runs: its item's id and type, the id of the
        chat call its result answers (`chat_form`), and the MCP server's tool and arguments
        (design.md 14.4, 14.8), or its search's (8.17)."""
        assert self.item is not None and self.ref.runs_here
        arguments = "".join(self.arguments)
        if self.ref.builtin is not None or self.ref.search:
            arguments = orjson.dumps({"query": query_of(arguments)}).decode()
        return {
            "id": self.item.item["id"],
            "type": self.item.item["type"],
            "answers": self.chat_form()["id"],
            "server_label": self.ref.server,
            "name": self.ref.name,
            "arguments": arguments,
        }

    def chat_form(self) -> dict[str, Any]:
        """The call as a chat assistant message carries it; an MCP call under its item's id,
        which the tool message of its result answers (design.md 14.4); a search under its call's
        id, as its items are replayed (8.17)."""
        id = self.item.item["id"] if self.item is not None and self.ref.server else self.call_id
        return {"id": id, "type": "function", "function": {"name": self.name, "arguments": "".join(self.arguments)}}


def whole(item: OpenItem, text: str) -> list[tuple[str, dict[str, Any]]]:
    """A tool call's item whose arguments are whole (`text`): its fields set from them, and the
    events that say so, each with all its fields."""
    kind, at = item.item["type"], item.at
    if kind == "custom_tool_call":
        # The input streams as one delta once the call is whole: the model writes it inside a
        # JSON string, which only then decodes (design.md 8.4).
        text = item.item["input"] = custom_input(text)
        delta = [("response.custom_tool_call_input.delta", {**at, "delta": text})] if text else []
        return [*delta, ("response.custom_tool_call_input.done", {**at, "input": text})]
    if kind in RUN_ITEMS:
        return [(event, {**at, **fields}) for event, fields in whole_call(item.item, text)]
    if kind in native.NATIVE_ITEMS:
        return native.whole(item.item, text, at)
    item.item["arguments"] = text
    if kind == "mcp_approval_request":
        return []
    return [("response.function_call_arguments.done", {**at, "arguments": text})]


def cut_short(generating: OpenItem | ToolCall | None, limit: int | None, spent: int | None) -> bool:
    """Whether the tool call being generated was cut by the token limit, which vLLM reports as
    finished `tool_calls`: the limit reached, the call's arguments not whole JSON (a call that
    ended on the last token allowed is whole, design.md 4.8)."""
    if generating is None or limit is None or spent is None or spent < limit:
        return False
    try:
        orjson.loads("".join(generating.arguments if isinstance(generating, ToolCall) else generating.parts))
    except orjson.JSONDecodeError:
        return True
    return False


def status_at(item: OpenItem | None, cut: OpenItem | ToolCall | None, default: str) -> str:
    """An open item's status as it closes: `incomplete` for `cut`, the item generated when the
    stream stopped."""
    at_cut = item is cut or (isinstance(cut, ToolCall) and item is cut.item)
    return "incomplete" if item is not None and at_cut else default
