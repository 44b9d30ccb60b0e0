"""The Responses request: its schema as msgspec structs, and validation.

Pure: decoded JSON in, a `CreateResponse` out. Every refusal is an `InvalidRequest` naming the
offending field in OpenAI's `param` style (design.md 5.3).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from ..errors import InvalidRequest

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


class _Tagged(msgspec.Struct, tag_field="type"):
    """Input items, parts, tools and formats: `type` selects the struct; unknown keys (ids,
    statuses, annotations of replayed output) are ignored."""


class InputText(_Tagged, tag="input_text"):
    text: str


class OutputText(_Tagged, tag="output_text"):
    text: str


class InputImage(_Tagged, tag="input_image"):
    image_url: str  # a URL or data URL: no file store here for `file_id`
    detail: Literal["low", "high", "auto"] | None = None


class ReasoningText(_Tagged, tag="reasoning_text"):
    text: str


class SummaryText(_Tagged, tag="summary_text"):
    text: str


ContentPart = InputText | OutputText | InputImage


class Message(_Tagged, tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCall(_Tagged, tag="function_call"):
    call_id: Annotated[str, msgspec.Meta(min_length=1)]
    name: Annotated[str, msgspec.Meta(min_length=1)]
    arguments: str


class FunctionCallOutput(_Tagged, tag="function_call_output"):
    call_id: Annotated[str, msgspec.Meta(min_length=1)]
    output: str | list[ContentPart]


class Reasoning(_Tagged, tag="reasoning"):
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None


InputItem = Message | FunctionCall | FunctionCallOutput | Reasoning


class FunctionTool(_Tagged, tag="function"):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Tagged, tag="function"):
    name: str


class TextFormatText(_Tagged, tag="text"):
    pass


class TextFormatJsonObject(_Tagged, tag="json_object"):
    pass


class TextFormatJsonSchema(_Tagged, tag="json_schema"):
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


_UNKNOWN_FIELD = re.compile(r"unknown field `(?P<field>[^`]+)`")
_MISSING_FIELD = re.compile(r"missing required field `(?P<field>[^`]+)`")
_TOOL_TYPE = re.compile(r"^tools\[\d+\]\.type$")


def parse_request(data: Any) -> CreateResponse:
    """A request body, decoded from JSON, as a validated request."""
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
    message, _, where = text.partition(" - at `$")
    path = where.rstrip("`").removeprefix(".")
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


