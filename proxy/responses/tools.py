"""The client's tools as chat functions, and chat tool calls back as the client's tools
(design.md 8.3, 8.4).

A chat function name must match `^[a-zA-Z0-9_-]{1,64}$`; the Responses API also has namespaces
(a group of functions whose calls come back with `name` and `namespace` apart) and custom
tools (free-text input, often under a grammar). Plain functions keep their names; a namespace
member becomes `<namespace>__<name>`, made valid and unique, and so does an MCP server's tool,
as `<server_label>__<name>` (design.md 14.4); a custom tool becomes a function with one string
parameter, `input`. The naming depends only on the request's tools, so the
same tools give the same chat names on every turn, and a replayed call maps back to the name
the model saw.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .mcp import BUILTIN_FUNCTIONS, BUILTIN_KINDS, Builtin, McpTool, needs_approval
from .native import client_runs
from .native import function_of as native_function
from .schema import CustomTool, FunctionTool, HostedTool, NamespaceTool, Tool, deferred

_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME = 64
_HASH = 8
CUSTOM_INPUT = "input"


@dataclass(frozen=True, slots=True)
class ToolRef:
    """A tool as the client knows it."""

    name: str
    namespace: str | None = None
    custom: bool = False
    server: str | None = None  # the `server_label` of an MCP server's tool, which the proxy runs
    approval: bool = False  # whether its calls wait for the client's approval (design.md 14.5)
    builtin: str | None = None  # the built-in type its calls show as (`web_search`, 14.8)
    native: str | None = None  # the client's tool of that kind, in its own shape (`shell`, 8.13)


def _namespaced_name(namespace: str, name: str, taken: set[str]) -> str:
    base = _INVALID.sub("_", f"{namespace}__{name}")
    if len(base) <= _MAX_NAME and base not in taken:
        return base
    digest = hashlib.sha256(f"{namespace}\0{name}".encode()).hexdigest()
    for length in range(_HASH, len(digest) + 1):
        candidate = f"{base[: _MAX_NAME - length - 1]}_{digest[:length]}"
        if candidate not in taken:
            return candidate
    raise AssertionError("a sha256 digest collided")  # pragma: no cover


class ToolTable:
    """The request's tools, by chat name and by client name; its MCP servers' tools, as each
    server listed them (`servers`, by label), among them."""

    __slots__ = ("functions", "run_here", "_by_chat_name", "_chat_names", "_server_names")

    def __init__(
        self,
        tools: Iterable[Tool],
        servers: Mapping[str, list[dict[str, Any]]] | None = None,
        builtins: Mapping[str, Builtin] | None = None,
    ) -> None:
        members: list[tuple[str | None, FunctionTool | CustomTool, str | None]] = []
        remote: list[tuple[McpTool, dict[str, Any]]] = []
        mapped: dict[str, Builtin] = {}
        natives: dict[str, dict[str, Any]] = {}  # by kind: its function, the first tool's
        for tool in tools:
            if deferred(tool):  # offered once a tool search loads it (design.md 8.17)
                continue
            if isinstance(tool, NamespaceTool):
                members += [(tool.name, member, tool.description) for member in tool.tools if not deferred(member)]
            elif isinstance(tool, FunctionTool | CustomTool):
                members.append((None, tool, None))
            elif isinstance(tool, McpTool):
                remote += [(tool, listed) for listed in (servers or {}).get(tool.server_label, ())]
            elif (kind := client_runs(tool)) is not None:
                natives.setdefault(kind, native_function(kind, tool))
            elif isinstance(tool, HostedTool) and BUILTIN_KINDS.get(tool.kind) in (builtins or {}):
                builtin = (builtins or {})[BUILTIN_KINDS[tool.kind]]
                mapped[builtin.kind] = builtin
        # Plain functions keep their names, so a namespaced name yields to them.
        taken = {tool.name for namespace, tool, _ in members if namespace is None}
        self._by_chat_name: dict[str, ToolRef] = {}
        self._chat_names: dict[tuple[str | None, str], str] = {}
        self.functions: list[dict[str, Any]] = []
        for namespace, tool, context in members:
            if (namespace, tool.name) in self._chat_names:  # named again: the first is the tool
                continue
            chat_name = tool.name if namespace is None else _namespaced_name(namespace, tool.name, taken)
            taken.add(chat_name)
            custom = isinstance(tool, CustomTool)
            self._by_chat_name[chat_name] = ToolRef(tool.name, namespace, custom)
            self._chat_names[(namespace, tool.name)] = chat_name
            self.functions.append(_chat_function(chat_name, tool, context))
        self._server_names: dict[tuple[str, str], str] = {}
        for server, listed in remote:
            chat_name = _namespaced_name(server.server_label, listed["name"], taken)
            taken.add(chat_name)
            approval = needs_approval(server, listed)
            self._by_chat_name[chat_name] = ToolRef(listed["name"], server=server.server_label, approval=approval)
            self._server_names[(server.server_label, listed["name"])] = chat_name
            description = "\n\n".join(text for text in (server.server_description, listed.get("description")) if text)
            parameters = listed.get("input_schema") or {"type": "object", "properties": {}}
            function = {"name": chat_name, "description": description, "parameters": parameters}
            self.functions.append({"type": "function", "function": function})
        for kind, function in natives.items():
            chat_name = kind if kind not in taken else _namespaced_name("client", kind, taken)
            taken.add(chat_name)
            self._by_chat_name[chat_name] = ToolRef(kind, native=kind)
            self.functions.append({"type": "function", "function": {"name": chat_name, **function}})
        for kind, builtin in mapped.items():
            chat_name = kind if kind not in taken else _namespaced_name(builtin.server_label, kind, taken)
            taken.add(chat_name)
            self._by_chat_name[chat_name] = ToolRef(builtin.name, server=builtin.server_label, builtin=kind)
            self.functions.append({"type": "function", "function": {**BUILTIN_FUNCTIONS[kind], "name": chat_name}})
        self.run_here = frozenset(name for name, ref in self._by_chat_name.items() if ref.server is not None)

    def chat_name(self, name: str, namespace: str | None) -> str:
        """The chat name of a client tool; for one not offered on this turn, the name it had
        when it was offered alone."""
        found = self._chat_names.get((namespace, name))
        if found is not None:
            return found
        return name if namespace is None else _namespaced_name(namespace, name, set())

    def server_chat_name(self, server: str, name: str) -> str:
        """The chat name of an MCP server's tool; for one not offered on this turn, the name
        it had when it was offered alone."""
        return self._server_names.get((server, name)) or _namespaced_name(server, name, set())

    def typed(self, kind: str) -> str | None:
        """The chat name of a tool a request names by its type alone: one the client runs in
        its own shape (design.md 8.13), or a built-in type the operator answers (14.8)."""
        wanted = BUILTIN_KINDS.get(kind, kind)
        return next((name for name, ref in self._by_chat_name.items() if wanted in (ref.native, ref.builtin)), None)

    def server_tools(self) -> list[tuple[tuple[str, str], str]]:
        """Each MCP server's offered tool, `(server_label, name)`, with its chat name."""
        return list(self._server_names.items())

    def members(self, namespace: str) -> list[str]:
        """The chat names of a namespace's functions."""
        return [chat_name for (owner, _), chat_name in self._chat_names.items() if owner == namespace]

    def lookup(self, chat_name: str) -> ToolRef:
        """The client tool behind a chat name; a name the model made up stays a function."""
        return self._by_chat_name.get(chat_name) or ToolRef(chat_name)


