"""The Responses request: its schema as msgspec structs, and validation.

Pure: decoded JSON in, a `CreateResponse` out. Every refusal is an `InvalidRequest` naming the
offending field in OpenAI's `param` style (design.md 5.3).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec

from ..errors import InvalidRequest
from .mcp import McpApprovalRequest, McpApprovalResponse, McpCall, McpListTools, McpTool, ToolChoiceMcp
from .native import (
    ApplyPatchCall,
    ApplyPatchCallOutput,
    ApplyPatchTool,
    CallId,
    LocalShellCall,
    LocalShellCallOutput,
    LocalShellTool,
    ShellCall,
    ShellCallOutput,
    ShellTool,
    ToolChoiceApplyPatch,
    ToolChoiceShell,
    ToolSearchCall,
    ToolSearchTool,
)

# The `include` values of the Responses spec. The logprobs one turns scores on (design.md 3.1)
# and `reasoning.encrypted_content` seals reasoning (design.md 8.6); the others name outputs of
# hosted tools, which this proxy never produces: accepted as no-ops.
INCLUDABLE = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]
INCLUDE_ENCRYPTED_REASONING = "reasoning.encrypted_content"

# Input items that have no chat form: outputs of hosted tools and of server-side state
# (design.md 8.2). A client replays them in its history; they are dropped, not refused.
NO_CHAT_FORM = frozenset({
    "file_search_call", "web_search_call", "computer_call", "computer_call_output",
    "image_generation_call", "code_interpreter_call",
    "program", "program_output", "ghost_snapshot", "multi_agent_call", "multi_agent_call_output",
})  # fmt: skip
# Codex's other names of a `compaction` item: older, and its context compaction's.
_COMPACTION_NAMES = ("compaction_summary", "context_compaction")
# Tools the model calls and the client runs; of the others, the proxy runs `mcp` (design.md
# 14), and every other type is OpenAI's servers' (or an operator's MCP tool, 14.6).
CLIENT_TOOLS = frozenset({"function", "custom", "namespace"})
_READ_TOOLS = CLIENT_TOOLS | {"mcp", "shell", "local_shell", "apply_patch", "tool_search"}  # 8.13, 8.17
# A tool search's items: read where the client or this proxy ran it; OpenAI's own search names
# no call (`execution: server`, no `call_id`), and is dropped.
_SEARCH_ITEMS = ("tool_search_call", "tool_search_output")
# The tag that stands in for what a request names but the proxy drops (hosted tools, items
# with no chat form), so that msgspec still reports later entries at their own index.
_DROPPED = "dropped"


class _Tagged(msgspec.Struct, tag_field="type"):
    """Input items, parts, tools and formats: `type` selects the struct; unknown keys (ids,
    statuses, phases, annotations of replayed output) are ignored."""


class InputText(_Tagged, tag="input_text"):
    text: str


class OutputText(_Tagged, tag="output_text"):
    text: str


class Refusal(_Tagged, tag="refusal"):
    refusal: str


class InputImage(_Tagged, tag="input_image"):
    image_url: str  # a URL or data URL: no file store here for `file_id`
    detail: Literal["low", "high", "auto", "original"] | None = None


class InputFile(_Tagged, tag="input_file"):
    """A file in a message or a tool's output (design.md 8.16): its bytes (`file_data`, base64 or
    a data URL), a URL the proxy fetches, or a file the Files API keeps; read into text (and page
    images) before the call is planned."""

    file_data: str | None = None
    file_id: str | None = None
    file_url: str | None = None
    filename: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class ReasoningText(_Tagged, tag="reasoning_text"):
    text: str


class SummaryText(_Tagged, tag="summary_text"):
    text: str


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile

# The chat API's rule for function names, which the Responses API shares.
FunctionName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]


class Message(_Tagged, tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class _ToolCall(_Tagged):
    call_id: CallId
    name: Annotated[str, msgspec.Meta(min_length=1)]


class FunctionCall(_ToolCall, tag="function_call"):
    arguments: str
    namespace: str | None = None


class CustomToolCall(_ToolCall, tag="custom_tool_call"):
    input: str
    namespace: str | None = None


class ToolOutput(_Tagged):
    call_id: CallId
    output: str | list[ContentPart]


class FunctionCallOutput(ToolOutput, tag="function_call_output"):
    pass


class CustomToolCallOutput(ToolOutput, tag="custom_tool_call_output"):
    pass


class Reasoning(_Tagged, tag="reasoning"):
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class DroppedItem(_Tagged, tag=_DROPPED):
    kind: str  # the item's own type


class Compaction(_Tagged, tag="compaction"):
    """A conversation compacted (design.md 8.8): its summary, sealed by this proxy, or another
    server's plain text."""

    encrypted_content: str


