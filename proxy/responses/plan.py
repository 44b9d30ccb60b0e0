"""A validated Responses request -> the chat request for the upstream it is routed to.

Pure: a `CreateResponse` and the route's `TranslationSettings` in, a `Call` (the chat body plus
what the answer's translation needs) out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ..errors import InvalidRequest
from . import compaction
from .logprobs import INCLUDE_LOGPROBS, SPEC_MAX_TOP_LOGPROBS, effective_top_logprobs
from .mcp import BUILTIN_KINDS, McpApprovalRequest, McpApprovalResponse, McpCall, McpTool, Servers, ToolChoiceMcp
from .mcp import redacted as redacted_server
from .mcp import tool_message as mcp_tool_message
from .native import (
    NATIVE_CALLS,
    NATIVE_OUTPUTS,
    ShellTool,
    ToolChoiceApplyPatch,
    ToolChoiceShell,
    chat_call,
    chat_output,
    client_runs,
)
from .schema import (
    CHOSEN_BY_NAME,
    INCLUDE_ENCRYPTED_REASONING,
    AgentMessage,
    Compaction,
    ConfigurationUpdate,
    ContentPart,
    CreateResponse,
    CustomToolCall,
    DroppedItem,
    EncryptedContent,
    FunctionCall,
    HostedTool,
    HostedToolChoice,
    InputImage,
    InputText,
    Message,
    OutputText,
    Reasoning,
    ReasoningConfig,
    Refusal,
    TextConfig,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    Tool,
    ToolChoice,
    ToolChoiceAllowed,
    ToolChoiceCustom,
    ToolChoiceFunction,
    ToolOutput,
    ToolSearchOutput,
    offered_tools,
)
from .sealing import Sealer
from .tools import ToolTable, custom_arguments

# The efforts chat servers accept; the others map to the nearest (design.md 8.1).
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "minimal": "low", "none": "low"}
_ECHOED_TRUNCATION = ("auto", "disabled")


@dataclass(frozen=True, slots=True)
class TranslationSettings:
    """What request translation needs to know about the upstream a call is routed to."""

    model: str
    max_top_logprobs: int = SPEC_MAX_TOP_LOGPROBS
    min_top_logprobs: int = 0  # asked of the upstream, whatever the client asked (design.md 3.1)
    logprobs: bool = True
    reasoning_field: str | None = "reasoning_content"
    defaults: dict[str, Any] | None = None
    hosted_tools: Literal["drop", "reject"] = "drop"
    # The role of system and developer messages after the first non-system item.
    late_system_role: Literal["system", "user"] = "system"
    sealer: Sealer | None = None
    # The reasoning summary of a request that asks for none (design.md 8.5): clients that show
    # reasoning only from summary events (the AI SDK) then show it.
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    context_window: int | None = None  # the model's, in tokens, where the route states it


@dataclass(frozen=True, slots=True)
class Call:
    """One Responses call, translated: the chat body and what the response side needs."""

    chat: dict[str, Any]
    stream: bool
    logprobs: bool
    echo: dict[str, Any]
    tools: ToolTable = field(default_factory=lambda: ToolTable(()))
    summary: bool = False  # reasoning also goes out as summary events (design.md 8.5)
    background: bool = False  # runs without its client (design.md 10.1)
    seal: Callable[[str], str] | None = None  # reasoning items carry `encrypted_content`
    # Alternatives a score keeps, where the upstream was asked for more (design.md 3.1).
    alternatives: int | None = None
    # What the request named that the upstream is not sent: `kind:name` each, for logs and metrics.
    ignored: tuple[str, ...] = ()
    # A turn whose input and output tokens reach this many is compacted after its answer (8.10).
    compact_at: int | None = None
    # Items the turn made before the model's first round: MCP listings, approved calls (14.3, 14.5).
    prelude: tuple[dict[str, Any], ...] = ()


def plan_call(
    request: CreateResponse,
    settings: TranslationSettings,
    *,
    stored: bool = False,
    servers: Servers | None = None,
    tenant: str | None = None,
) -> Call:
    """Translate a validated request (its history expanded, design.md 9.4) into the chat request
    for the route behind `settings`; `stored` says whether the response will be kept, `servers`
    what its MCP servers listed and its approvals ran (design.md 14), `tenant` whose cache its
    prefix goes in, where the upstream keeps one per API key (11.6)."""
    servers = servers or Servers()
    include = request.include or ()
    logprobs = INCLUDE_LOGPROBS in include
    if logprobs and not settings.logprobs:
        raise InvalidRequest(
            f"Model '{request.model}' is served by an upstream without logprob support.",
            param="include",
            code="unsupported_parameter",
        )
    ignored: list[str] = []
    batches = [_client_tools(batch, settings, ignored, servers.builtins) for batch in offered_tools(request)]
    tools = [tool for batch in batches for tool in batch]
    table = ToolTable(batches, servers.tools, servers.builtins)
    top_logprobs = effective_top_logprobs(request.top_logprobs, settings.max_top_logprobs)
    stream = bool(request.stream)
    # A background run always reads the upstream as a stream: its events are what it keeps.
    streamed_upstream = stream or bool(request.background)
    reasoning, text = configured(request)
    effort = _effort(reasoning)
    summary = _summary(request, settings)
    functions, tool_choice = _offered(request.tool_choice, table, settings, ignored)
    compact_at = compaction.threshold(request, settings.context_window)
    ignored += [
        f"context_management:{entry.type}"
        for entry in request.context_management or ()
        if entry.type != "compaction" or compact_at is None
    ]
    chat: dict[str, Any] = dict(
        model=settings.model,
        messages=_Conversation(table, settings, ignored, servers.answers).messages(request),
        stream=streamed_upstream,
        max_completion_tokens=request.max_output_tokens,
        # Older servers only read max_tokens; newer ones prefer max_completion_tokens.
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        parallel_tool_calls=request.parallel_tool_calls,
        tools=functions or None,
        tool_choice=tool_choice,
        response_format=_response_format(text),
        reasoning_effort=effort,
        cache_salt=cache_salt(request.cache_salt, tenant),
    )
    asked = max(top_logprobs, settings.min_top_logprobs)
    if logprobs:
        chat.update(logprobs=True, top_logprobs=asked)
    if streamed_upstream:
        chat["stream_options"] = {"include_usage": True}
    # The route's defaults fill in what the request leaves out.
    chat = {**(settings.defaults or {}), **{key: value for key, value in chat.items() if value is not None}}
    return Call(
        chat=chat,
        stream=stream,
        logprobs=logprobs,
        echo=_echo(request, chat, tools, top_logprobs, text, effort, stored, summary),
        tools=table,
        summary=summary is not None,
        alternatives=top_logprobs if logprobs and asked > top_logprobs else None,
        background=bool(request.background),
        seal=settings.sealer.seal if settings.sealer and INCLUDE_ENCRYPTED_REASONING in include else None,
        ignored=tuple(ignored),
        compact_at=compact_at,
        prelude=tuple(servers.items),
    )


def cache_salt(asked: str | None, tenant: str | None) -> str | None:
    """The salt of the call's prefix in the upstream's cache (design.md 11.6): the client's own,
    or, for a tenant, one of its key's, which a client's own salt can split but never join to
    another key's."""
    if tenant is None:
        return asked
    return "tenant-" + hashlib.blake2b(f"{tenant}\0{asked or ''}".encode(), digest_size=16).hexdigest()


