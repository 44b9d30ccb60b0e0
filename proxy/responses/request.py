"""The Responses request: schema, validation, and its translation into a chat request.

Pure: bytes in, a `Call` (the chat body plus what the translator needs to know) out. Every
refusal is an `InvalidRequest` naming the offending field in OpenAI's `param` style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import orjson

from ..errors import InvalidRequest
from .logprobs import INCLUDE_LOGPROBS, effective_top_logprobs

# The `include` values of the Responses spec. Only the logprobs one has an effect here; the
# others name hosted-tool outputs or encrypted reasoning, which this proxy never produces.
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


class _Item(msgspec.Struct, tag_field="type"):
    """Input items and parts: `type` selects the struct; unknown keys (ids, statuses,
    annotations of replayed output) are ignored."""


class InputText(_Item, tag="input_text"):
    text: str


class OutputText(_Item, tag="output_text"):
    text: str


class InputImage(_Item, tag="input_image"):
    image_url: str  # a URL or data URL: no file store here for `file_id`
    detail: Literal["low", "high", "auto"] | None = None


class ReasoningText(_Item, tag="reasoning_text"):
    text: str


class SummaryText(_Item, tag="summary_text"):
    text: str


ContentPart = InputText | OutputText | InputImage


class Message(_Item, tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCall(_Item, tag="function_call"):
    call_id: Annotated[str, msgspec.Meta(min_length=1)]
    name: Annotated[str, msgspec.Meta(min_length=1)]
    arguments: str


class FunctionCallOutput(_Item, tag="function_call_output"):
    call_id: Annotated[str, msgspec.Meta(min_length=1)]
    output: str | list[ContentPart]


class Reasoning(_Item, tag="reasoning"):
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None


InputItem = Message | FunctionCall | FunctionCallOutput | Reasoning


class FunctionTool(_Item, tag="function"):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Item, tag="function"):
    name: str


class TextFormatText(_Item, tag="text"):
    pass


class TextFormatJsonObject(_Item, tag="json_object"):
    pass


class TextFormatJsonSchema(_Item, tag="json_schema"):
    schema: dict[str, Any]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "response"
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct):
    format: TextFormatText | TextFormatJsonObject | TextFormatJsonSchema = msgspec.field(default_factory=TextFormatText)
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(msgspec.Struct):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


Unit = Annotated[float, msgspec.Meta(ge=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]


class CreateResponse(msgspec.Struct, forbid_unknown_fields=True):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    input: Annotated[str, msgspec.Meta(min_length=1)] | Annotated[list[InputItem], msgspec.Meta(min_length=1)]
    instructions: str | None = None
    include: list[INCLUDABLE] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0)] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Unit | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, Annotated[str, msgspec.Meta(max_length=512)]] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Accepted so that the refusal below can name them; the proxy cannot honour them.
    previous_response_id: str | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    prompt: Any = None
    conversation: Any = None


@dataclass(frozen=True, slots=True)
class Upstream:
    """What request translation needs to know about the upstream a call is routed to."""

    model: str
    max_top_logprobs: int = 20
    logprobs: bool = True
    reasoning_field: str | None = "reasoning_content"
    defaults: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One Responses call, translated: the chat body and what the response side needs."""

    chat: dict[str, Any]
    stream: bool
    logprobs: bool
    echo: dict[str, Any]