class CompactionTrigger(_Tagged, tag="compaction_trigger"):
    """Compact the conversation before it, instead of answering it (design.md 8.8): the
    request's last input item."""


class AdditionalTools(_Tagged, tag="additional_tools"):
    """Tools made available from this point of the conversation (Codex sends them for newer
    model names): they join the request's tools (design.md 8.2)."""

    tools: list[Tool] = []


class ToolSearchOutput(_Tagged, tag="tool_search_output"):
    """What a tool search found, the client's or the proxy's (design.md 8.17): the tools it
    loads, offered from this point of the conversation on; the tool message of its call."""

    call_id: CallId
    tools: list[Tool] = []
    execution: Literal["server", "client"] = "client"


class ConfigurationReasoning(msgspec.Struct):
    # Left out: the effort goes on as it was; null: back to the request's own (design.md 8.2).
    effort: str | msgspec.UnsetType | None = msgspec.UNSET


class ConfigurationText(msgspec.Struct):
    format: TextFormat


class ConfigurationUpdate(_Tagged, tag="configuration_update"):
    """Settings for the generations after it, each until a later update replaces it: the
    reasoning effort, the text format (design.md 8.2). It adds nothing to the chat, whose
    earlier messages stay as they were sent (the upstream's prefix cache holds)."""

    reasoning: ConfigurationReasoning | None = None
    text: ConfigurationText | None = None


class EncryptedContent(_Tagged, tag="encrypted_content"):
    encrypted_content: str


class AgentMessage(_Tagged, tag="agent_message"):
    """A message between agents (Codex's multi-agent v2): another agent's words to this one,
    read as a user message naming who wrote it (design.md 8.2)."""

    author: str = ""
    recipient: str = ""
    content: str | list[InputText | InputImage | EncryptedContent] = []


class ItemReference(_Tagged, tag="item_reference"):
    """An item of a stored response, by id: resolved before planning (design.md 9.4)."""

    id: Annotated[str, msgspec.Meta(min_length=1)]


InputItem = (
    Message
    | FunctionCall
    | FunctionCallOutput
    | CustomToolCall
    | CustomToolCallOutput
    | Reasoning
    | DroppedItem
    | Compaction
    | CompactionTrigger
    | AdditionalTools
    | ToolSearchCall
    | ToolSearchOutput
    | ConfigurationUpdate
    | AgentMessage
    | McpListTools
    | McpCall
    | McpApprovalRequest
    | McpApprovalResponse
    | ShellCall
    | ShellCallOutput
    | LocalShellCall
    | LocalShellCallOutput
    | ApplyPatchCall
    | ApplyPatchCallOutput
    | ItemReference
)


ToolCall = FunctionCall | CustomToolCall | ShellCall | LocalShellCall | ApplyPatchCall | ToolSearchCall
ToolCallOutput = (
    FunctionCallOutput
    | CustomToolCallOutput
    | ShellCallOutput
    | LocalShellCallOutput
    | ApplyPatchCallOutput
    | ToolSearchOutput
)
# The calls each output answers: its own kind's, and Codex's `function_call_output` answers its
# `local_shell_call` too (design.md 8.2).
ANSWERS: dict[type[ToolCallOutput], tuple[type[ToolCall], ...]] = {
    FunctionCallOutput: (FunctionCall, LocalShellCall),
    CustomToolCallOutput: (CustomToolCall,),
    ShellCallOutput: (ShellCall,),
    LocalShellCallOutput: (LocalShellCall,),
    ApplyPatchCallOutput: (ApplyPatchCall,),
    ToolSearchOutput: (ToolSearchCall,),
}
TOOL_CALLS = (FunctionCall, CustomToolCall, ShellCall, LocalShellCall, ApplyPatchCall, ToolSearchCall)
TOOL_OUTPUTS = tuple(ANSWERS)