def _client_tools(
    tools: list[Tool], settings: TranslationSettings, ignored: list[str], builtins: Mapping[str, Any]
) -> list[Tool]:
    """The tools the model is offered: hosted ones are dropped or refused, by the route's
    policy (design.md 8.4), but for those the operator answers with an MCP tool (14.8)."""
    offered = []
    for index, tool in enumerate(tools):
        if isinstance(tool, HostedTool) and BUILTIN_KINDS.get(tool.kind) not in builtins:
            _drop_hosted("tool", tool.kind, f"tools[{index}].type", settings, ignored)
        elif isinstance(tool, ShellTool) and client_runs(tool) is None:  # in a hosted container (8.13)
            _drop_hosted("tool", "shell", f"tools[{index}].environment", settings, ignored)
        else:
            offered.append(tool)
    return offered


def _drop_hosted(where: str, kind: str, param: str, settings: TranslationSettings, ignored: list[str]) -> None:
    """A hosted tool named in `where` (a tool, or a tool choice), dropped and counted, or refused
    by the route's policy (design.md 8.4)."""
    if settings.hosted_tools == "reject":
        raise InvalidRequest(
            f"The hosted tool '{kind}' needs OpenAI's servers; this route refuses it. "
            "Set `hosted_tools: drop` on the upstream in the proxy's config to offer the model only the other tools.",
            param=param,
            code="unsupported_parameter",
        )
    ignored.append(f"{where}:{kind}")


