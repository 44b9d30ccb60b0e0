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

import msgspec
import orjson

from . import search
from .mcp import BUILTIN_FUNCTIONS, BUILTIN_KINDS, Builtin, McpTool, needs_approval, redacted
from .native import FUNCTIONS as NATIVE_FUNCTIONS
from .native import ToolSearchTool, client_runs
from .native import function_of as native_function
from .schema import CustomTool, FunctionTool, HostedTool, NamespaceTool, Tool, deferred, loaded

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
    search: bool = False  # the proxy's own search of the deferred tools (8.17)

    @property
    def runs_here(self) -> bool:
        """Whether the proxy runs its calls: an MCP server's tool, or its own search."""
        return self.server is not None or self.search


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
    """The request's tools, by chat name and by client name, offered in `batches`: its own, then
    each that a tool search loaded, after them, as that search offered them within its turn, so
    that a later turn's prompt is the one its rounds were sent (design.md 8.17); its MCP servers'
    tools, as each server listed them (`servers`, by label), among them; the deferred ones a tool
    search the proxy runs may load into it."""

    __slots__ = (
        "functions",
        "_servers",
        "_builtins",
        "_taken",
        "_by_chat_name",
        "_chat_names",
        "_server_names",
        "_deferred",
    )

    def __init__(
        self,
        batches: Iterable[list[Tool]],
        servers: Mapping[str, list[dict[str, Any]]] | None = None,
        builtins: Mapping[str, Builtin] | None = None,
    ) -> None:
        self._servers, self._builtins = servers or {}, builtins or {}
        self._taken: set[str] = set()
        self._by_chat_name: dict[str, ToolRef] = {}
        self._chat_names: dict[tuple[str | None, str], str] = {}
        self._server_names: dict[tuple[str, str], str] = {}
        self.functions: list[dict[str, Any]] = []
        self._deferred: list[_Deferred] = []
        for tools in batches:
            self._add(tools)

    def _add(self, tools: list[Tool]) -> None:
        """Offer `tools` after those offered already, each once; a deferred one waits for a
        search (design.md 8.17)."""
        members: list[tuple[str | None, FunctionTool | CustomTool, str | None]] = []
        remote: list[tuple[McpTool, dict[str, Any]]] = []
        mapped: dict[str, Builtin] = {}
        natives: dict[str, dict[str, Any]] = {}  # by kind: its function, the first tool's
        searched = False
        for tool in tools:
            self._deferred += _deferred_parts(tool, self._servers)
            if deferred(tool):  # offered once a tool search loads it (design.md 8.17)
                continue
            if isinstance(tool, NamespaceTool):
                members += [(tool.name, member, tool.description) for member in tool.tools if not deferred(member)]
            elif isinstance(tool, FunctionTool | CustomTool):
                members.append((None, tool, None))
            elif isinstance(tool, McpTool):
                remote += [(tool, listed) for listed in self._servers.get(tool.server_label, ())]
            elif (kind := client_runs(tool)) is not None:
                natives.setdefault(kind, native_function(kind, tool))
            elif isinstance(tool, ToolSearchTool):  # the server's to run: this proxy's (8.17)
                searched = True
            elif isinstance(tool, HostedTool) and BUILTIN_KINDS.get(tool.kind) in self._builtins:
                builtin = self._builtins[BUILTIN_KINDS[tool.kind]]
                mapped[builtin.kind] = builtin
        # Plain functions keep their names, so a namespaced name yields to them; one offered later
        # (a search's) yields to the names taken before it.
        taken = self._taken
        plain = {tool.name for namespace, tool, _ in members if namespace is None} - taken
        taken |= plain
        for namespace, tool, context in members:
            if (namespace, tool.name) in self._chat_names:  # named again: the first is the tool
                continue
            chat_name = tool.name if namespace is None and tool.name in plain else None
            chat_name = chat_name or _namespaced_name(namespace or "client", tool.name, taken)
            taken.add(chat_name)
            custom = isinstance(tool, CustomTool)
            self._by_chat_name[chat_name] = ToolRef(tool.name, namespace, custom)
            self._chat_names[(namespace, tool.name)] = chat_name
            self.functions.append(_chat_function(chat_name, tool, context))
        for server, listed in remote:
            if (server.server_label, listed["name"]) in self._server_names:
                continue
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
            self._offer(kind, function, ToolRef(kind, native=kind))
        if searched:
            self._offer("tool_search", self._search_function(), ToolRef("tool_search", search=True))
        for kind, builtin in mapped.items():
            ref = ToolRef(builtin.name, server=builtin.server_label, builtin=kind)
            self._offer(kind, {**BUILTIN_FUNCTIONS[kind], "name": kind}, ref, builtin.server_label)

    def _offer(self, kind: str, function: dict[str, Any], ref: ToolRef, owner: str = "client") -> None:
        """A tool named by its type (the client's own, 8.13; the proxy's search, 8.17; a built-in
        one, 14.8): its function under that name, unless taken."""
        chat_name = kind if kind not in self._taken else _namespaced_name(owner, kind, self._taken)
        self._taken.add(chat_name)
        self._by_chat_name[chat_name] = ref
        self.functions.append({"type": "function", "function": {**function, "name": chat_name}})

    def _search_function(self) -> dict[str, Any]:
        """The proxy's search as the model is offered it: what it may find, named and described
        as OpenAI shows the model what is searchable (namespaces, MCP servers, functions)."""
        base = NATIVE_FUNCTIONS["tool_search"]
        sources = dict.fromkeys(part.source for part in self._deferred)
        listed = "\n".join(f"- {source}" for source in sources)
        return {**base, "description": f"{base['description']}\nWhat it searches:\n{listed}"}

    @property
    def run_here(self) -> frozenset[str]:
        """The chat names of the tools the proxy runs."""
        return frozenset(name for name, ref in self._by_chat_name.items() if ref.runs_here)

    def search(self, query: str) -> list[dict[str, Any]]:
        """The deferred tools the proxy's search finds for `query` (design.md 8.17), best first,
        as its `tool_search_output` lists them: a namespace's members found under it, an MCP
        server as its tool (its secrets redacted, 14.2)."""
        parts = self._deferred
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for at in search.rank([part.words for part in parts], query):
            part = parts[at]
            tool = part.tool
            if isinstance(tool, NamespaceTool):
                shown = found.setdefault(
                    ("namespace", tool.name),
                    {"type": "namespace", "name": tool.name, "description": tool.description or "", "tools": []},
                )
                assert part.member is not None
                shown["tools"].append(_as_sent(part.member))
            elif isinstance(tool, McpTool):
                found.setdefault(("mcp", tool.server_label), redacted(tool))
            elif isinstance(tool, FunctionTool | CustomTool):
                found.setdefault(("tool", tool.name), _as_sent(tool))
        return list(found.values())

    def load(self, tools: list[Tool]) -> tuple[list[dict[str, Any]], str]:
        """Offer the tools a search found from the next round on: the chat functions they add,
        and what the model reads of them (design.md 8.17)."""
        before = len(self.functions)
        self._add([loaded(tool) for tool in tools])
        return self.functions[before:], self.loaded(tools)

    def loaded(self, tools: list[Tool]) -> str:
        """What the model reads of a tool search's result: the functions it can call now, by the
        names it is offered them under (design.md 8.17)."""
        names = []
        for tool in tools:
            if isinstance(tool, NamespaceTool):
                names += [self.chat_name(member.name, tool.name) for member in tool.tools]
            elif isinstance(tool, FunctionTool | CustomTool):
                names.append(self.chat_name(tool.name, None))
            elif isinstance(tool, McpTool):
                names += [name for (label, _), name in self.server_tools() if label == tool.server_label]
        return f"Tools loaded, now callable: {', '.join(names)}." if names else "No tools found."

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
        its own shape (design.md 8.13), the proxy's tool search (8.17), or a built-in type the
        operator answers (14.8)."""
        wanted = BUILTIN_KINDS.get(kind, kind)
        return next(
            (
                name
                for name, ref in self._by_chat_name.items()
                if wanted in (ref.native, ref.builtin) or (ref.search and wanted == "tool_search")
            ),
            None,
        )

    def server_tools(self) -> list[tuple[tuple[str, str], str]]:
        """Each MCP server's offered tool, `(server_label, name)`, with its chat name."""
        return list(self._server_names.items())

    def members(self, namespace: str) -> list[str]:
        """The chat names of a namespace's functions."""
        return [chat_name for (owner, _), chat_name in self._chat_names.items() if owner == namespace]

    def lookup(self, chat_name: str) -> ToolRef:
        """The client tool behind a chat name; a name the model made up stays a function."""
        return self._by_chat_name.get(chat_name) or ToolRef(chat_name)


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A deferred tool as a search finds it: the tool (a namespace, for one of its members),
    the member, what the model is told it may find (`source`), and its `words`."""

    tool: Tool
    member: FunctionTool | CustomTool | None
    source: str
    words: str


def _deferred_parts(tool: Tool, servers: Mapping[str, list[dict[str, Any]]]) -> list[_Deferred]:
    """What of a tool a search may load: a deferred function or custom tool; a namespace's
    deferred members; a deferred MCP server, whole (`servers`: what each listed). Each is found
    by its names, descriptions and parameter names."""
    if isinstance(tool, NamespaceTool):
        source = f"{tool.name}: {tool.description}" if tool.description else tool.name
        return [
            _Deferred(tool, member, source, search.words(tool.name, tool.description, *_words_of(member)))
            for member in tool.tools
            if deferred(member)
        ]
    if not deferred(tool):
        return []
    if isinstance(tool, FunctionTool | CustomTool):
        source = f"{tool.name}: {tool.description}" if tool.description else tool.name
        return [_Deferred(tool, None, source, search.words(*_words_of(tool)))]
    if isinstance(tool, McpTool):
        label, about = tool.server_label, tool.server_description
        listed = [text for entry in servers.get(label, ()) for text in _words_of(entry)]
        return [_Deferred(tool, None, f"{label}: {about}" if about else label, search.words(label, about, *listed))]
    return []


def _words_of(tool: FunctionTool | CustomTool | dict[str, Any]) -> list[str | None]:
    """A tool's name, description and parameter names (an MCP server's listed tool's too)."""
    if isinstance(tool, dict):
        name, description, parameters = tool["name"], tool.get("description"), tool.get("input_schema")
    else:
        name, description = tool.name, tool.description
        parameters = tool.parameters if isinstance(tool, FunctionTool) else None
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return [name, description, *(properties if isinstance(properties, dict) else ())]


def _as_sent(tool: FunctionTool | CustomTool) -> dict[str, Any]:
    """A client's tool as it sent it (what it left out, left out)."""
    return {key: value for key, value in msgspec.to_builtins(tool).items() if value is not None}


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