def answered(output: ToolCallOutput) -> str:
    """The id of the call an output answers."""
    return output.answers if isinstance(output, LocalShellCallOutput) else output.call_id


class FunctionTool(_Tagged, tag="function"):
    name: FunctionName
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None
    defer_loading: bool | None = None  # offered once a tool search loads it (design.md 8.17)


class CustomTool(_Tagged, tag="custom"):
    name: FunctionName
    description: str | None = None
    format: dict[str, Any] | None = None  # {"type": "text"} or {"type": "grammar", "syntax", "definition"}
    defer_loading: bool | None = None


class NamespaceTool(_Tagged, tag="namespace"):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    tools: list[FunctionTool | CustomTool]
    description: str | None = None


class HostedTool(_Tagged, tag=_DROPPED):
    kind: str  # the tool's own type: web_search, file_search, ...
    sent: dict[str, Any] = {}  # as the request sent it: repeated where the operator answers it (14.8)


Tool = (
    FunctionTool
    | CustomTool
    | NamespaceTool
    | McpTool
    | ShellTool
    | LocalShellTool
    | ApplyPatchTool
    | ToolSearchTool
    | HostedTool
)


def deferred(tool: Tool) -> bool:
    """Whether a tool waits for a tool search to load it (design.md 8.17): a namespace, when all
    its members do."""
    if isinstance(tool, NamespaceTool):
        return bool(tool.tools) and all(member.defer_loading for member in tool.tools)
    return bool(getattr(tool, "defer_loading", None))


def loaded(tool: Tool) -> Tool:
    """A tool as a tool search loaded it: offered, whatever its `defer_loading` said."""
    if isinstance(tool, NamespaceTool):
        return msgspec.structs.replace(tool, tools=[loaded(member) for member in tool.tools])
    return msgspec.structs.replace(tool, defer_loading=False) if deferred(tool) else tool


class ToolChoiceFunction(_Tagged, tag="function"):
    name: str
    namespace: str | None = None


class ToolChoiceCustom(_Tagged, tag="custom"):
    name: str
    namespace: str | None = None


class ToolChoiceAllowed(_Tagged, tag="allowed_tools"):
    """Only these of the request's tools may be called: each named as a tool choice is, kept as
    sent so that the response repeats it."""

    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


class HostedToolChoice(_Tagged, tag=_DROPPED):
    kind: str


ToolChoice = (
    Literal["none", "auto", "required"]
    | ToolChoiceFunction
    | ToolChoiceCustom
    | ToolChoiceAllowed
    | ToolChoiceMcp
    | ToolChoiceShell
    | ToolChoiceApplyPatch
    | HostedToolChoice
)
CHOSEN_BY_NAME = ("function", "custom")


class TextFormatText(_Tagged, tag="text"):
    pass


class TextFormatJsonObject(_Tagged, tag="json_object"):
    pass


class TextFormatJsonSchema(_Tagged, tag="json_schema"):
    schema: dict[str, Any]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "response"
    description: str | None = None
    strict: bool | None = None


TextFormat = TextFormatText | TextFormatJsonObject | TextFormatJsonSchema


class TextConfig(msgspec.Struct):
    format: TextFormat = msgspec.field(default_factory=TextFormatText)
    verbosity: str | None = None  # no chat equivalent: accepted, not sent


class ReasoningConfig(msgspec.Struct):
    effort: str | None = None  # any string: clients send efforts newer than any list (design.md 8.1)
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # summary's deprecated name

    def __post_init__(self) -> None:
        if self.summary is None:
            self.summary = self.generate_summary


class ImageOptions(msgspec.Struct):
    # `enabled` asks for compressed images, which no chat server here makes: refused (design.md 8.1).
    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class MultiAgent(msgspec.Struct):
    enabled: bool


class ConversationRef(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(min_length=1)]


class ContextManagement(msgspec.Struct):
    """An entry of `context_management`: `compaction` at a token threshold (design.md 8.10);
    another type is ignored and counted, since it cannot change this turn's tokens."""

    type: str
    compact_threshold: Annotated[int, msgspec.Meta(ge=1)] | None = None