def _offered(
    choice: ToolChoice | None, table: ToolTable, settings: TranslationSettings, ignored: list[str]
) -> tuple[list[dict[str, Any]], Any]:
    """The chat functions the model is offered and the chat `tool_choice`: the client's tools
    as its choice allows them (design.md 8.4). With none to offer, neither is sent: chat servers
    refuse a `tool_choice` without `tools`."""
    functions: list[dict[str, Any]] = list(table.functions)  # a search adds to the table later (8.17)
    chosen: Any = choice
    if isinstance(choice, HostedToolChoice) and (answered := table.typed(choice.kind)) is not None:
        chosen = {"type": "function", "function": {"name": answered}}
    elif isinstance(choice, HostedToolChoice):
        _drop_hosted("tool_choice", choice.kind, "tool_choice.type", settings, ignored)
        chosen = None  # the model keeps its choice
    elif isinstance(choice, ToolChoiceAllowed):
        allowed = set()
        for index, entry in enumerate(choice.tools):
            if entry["type"] in CHOSEN_BY_NAME:
                allowed.add(table.chat_name(entry["name"], entry.get("namespace")))
            elif entry["type"] == "namespace":  # all its functions
                allowed.update(table.members(entry["name"]))
            elif entry["type"] == "mcp":
                allowed.update(_server_choice(table, entry.get("server_label"), entry.get("name")))
            else:
                _drop_hosted("tool_choice", entry["type"], f"tool_choice.tools[{index}].type", settings, ignored)
        functions = [function for function in functions if function["function"]["name"] in allowed]
        chosen = choice.mode
    elif isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
        chosen = {"type": "function", "function": {"name": table.chat_name(choice.name, choice.namespace)}}
    elif isinstance(choice, ToolChoiceShell | ToolChoiceApplyPatch):
        kind = "apply_patch" if isinstance(choice, ToolChoiceApplyPatch) else "shell"
        name = table.typed(kind)
        if name is None:
            raise InvalidRequest(f"tool_choice names the tool '{kind}', which is not in 'tools'.", param="tool_choice")
        chosen = {"type": "function", "function": {"name": name}}
    elif isinstance(choice, ToolChoiceMcp):
        names = _server_choice(table, choice.server_label, choice.name)
        if not names:
            raise InvalidRequest(
                f"tool_choice names a tool of the MCP server '{choice.server_label}' that its tools do not offer.",
                param="tool_choice",
            )
        if choice.name is not None:
            chosen = {"type": "function", "function": {"name": names[0]}}
        else:  # any of that server's tools
            functions = [function for function in functions if function["function"]["name"] in names]
            chosen = "required"
    if functions:
        return functions, chosen
    if chosen == "required":
        raise InvalidRequest(
            "tool_choice requires a tool call, but no function or custom tool is left to call "
            "(hosted tools are dropped).",
            param="tool_choice",
        )
    return [], None


def _server_choice(table: ToolTable, server: Any, name: Any) -> list[str]:
    """The chat names of an MCP server's offered tools that a tool choice names: one, or all."""
    return [chat_name for (label, tool), chat_name in table.server_tools() if label == server and name in (None, tool)]


def configured(request: CreateResponse) -> tuple[ReasoningConfig | None, TextConfig | None]:
    """The reasoning and text settings this turn generates with: the request's, each replaced by
    the last `configuration_update` of its history (its chain, conversation, input) that sets it;
    an effort of null gives the request's own back (design.md 8.2)."""
    reasoning, text = request.reasoning, request.text
    for item in request.items():
        if not isinstance(item, ConfigurationUpdate):
            continue
        if item.reasoning is not None and item.reasoning.effort is not msgspec.UNSET:
            own = request.reasoning.effort if request.reasoning is not None else None
            effort = own if item.reasoning.effort is None else item.reasoning.effort
            reasoning = msgspec.structs.replace(reasoning or ReasoningConfig(), effort=effort)
        if item.text is not None:
            text = msgspec.structs.replace(text or TextConfig(), format=item.text.format)
    return reasoning, text


