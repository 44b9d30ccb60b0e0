"""Remote MCP servers' tools, which the proxy runs itself (design.md 14): the request's parts
that name them, and the pure rules over them (which tools are offered, which need approval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import orjson


class _Item(msgspec.Struct, tag_field="type"):
    """Tagged as the request's other items and tools are (schema.py's `_Tagged`)."""


class ListedTool(msgspec.Struct, omit_defaults=True):
    """A tool as a listing shows it (the SDK's `McpListToolsTool`): offered to the model as a
    function of that name, those parameters (design.md 14.3)."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    annotations: dict[str, Any] | None = None


class McpListTools(_Item, tag="mcp_list_tools"):
    """An MCP server's tools as a response listed them: used instead of listing again (14.3)."""

    server_label: str
    tools: list[ListedTool] = []
    error: str | None = None
    id: str | None = None  # one the proxy made: `LISTING` and a voucher for its tools


# How the id of a listing the proxy made begins; the rest vouches for it (`listing_statement`).
LISTING = "mcpl_"


def listing_statement(url: str, tools: list[dict[str, Any]]) -> bytes:
    """What the id of a listing the proxy made vouches for: that the server at `url` listed these
    tools to the proxy, as a listing shows them (design.md 14.3)."""
    shown = [{key: value for key, value in entry.items() if value is not None} for entry in tools]
    return orjson.dumps([url, shown], option=orjson.OPT_SORT_KEYS)


class McpCall(_Item, tag="mcp_call"):
    id: Annotated[str, msgspec.Meta(min_length=1)]
    server_label: str
    name: str
    arguments: str = ""
    output: str | None = None
    error: Any = None
    approval_request_id: str | None = None  # the approval it ran on: not run again (14.5)


class McpApprovalRequest(_Item, tag="mcp_approval_request"):
    id: Annotated[str, msgspec.Meta(min_length=1)]
    server_label: str
    name: str
    arguments: str = ""


class McpApprovalResponse(_Item, tag="mcp_approval_response"):
    approval_request_id: Annotated[str, msgspec.Meta(min_length=1)]
    approve: bool
    reason: str | None = None


class ToolFilter(msgspec.Struct):
    """Which of an MCP server's tools: by name, and by its `readOnlyHint`; both, where both given."""

    tool_names: list[str] | None = None
    read_only: bool | None = None


class ApprovalFilter(msgspec.Struct):
    always: ToolFilter | None = None
    never: ToolFilter | None = None


class McpTool(_Item, tag="mcp"):
    """A remote MCP server's tools, run by the proxy (design.md 14)."""

    server_label: Annotated[str, msgspec.Meta(min_length=1)]
    server_url: str | None = None
    connector_id: str | None = None
    headers: dict[str, str] | None = None  # for that server alone, never kept (14.2)
    authorization: str | None = None
    allowed_tools: list[str] | ToolFilter | None = None
    require_approval: Literal["always", "never"] | ApprovalFilter | None = None  # None: always
    server_description: str | None = None
    defer_loading: bool | None = None  # its tools offered once a tool search loads it (design.md 8.17)


class ToolChoiceMcp(_Item, tag="mcp"):
    server_label: str
    name: str | None = None  # None: any of its tools


# What a request's MCP servers give its planning (design.md 14.3-14.5), read or run by the turn
# layer before it: each server's tools the model is offered, by `server_label`; the tool message
# each approval answered in the request says (its call's output, or its refusal), by the approval
# request's id; the items made meanwhile (listings, approved calls), the Response's first; and the
# built-in tool types the operator answers with a tool of one of its servers, by type (14.8).
@dataclass(frozen=True, slots=True)
class Servers:
    tools: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    answers: Mapping[str, str] = field(default_factory=dict)
    items: Sequence[dict[str, Any]] = ()
    builtins: Mapping[str, Builtin] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Builtin:
    """A built-in tool type (`web_search`, `file_search`) answered by the operator's MCP tool
    `name` of the server `server_label`, which takes the model's `query` (design.md 14.8)."""

    kind: str
    server_label: str
    name: str


# The built-in types an operator may map onto an MCP tool, by the type a request names (with the
# dated and preview names clients send), and the function the model is offered for each.
BUILTIN_KINDS = {
    "web_search": "web_search",
    "web_search_preview": "web_search",
    "web_search_2025_08_26": "web_search",
    "web_search_preview_2025_03_11": "web_search",
    "file_search": "file_search",
}
_QUERY = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
BUILTIN_FUNCTIONS = {
    "web_search": {"name": "web_search", "description": "Search the web.", "parameters": _QUERY},
    "file_search": {"name": "file_search", "description": "Search the files made available.", "parameters": _QUERY},
}


def builtin_item(kind: str, id: str, query: str | None) -> dict[str, Any]:
    """The item of a built-in tool's call as the model makes it (`query` None while it streams)."""
    if kind == "web_search":
        return {
            "id": id,
            "type": "web_search_call",
            "status": "in_progress",
            "action": {"type": "search", "query": query},
        }
    return {"id": id, "type": "file_search_call", "status": "in_progress", "queries": [] if query is None else [query]}


def query_of(arguments: str) -> str:
    """The model's `query`, from the arguments it wrote."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    query = value.get("query") if isinstance(value, dict) else value
    return query if isinstance(query, str) else arguments


def offered(tool: McpTool, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The server's tools that the request's `allowed_tools` lets the model call, each name
    once: a listing that names a tool again is read as its first entry (design.md 14.3)."""
    first: dict[str, dict[str, Any]] = {}
    for entry in listed:
        first.setdefault(entry["name"], entry)
    allowed = tool.allowed_tools
    if allowed is None:
        return list(first.values())
    if isinstance(allowed, list):
        return [entry for name, entry in first.items() if name in allowed]
    return [entry for entry in first.values() if _matches(allowed, entry)]


def needs_approval(tool: McpTool, listed: dict[str, Any]) -> bool:
    """Whether a call of this tool waits for the client's approval: OpenAI's default is that
    every call does, and under a filter every call but those its `never` matches (design.md
    14.5)."""
    policy = tool.require_approval
    if policy is None or isinstance(policy, str):
        return policy != "never"
    return policy.never is None or not _matches(policy.never, listed)


def _matches(condition: ToolFilter, listed: dict[str, Any]) -> bool:
    if condition.tool_names is not None and listed["name"] not in condition.tool_names:
        return False
    read_only = bool((listed.get("annotations") or {}).get("readOnlyHint"))
    return condition.read_only is None or condition.read_only == read_only


def redacted(tool: McpTool) -> dict[str, Any]:
    """A request's MCP tool as a response repeats it, and as it is kept: its secrets are the
    server's alone (design.md 14.2)."""
    shown: dict[str, Any] = msgspec.to_builtins(tool)
    if shown.get("headers"):
        shown["headers"] = dict.fromkeys(shown["headers"], REDACTED)
    if shown.get("authorization"):
        shown["authorization"] = REDACTED
    return shown


REDACTED = "<redacted>"


def tool_message(output: str | None, error: Any) -> str:
    """What the model reads of a call: its output, or what went wrong, or that it did not run
    (design.md 14.4)."""
    if error is None and output is None:
        return "The call was not run: the response's max_tool_calls was reached, or it was stopped."
    if error is None:
        return output or ""
    return "The tool call failed: " + orjson.dumps(error).decode()


def opening(item: dict[str, Any]) -> dict[str, Any]:
    """An item the proxy makes whole (a listing, a call it ran before the model's first round,
    what its tool search found) as its `output_item.added` shows it: not yet done (design.md
    14.3, 14.5, 8.17)."""
    if item["type"] == "mcp_list_tools":
        return {**item, "tools": []}
    if item["type"] == "tool_search_output":  # what a search found (design.md 8.17)
        return {**item, "status": "in_progress", "tools": []}
    if item["type"] == "mcp_call":
        return {**item, "status": "in_progress", "output": None, "error": None}
    return item


def progress(item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events between a whole item's `output_item.added` and `done`, each with its fields
    besides the item's id and index."""
    failed = item.get("error") is not None
    if item["type"] == "mcp_list_tools":
        return [
            ("response.mcp_list_tools.in_progress", {}),
            ("response.mcp_list_tools.failed" if failed else "response.mcp_list_tools.completed", {}),
        ]
    if item["type"] == "mcp_call":
        return [
            ("response.mcp_call_arguments.done", {"arguments": item["arguments"]}),
            ("response.mcp_call.in_progress", {}),
            ("response.mcp_call.failed" if failed else "response.mcp_call.completed", {}),
        ]
    return []


# The items of calls the proxy runs on an MCP server, made whole by `whole_call` (14.4, 14.8).
RUN_ITEMS = frozenset({"mcp_call", "web_search_call", "file_search_call"})


def whole_call(item: dict[str, Any], arguments: str) -> list[tuple[str, dict[str, Any]]]:
    """A call the proxy runs, its arguments whole: the item's fields set from them, and the
    events that say so."""
    kind = item["type"]
    if kind == "mcp_call":
        item["arguments"] = arguments
        return [("response.mcp_call_arguments.done", {"arguments": arguments}), ("response.mcp_call.in_progress", {})]
    query = query_of(arguments)
    if kind == "web_search_call":
        item["action"]["query"] = query
    else:
        item["queries"] = [query]
    return [(f"response.{kind}.searching", {})]


def finished_call(item: dict[str, Any], output: str | None, error: dict[str, Any] | None) -> tuple[str, str | None]:
    """A call the proxy ran (or, with neither output nor error, did not): its item's fields
    set; its status, and the event that says it ended (a tool search has none, 8.17)."""
    status = "failed" if error is not None else "incomplete" if output is None else "completed"
    kind = item["type"]
    if kind == "tool_search_call":  # its output is an item of its own
        return status, None
    if kind == "mcp_call":
        item.update(output=output, error=error)
        return status, "response.mcp_call.completed" if status == "completed" else "response.mcp_call.failed"
    if kind == "file_search_call":
        item["results"] = None if output is None else [{"text": output}]
    return status, f"response.{kind}.completed"