Unit = Annotated[float, msgspec.Meta(ge=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]


# OpenAI's limits on `metadata` (responses and conversations alike): 16 pairs, keys of up to 64
# characters, values strings of up to 512; a client's record stays a bounded size (design.md 9.2).
Metadata = Annotated[
    dict[Annotated[str, msgspec.Meta(max_length=64)], Annotated[str, msgspec.Meta(max_length=512)]],
    msgspec.Meta(max_length=16),
]


def parse_metadata(value: Any) -> dict[str, str]:
    """A `metadata` object within OpenAI's limits, or a 400 naming it (null is none; `[]`, `""`
    or `false` are no object)."""
    try:
        return msgspec.convert({} if value is None else value, Metadata)
    except msgspec.ValidationError as exc:
        reason = str(exc).partition(" - at ")[0]
        raise InvalidRequest(
            f"Invalid 'metadata': {reason} (at most 16 pairs, keys up to 64 characters, string values up to 512).",
            param="metadata",
        ) from None


class CreateResponse(msgspec.Struct):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    # Left out, the conversation is the chain alone (`previous_response_id`).
    input: (
        Annotated[str, msgspec.Meta(min_length=1)] | Annotated[list[InputItem], msgspec.Meta(min_length=1)] | None
    ) = None
    instructions: str | None = None
    include: list[INCLUDABLE] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0)] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Unit | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    metadata: Metadata | None = None
    # Accepted and ignored: they cannot change the generated tokens (design.md 5.4).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # vLLM's and SGLang's: sent upstream, it keeps the call's prefix from others' caches (design.md 11.6).
    cache_salt: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    service_tier: str | None = None
    truncation: str | None = None
    client_metadata: dict[str, Any] | None = None
    # OpenAI's cache breakpoints (a content part's `prompt_cache_breakpoint` is kept with its item),
    # its access programs and its background scheduling: kept on the request, never sent upstream.
    prompt_cache_options: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    image: ImageOptions | None = None
    # Caps calls of hosted tools, which the model here never makes.
    max_tool_calls: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # Read from the store by the turn layer (design.md 9.4, 10.1).
    previous_response_id: str | None = None
    background: bool | None = None
    context_management: list[ContextManagement] | None = None
    # Its items are the history, and its input and output are added to it (design.md 9.7).
    conversation: Annotated[str, msgspec.Meta(min_length=1)] | ConversationRef | None = None
    # Accepted so that the refusals below can name them; the proxy cannot honour them.
    prompt: Any = None
    moderation: Any = None
    multi_agent: MultiAgent | None = None  # the beta's agents OpenAI's servers run

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    def items(self) -> list[InputItem]:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [Message(role="user", content=self.input)]
        return self.input or []


KNOWN_FIELDS = frozenset(CreateResponse.__struct_fields__)
_MISSING_FIELD = re.compile(r"missing required field `(?P<field>[^`]+)`")


def unknown_fields(data: dict[str, Any], reject: bool) -> list[str]:
    """The top-level fields of a request body that the schema does not know: ignored and
    returned (to be logged and counted), or, with `reject`, refused (design.md 5.4)."""
    unknown = [name for name in data if name not in KNOWN_FIELDS]
    if unknown and reject:
        raise InvalidRequest(f"Unknown parameter: '{unknown[0]}'.", param=unknown[0], code="unknown_parameter")
    return unknown