def _effort(reasoning: ReasoningConfig | None) -> str | None:
    if reasoning is None or reasoning.effort is None:
        return None
    return _EFFORTS.get(reasoning.effort, "high")


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    fmt = text.format if text else None
    if isinstance(fmt, TextFormatJsonSchema):
        schema = {"name": fmt.name, "schema": fmt.schema, "strict": fmt.strict, "description": fmt.description}
        return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}
    if isinstance(fmt, TextFormatJsonObject):
        return {"type": "json_object"}
    return None


def _part_text(parts: str | list[ContentPart]) -> str:
    if isinstance(parts, str):
        return parts
    return "".join(
        part.refusal if isinstance(part, Refusal) else part.text
        for part in parts
        if isinstance(part, InputText | OutputText | Refusal)  # a file was read into these (8.16)
    )


def _text_only(message: Message) -> str:
    """The text of a message that goes where chat takes text only (the merged system message, an
    assistant turn): an image there is refused, not dropped (design.md 8.2)."""
    if _images(message.content):
        raise InvalidRequest(
            f"An image in a {message.role} message cannot be sent to a chat server here: send it in a user message.",
            param="input",
            code="unsupported_parameter",
        )
    return _part_text(message.content)


def _images(parts: str | list[ContentPart]) -> list[dict[str, Any]]:
    return [_image(part) for part in parts if isinstance(part, InputImage)] if isinstance(parts, list) else []


def _image(part: InputImage) -> dict[str, Any]:
    # Chat servers know low, high and auto (SGLang refuses another): "original" is the most detail.
    detail = "high" if part.detail == "original" else part.detail
    url = {"url": part.image_url, "detail": detail} if detail else {"url": part.image_url}
    return {"type": "image_url", "image_url": url}


def _chat_content(parts: str | list[ContentPart]) -> str | list[dict[str, Any]]:
    """Text-only content becomes a plain string, which every chat template accepts."""
    if isinstance(parts, str) or not any(isinstance(part, InputImage) for part in parts):
        return _part_text(parts)
    return [_image(p) if isinstance(p, InputImage) else {"type": "text", "text": _part_text([p])} for p in parts]