_PATH = re.compile(r"^(?P<message>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN_FIELD = re.compile(r"unknown field `(?P<field>[^`]+)`")
_MISSING_FIELD = re.compile(r"missing required field `(?P<field>[^`]+)`")
_TOOL_TYPE = re.compile(r"^tools\[\d+\]\.type$")


def load_json(body: bytes) -> Any:
    """A request body as JSON, for every endpoint that takes one."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None


def parse_request(body: bytes) -> CreateResponse:
    data = load_json(body)
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    tools = data.get("tools")
    # msgspec lets a lone tagged struct leave out its tag; a tool must name its type.
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(tool, dict) and "type" not in tool:
            raise InvalidRequest(f"Missing 'tools[{index}].type'.", param=f"tools[{index}].type")
    items = data.get("input")
    if isinstance(items, list):
        # EasyInputMessage: a `{role, content}` item may leave out its type.
        for item in items:
            if isinstance(item, dict) and "type" not in item and "role" in item:
                item["type"] = "message"
    try:
        request = msgspec.convert(data, CreateResponse)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    _refuse_unsupported(request)
    return request


def _validation_error(text: str) -> InvalidRequest:
    unknown = _UNKNOWN_FIELD.search(text)
    if unknown:
        field = unknown["field"]
        return InvalidRequest(f"Unknown parameter: '{field}'.", param=field, code="unknown_parameter")
    match = _PATH.match(text)
    message, path = match["message"], match["path"] or ""
    missing = _MISSING_FIELD.search(message)
    if missing:
        path = f"{path}.{missing['field']}" if path else missing["field"]
    if _TOOL_TYPE.match(path):
        message += "; only 'function' tools are supported (hosted tools need OpenAI's servers)"
    return InvalidRequest(f"Invalid '{path or 'body'}': {message}.", param=path or None)


def _refuse_unsupported(request: CreateResponse) -> None:
    for param, value in (
        ("previous_response_id", request.previous_response_id),
        ("background", request.background or None),
        ("max_tool_calls", request.max_tool_calls),
        ("prompt", request.prompt),
        ("conversation", request.conversation),
    ):
        if value is not None:
            raise InvalidRequest(
                f"'{param}' is not supported by this proxy: it keeps no stored responses or prompts.",
                param=param,
                code="unsupported_parameter",
            )
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceFunction) and choice.name not in {t.name for t in request.tools or ()}:
        raise InvalidRequest(
            f"tool_choice names the function '{choice.name}', which is not in 'tools'.", param="tool_choice.name"
        )


def plan_call(request: CreateResponse, upstream: Upstream) -> Call:
    """Translate a validated request into the chat request for `upstream`."""
    logprobs = INCLUDE_LOGPROBS in (request.include or ())
    if logprobs and not upstream.logprobs:
        raise InvalidRequest(
            f"Model '{request.model}' is served by an upstream without logprob support.",
            param="include",
            code="unsupported_parameter",
        )
    top_logprobs = effective_top_logprobs(request.top_logprobs, upstream.max_top_logprobs)
    stream = bool(request.stream)
    chat: dict[str, Any] = dict(
        model=upstream.model,
        messages=_messages(request, upstream.reasoning_field),
        stream=stream,
        max_completion_tokens=request.max_output_tokens,
        # Older servers only read max_tokens; newer ones prefer max_completion_tokens.
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        user=request.user,
        parallel_tool_calls=request.parallel_tool_calls,
        tools=[_chat_tool(tool) for tool in request.tools] if request.tools else None,
        tool_choice=_chat_tool_choice(request.tool_choice),
        response_format=_response_format(request.text),
        reasoning_effort=request.reasoning.effort if request.reasoning else None,
    )
    if logprobs:
        chat.update(logprobs=True, top_logprobs=top_logprobs)
    if stream:
        chat["stream_options"] = {"include_usage": True}
    # The route's defaults fill in what the request leaves out.
    chat = {**(upstream.defaults or {}), **{key: value for key, value in chat.items() if value is not None}}
    return Call(chat=chat, stream=stream, logprobs=logprobs, echo=_echo(request, top_logprobs))


def _chat_tool(tool: FunctionTool) -> dict:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters, "strict": tool.strict}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: str | ToolChoiceFunction | None) -> str | dict | None:
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _response_format(text: TextConfig | None) -> dict | None:
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
    return "".join(part.text for part in parts if not isinstance(part, InputImage))


def _chat_content(parts: str | list[ContentPart]) -> str | list[dict]:
    """Text-only content becomes a plain string, which every chat template accepts."""
    if isinstance(parts, str) or not any(isinstance(part, InputImage) for part in parts):
        return _part_text(parts)
    return [
        {"type": "image_url", "image_url": {"url": p.image_url, "detail": p.detail} if p.detail else {"url": p.image_url}}
        if isinstance(p, InputImage)
        else {"type": "text", "text": p.text}
        for p in parts
    ]


def _messages(request: CreateResponse, reasoning_field: str | None) -> list[dict]:
    messages: list[dict] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    reasoning: list[str] = []

    def assistant() -> dict:
        """The assistant message the next assistant item joins: the last one, or a new one."""
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant"}
            messages.append(last)
        if reasoning and reasoning_field:
            last[reasoning_field] = (last.get(reasoning_field) or "") + "".join(reasoning)
        reasoning.clear()
        return last

    def add(message: dict) -> None:
        """A user, system or tool message. Reasoning still pending ended the turn before it
        (a reasoning-only answer): it stays with that turn, not with a later one."""
        if reasoning and reasoning_field:
            assistant().setdefault("content", "")
        reasoning.clear()
        messages.append(message)

    for item in request.input:
        if isinstance(item, Message) and item.role == "assistant":
            target = assistant()
            target["content"] = target.get("content", "") + _part_text(item.content)
        elif isinstance(item, Message):
            # `developer` is the Responses name for what chat templates know as `system`.
            role = "system" if item.role == "developer" else item.role
            add({"role": role, "content": _chat_content(item.content)})
        elif isinstance(item, FunctionCall):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            assistant().setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutput):
            add({"role": "tool", "tool_call_id": item.call_id, "content": _part_text(item.output)})
        else:
            reasoning.extend(part.text for part in (item.content or item.summary))
    return messages


def _echo(request: CreateResponse, top_logprobs: int) -> dict[str, Any]:
    """The request's settings as every Response object repeats them, defaults filled in."""
    text = request.text or TextConfig()
    reasoning = request.reasoning or ReasoningConfig()
    return {
        "model": request.model,
        "instructions": request.instructions,
        "previous_response_id": None,
        "tools": [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters, "strict": t.strict}
            for t in request.tools or ()
        ],
        "tool_choice": msgspec.to_builtins(request.tool_choice) if request.tool_choice is not None else "auto",
        "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
        "text": msgspec.to_builtins(text),
        "reasoning": msgspec.to_builtins(reasoning, builtin_types=None),
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "top_logprobs": top_logprobs,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "truncation": request.truncation or "disabled",
        "store": False,
        "background": False,
        "service_tier": request.service_tier or "default",
        "metadata": request.metadata or {},
        "user": request.user,
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
    }