def parse_request(data: Any) -> CreateResponse:
    """A request body, decoded from JSON, as a validated request (`data` is left as it came)."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    fields = dict(data)
    tools = data.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            if isinstance(tool, dict) and "type" not in tool:  # msgspec lets a lone tagged struct leave out its tag
                raise InvalidRequest(f"Missing 'tools[{index}].type'.", param=f"tools[{index}].type")
        fields["tools"] = [_stand_in(tool, _hosted) for tool in tools]
    items = data.get("input")
    if isinstance(items, list):
        fields["input"] = _prepared(items, "input")
    if data.get("metadata") is not None:  # its message says the limits, wherever it fails them
        fields["metadata"] = parse_metadata(data["metadata"])
    if "tool_choice" in data:
        fields["tool_choice"] = _stand_in(
            data["tool_choice"],
            lambda kind: kind not in (*CHOSEN_BY_NAME, "allowed_tools", "mcp", "shell", "apply_patch"),
        )
    try:
        request = msgspec.convert(fields, CreateResponse)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    _refuse_unsupported(request)
    return request


def parse_items(items: list[Any], sent_as: str | None = None) -> list[InputItem]:
    """Input items: those a request sent in its field `sent_as` (a Conversations API request's
    `items`), each refusal naming them there, or, with no field, items kept earlier."""
    try:
        return msgspec.convert(_prepared(items, sent_as), list[InputItem])
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc), sent_as or "") from None


def _prepared(items: list[Any], sent_as: str | None) -> list[Any]:
    """Items as msgspec reads them: the two kinds that may leave out their type typed (an
    EasyInputMessage `{role, content}`, an item reference `{id}`), an item with no chat form
    replaced by its stand-in."""
    prepared = []
    for index, item in enumerate(items):
        item = typed_item(item)
        kind = item.get("type") if isinstance(item, dict) else None
        where = f"{sent_as or ''}[{index}]"
        # Kept and listed as a string, an id of another type could never be stored (design.md 8.2).
        # Kept items are not checked again: a conversation may hold one from before this rule, and
        # each of its turns would be refused for an item that turn did not send.
        if sent_as is not None and isinstance(item, dict) and not isinstance(item.get("id"), str | None):
            raise InvalidRequest("An item's 'id' is a string, or left out.", param=f"{where}.id")
        if kind in _COMPACTION_NAMES and isinstance(item.get("encrypted_content"), str):
            item = {**item, "type": "compaction"}
        elif kind == "context_compaction":  # a marker with no summary
            item = {"type": _DROPPED, "kind": kind}
        if kind in _SEARCH_ITEMS and item.get("execution") == "server" and not item.get("call_id"):
            item = {"type": _DROPPED, "kind": kind}
        elif kind in ("additional_tools", "tool_search_output") and isinstance(item.get("tools"), list):
            item = {**item, "tools": [_stand_in(tool, _hosted) for tool in item["tools"]]}
        prepared.append(_stand_in(item, NO_CHAT_FORM.__contains__))
    return prepared


def offered_tools(request: CreateResponse) -> list[list[Tool]]:
    """The request's tools in the batches they are offered in (design.md 8.17): its own and those
    its `additional_tools` items add, in that order; then each `tool_search_output`'s, loaded
    (offered whatever their `defer_loading` says), after them as its search added them. A
    deferred tool no search loaded stays in the first, for the echo, and is offered to no model
    (`tools.ToolTable`)."""
    tools = list(request.tools or ())
    found: list[list[Tool]] = []
    for item in request.items():
        if isinstance(item, AdditionalTools):
            tools += item.tools
        elif isinstance(item, ToolSearchOutput):
            found.append([loaded(tool) for tool in item.tools])
    return [tools, *found]


def _hosted(kind: str) -> bool:
    return kind not in _READ_TOOLS


def typed_item(item: Any) -> Any:
    """An input item with its type, where it may be left out (or null): the one rule for every
    reader of a request's raw input."""
    if not isinstance(item, dict) or item.get("type") is not None:
        return item
    if "role" in item:
        return {**item, "type": "message"}
    return {**item, "type": "item_reference"} if "id" in item else item


def _stand_in(entry: Any, dropped: Callable[[str], bool]) -> Any:
    """The entry, or the stand-in for it when its type is one the proxy drops."""
    kind = entry.get("type") if isinstance(entry, dict) else None
    return {"type": _DROPPED, "kind": kind, "sent": entry} if isinstance(kind, str) and dropped(kind) else entry


def _validation_error(text: str, field: str = "") -> InvalidRequest:
    """msgspec's refusal as a 400 naming the path it gives, under `field` where the value
    validated was that field's (a list of items)."""
    message, _, where = text.partition(" - at `$")
    # msgspec writes a mapping's value as `[...]`: the param names the mapping.
    path = field + where.rstrip("`").removeprefix(".").replace("[...]", "")
    missing = _MISSING_FIELD.search(message)
    if missing:
        path = f"{path}.{missing['field']}" if path else missing["field"]
    return InvalidRequest(f"Invalid '{path or 'body'}': {message}.", param=path or None)