class _Conversation:
    """Input items -> chat messages (design.md 8.2)."""

    def __init__(
        self, table: ToolTable, settings: TranslationSettings, ignored: list[str], answers: Mapping[str, str]
    ) -> None:
        self._table = table
        self._answers = dict(answers)  # the approvals this request gives, by approval request (14.5)
        self._settings = settings
        self._ignored = ignored
        self._messages: list[dict[str, Any]] = []
        self._system: list[str] = []  # instructions and leading system messages, merged
        self._reasoning: list[str] = []  # replayed reasoning, for the next assistant turn
        self._tool_images: list[dict[str, Any]] = []  # images in tool outputs, for after them
        self._called: set[str] = set()  # the ids of the tool calls sent so far

    def messages(self, request: CreateResponse) -> list[dict[str, Any]]:
        if request.instructions:
            self._system.append(request.instructions)
        # Item references were resolved with the history (design.md 9.4).
        for item in compaction.since_compaction(request.items(), self._settings.sealer):
            self._item(item)
        self._flush_tool_images()
        if self._system:
            self._messages.insert(0, {"role": "system", "content": "\n\n".join(self._system)})
        return self._messages

    def _item(self, item: Any) -> None:
        table = self._table
        if isinstance(item, Message) and item.role in ("system", "developer"):
            if not self._messages and not self._reasoning:
                self._system.append(_text_only(item))
            else:
                self._add({"role": self._settings.late_system_role, "content": _chat_content(item.content)})
        elif isinstance(item, Message) and item.role == "assistant":
            target = self._assistant()
            target["content"] = target.get("content", "") + _text_only(item)
        elif isinstance(item, Message):
            self._add({"role": "user", "content": _chat_content(item.content)})
        elif isinstance(item, FunctionCall):
            self._tool_call(item.call_id, table.chat_name(item.name, item.namespace), item.arguments)
        elif isinstance(item, CustomToolCall):
            self._tool_call(item.call_id, table.chat_name(item.name, item.namespace), custom_arguments(item.input))
        elif isinstance(item, ToolOutput):
            self._output(item.call_id, item.output)
        elif isinstance(item, Reasoning):
            text = self._reasoning_text(item)
            if text:
                self._reasoning.append(text)
        elif isinstance(item, Compaction):
            summary = compaction.summary_of(item.encrypted_content, self._settings.sealer)
            if summary is None:
                self._ignored.append("input:unreadable_compaction")
            else:
                self._add({"role": "user", "content": compaction.HEAD + summary})
        elif isinstance(item, AgentMessage):
            self._agent_message(item)
        elif isinstance(item, NATIVE_CALLS):
            kind, arguments = chat_call(item)
            self._tool_call(item.call_id, table.typed(kind) or kind, arguments)
        elif isinstance(item, NATIVE_OUTPUTS):
            self._output(*chat_output(item))
        elif isinstance(item, ToolSearchOutput):
            self._output(item.call_id, table.loaded(item.tools))
        elif isinstance(item, McpCall):
            self._tool_call(item.id, table.server_chat_name(item.server_label, item.name), item.arguments)
            self._add({"role": "tool", "tool_call_id": item.id, "content": mcp_tool_message(item.output, item.error)})
        elif isinstance(item, McpApprovalRequest) and item.id in self._answers:
            self._tool_call(item.id, table.server_chat_name(item.server_label, item.name), item.arguments)
        elif isinstance(item, McpApprovalResponse) and item.approval_request_id in self._answers:
            answer = self._answers.pop(item.approval_request_id)  # an answer repeated is read once
            self._add({"role": "tool", "tool_call_id": item.approval_request_id, "content": answer}, tool=True)
        elif isinstance(item, DroppedItem):
            self._ignored.append(f"input:{item.kind}")

    def _agent_message(self, item: AgentMessage) -> None:
        """Another agent's message, as the user's turn it is to this model, naming its author
        and recipient; its encrypted parts (OpenAI's) cannot be read, and are dropped and
        counted."""
        head = InputText(text=f"[message from {item.author} to {item.recipient}]\n")
        said = [InputText(text=item.content)] if isinstance(item.content, str) else item.content
        parts: list[ContentPart] = [part for part in said if not isinstance(part, EncryptedContent)]
        if len(parts) < len(said):
            self._ignored.append("input:encrypted_agent_message_content")
        if parts:
            self._add({"role": "user", "content": _chat_content([head, *parts])})

    def _reasoning_text(self, item: Reasoning) -> str:
        """Reasoning in the clear if the client sent it; else sealed by this proxy (design.md
        8.6); else its summary, which here is the same text. Once: a client that joined the
        content and the summary it was sent (the same text) sends it doubled."""
        if item.content:
            return _once("".join(part.text for part in item.content))
        if item.encrypted_content:
            opened = self._settings.sealer.open(item.encrypted_content) if self._settings.sealer else None
            if opened is not None:
                return opened
            self._ignored.append("input:unreadable_encrypted_content")
        return _once("".join(part.text for part in item.summary))

    def _tool_call(self, call_id: str, name: str, arguments: str) -> None:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        self._assistant().setdefault("tool_calls", []).append(call)
        self._called.add(call_id)

    def _output(self, call_id: str, output: str | list[ContentPart]) -> None:
        """A tool's output: the tool message of its call, or, where its call is not in the
        conversation (a compaction item stands for it, 8.8), a user message that names the call,
        since chat templates need a tool message to follow its call."""
        if call_id in self._called:
            self._add({"role": "tool", "tool_call_id": call_id, "content": _part_text(output)}, tool=True)
            self._tool_images += _images(output)
            return
        said = [InputText(text=output)] if isinstance(output, str) else output
        head = InputText(text=f"[output of the tool call {call_id}]\n")
        self._add({"role": "user", "content": _chat_content([head, *said])})

    def _assistant(self) -> dict[str, Any]:
        """The assistant message the next assistant item joins: the last one, or a new one."""
        self._flush_tool_images()
        messages = self._messages
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant"}
            messages.append(last)
        field = self._settings.reasoning_field
        if self._reasoning and field:
            last[field] = (last.get(field) or "") + "".join(self._reasoning)
        self._reasoning.clear()
        return last

    def _add(self, message: dict[str, Any], *, tool: bool = False) -> None:
        """A user, system or tool message. Reasoning still pending ended the turn before it
        (a reasoning-only answer): it stays with that turn, not with a later one."""
        if self._reasoning and self._settings.reasoning_field:
            self._assistant().setdefault("content", "")
        self._reasoning.clear()
        if not tool:
            self._flush_tool_images()
        self._messages.append(message)

    def _flush_tool_images(self) -> None:
        """Chat tool messages take text only: images a tool returned follow the tool
        messages of their turn as a user message."""
        if self._tool_images:
            self._messages.append({"role": "user", "content": self._tool_images})
            self._tool_images = []