def _chat_function(
    chat_name: str, tool: FunctionTool | CustomTool, namespace_description: str | None
) -> dict[str, Any]:
    description = "\n\n".join(text for text in (namespace_description, tool.description) if text)
    if isinstance(tool, CustomTool):
        description = "\n\n".join(text for text in (description, _format_text(tool.format)) if text)
        parameters: dict[str, Any] | None = {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string"}},
            "required": [CUSTOM_INPUT],
            "additionalProperties": False,
        }
        strict = None
    else:
        parameters, strict = tool.parameters, tool.strict
    function = {"name": chat_name, "description": description or None, "parameters": parameters, "strict": strict}
    return {"type": "function", "function": {key: value for key, value in function.items() if value is not None}}


def _format_text(fmt: dict[str, Any] | None) -> str:
    """A custom tool's input format in words, so that the model knows the syntax."""
    if not fmt or fmt.get("type") != "grammar":
        return f"Put the tool's input, as free text, in `{CUSTOM_INPUT}`."
    syntax = fmt.get("syntax") or "given"
    return f"`{CUSTOM_INPUT}` must follow this {syntax} grammar:\n{fmt.get('definition', '')}"


def custom_arguments(text: str) -> str:
    """A custom tool's input as the arguments of its chat function."""
    return orjson.dumps({CUSTOM_INPUT: text}).decode()


def custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments the model wrote: `{"input": ...}` as asked, a
    bare JSON string, or (a model that ignored the schema, a call cut short) the text itself."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict):
        value = value.get(CUSTOM_INPUT)
    return value if isinstance(value, str) else arguments