def _refuse_unsupported(request: CreateResponse) -> None:
    if request.input is None and request.previous_response_id is None and request.conversation is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    if request.prompt is not None:
        raise InvalidRequest("'prompt' is not supported by this proxy.", param="prompt", code="unsupported_parameter")
    if request.moderation is not None:
        raise InvalidRequest(
            "'moderation' is not supported by this proxy: no moderation model runs here.",
            param="moderation",
            code="unsupported_parameter",
        )
    if request.multi_agent is not None and request.multi_agent.enabled:
        raise InvalidRequest(
            "Server-hosted multi-agent runs are not supported by this proxy.",
            param="multi_agent.enabled",
            code="unsupported_parameter",
        )
    if request.image is not None and request.image.context_compression == "enabled":
        raise InvalidRequest(
            "Image context compression is not supported by this proxy: images are sent as they are.",
            param="image.context_compression",
            code="unsupported_parameter",
        )
    if request.conversation is not None and request.previous_response_id is not None:
        raise InvalidRequest(
            "Give 'conversation' or 'previous_response_id', not both: each names the history.", param="conversation"
        )
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    _check_deferral(request)
    choice = request.tool_choice
    declared = set().union(*(_declared(tool) for batch in offered_tools(request) for tool in batch))
    if isinstance(choice, ToolChoiceFunction | ToolChoiceCustom) and (choice.namespace, choice.name) not in declared:
        raise InvalidRequest(
            f"tool_choice names the tool '{choice.name}', which is not in 'tools'.", param="tool_choice.name"
        )
    if isinstance(choice, ToolChoiceAllowed):
        for index, entry in enumerate(choice.tools):
            kind = entry.get("type")
            if not isinstance(kind, str):
                raise InvalidRequest(
                    f"Missing 'tool_choice.tools[{index}].type'.", param=f"tool_choice.tools[{index}].type"
                )
            if kind not in CHOSEN_BY_NAME and kind != "namespace":
                continue  # a hosted tool: dropped or refused by the route's policy
            wrong = (
                "name"
                if not isinstance(entry.get("name"), str)
                else "namespace"
                if not isinstance(entry.get("namespace"), str | None)
                else None
            )
            if wrong is not None:
                raise InvalidRequest(
                    f"'tool_choice.tools[{index}].{wrong}' must be a string.",
                    param=f"tool_choice.tools[{index}].{wrong}",
                )
            if kind == "namespace":
                found = entry["name"] in {namespace for namespace, _ in declared if namespace is not None}
            else:
                found = (entry.get("namespace"), entry["name"]) in declared
            if not found:
                raise InvalidRequest(
                    f"tool_choice.tools[{index}] names the tool '{entry.get('name')}', which is not in 'tools'.",
                    param=f"tool_choice.tools[{index}].name",
                )


def _check_deferral(request: CreateResponse) -> None:
    """Deferred tools and the search that loads them go together, as OpenAI has them (design.md
    8.17): deferred tools without a search, or a search the server is to run with nothing to
    search, are a 400 naming `tools`; a second search, which the model could not tell from the
    first, a 400 naming it. A client's search needs none: it holds its deferred tools (Codex)."""
    given = [(f"tools[{index}]", tool) for index, tool in enumerate(request.tools or ())]
    for at, item in enumerate(request.input if isinstance(request.input, list) else ()):
        if isinstance(item, AdditionalTools):
            given += [(f"input[{at}].tools[{index}]", tool) for index, tool in enumerate(item.tools)]
    searches = [(where, tool) for where, tool in given if isinstance(tool, ToolSearchTool)]
    if len(searches) > 1:
        raise InvalidRequest("Only one tool_search tool may be given.", param=searches[1][0])
    some_deferred = any(deferred(tool) or _defers_a_member(tool) for _, tool in given)
    if some_deferred and not searches:
        raise InvalidRequest(
            "Invalid Value: 'tools.defer_loading'. Deferred tools require tools.tool_search.", param="tools"
        )
    if any(search.execution != "client" for _, search in searches) and not some_deferred:
        raise InvalidRequest(
            "Invalid Value: 'tools.tool_search'. tools.tool_search requires at least one deferred tool.", param="tools"
        )


def _defers_a_member(tool: Tool) -> bool:
    return isinstance(tool, NamespaceTool) and any(member.defer_loading for member in tool.tools)


def _declared(tool: Tool) -> set[tuple[str | None, str]]:
    """The (namespace, name) pairs a tool declares."""
    if isinstance(tool, NamespaceTool):
        return {(tool.name, member.name) for member in tool.tools}
    return {(None, tool.name)} if isinstance(tool, FunctionTool | CustomTool) else set()