def _once(text: str) -> str:
    """Reasoning sent back as two copies of one text (LlamaIndex joins a reasoning item's
    content and its summary, which the proxy makes the same, design.md 8.5): that text, once."""
    for joint in ("", "\n", "\n\n", " "):
        half, odd = divmod(len(text) - len(joint), 2)
        if (
            half >= 8
            and not odd
            and text[half : half + len(joint)] == joint
            and text[:half] == text[half + len(joint) :]
        ):
            return text[:half]
    return text


def _summary(request: CreateResponse, settings: TranslationSettings) -> str | None:
    """The reasoning summary that applies: the request's, else the route's default."""
    asked = request.reasoning.summary if request.reasoning is not None else None
    return asked or settings.reasoning_summary


def _echo(
    request: CreateResponse,
    chat: dict[str, Any],
    tools: list[Tool],
    top_logprobs: int,
    text_config: TextConfig | None,
    effort: str | None,
    stored: bool,
    summary: str | None,
) -> dict[str, Any]:
    """The request's settings as every Response object repeats them, as they were applied: the
    sampling ones as the chat request has them, the route's defaults included."""
    text = text_config or TextConfig()
    choice = request.tool_choice
    return {
        "model": request.model,
        "instructions": request.instructions,
        "previous_response_id": request.previous_response_id,
        "tools": [_echoed_tool(tool) for tool in tools],
        "tool_choice": _echoed_choice(choice, tools),
        "parallel_tool_calls": chat.get("parallel_tool_calls", True),
        "text": {"format": _echoed_format(text), "verbosity": None},
        "reasoning": {"effort": effort, "summary": summary},
        "temperature": chat.get("temperature", 1.0),
        "top_p": chat.get("top_p", 1.0),
        "presence_penalty": chat.get("presence_penalty", 0.0),
        "frequency_penalty": chat.get("frequency_penalty", 0.0),
        "top_logprobs": top_logprobs,
        "max_output_tokens": chat.get("max_completion_tokens", chat.get("max_tokens")),
        "max_tool_calls": request.max_tool_calls,
        "truncation": request.truncation if request.truncation in _ECHOED_TRUNCATION else "disabled",
        "store": stored,
        "background": bool(request.background),
        "service_tier": "default",
        "metadata": request.metadata or {},
        "user": request.user,
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
        "conversation": None if request.conversation_id is None else {"id": request.conversation_id},
    }


def _echoed_tool(tool: Tool) -> dict[str, Any]:
    if isinstance(tool, McpTool):
        return redacted_server(tool)
    if isinstance(tool, HostedTool):  # one the operator answers (design.md 14.8)
        return tool.sent
    return msgspec.to_builtins(tool)  # type: ignore[no-any-return]


def _echoed_choice(choice: ToolChoice | None, tools: list[Tool]) -> Any:
    answered = {BUILTIN_KINDS.get(tool.kind) for tool in tools if isinstance(tool, HostedTool)}
    if isinstance(choice, HostedToolChoice) and BUILTIN_KINDS.get(choice.kind, "") in answered:
        return {"type": choice.kind}
    if choice is None or isinstance(choice, HostedToolChoice):
        return "auto"  # a dropped hosted tool leaves the model its choice (design.md 8.4)
    if isinstance(choice, str):
        return choice
    return {key: value for key, value in msgspec.to_builtins(choice).items() if value is not None}


def _echoed_format(text: TextConfig) -> dict[str, Any]:
    echoed: dict[str, Any] = msgspec.to_builtins(text.format)
    if isinstance(text.format, TextFormatJsonSchema) and text.format.strict is None:
        echoed["strict"] = False  # Open Responses needs a bool: false is what applied
    return echoed
