"""A validated Responses request -> the chat request for the upstream it is routed to.

Pure: a `CreateResponse` and the route's `TranslationSettings` in, a `Call` (the chat body plus
what the answer's translation needs) out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import InvalidRequest
from .logprobs import INCLUDE_LOGPROBS, SPEC_MAX_TOP_LOGPROBS, effective_top_logprobs
from .schema import (
    ContentPart,
    CreateResponse,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputImage,
    Message,
    ReasoningConfig,
    TextConfig,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    ToolChoiceFunction,
)


@dataclass(frozen=True, slots=True)
class TranslationSettings:
    """What request translation needs to know about the upstream a call is routed to."""

    model: str
    max_top_logprobs: int = SPEC_MAX_TOP_LOGPROBS
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


def plan_call(request: CreateResponse, settings: TranslationSettings) -> Call:
    """Translate a validated request into the chat request for the route behind `settings`."""
    logprobs = INCLUDE_LOGPROBS in (request.include or ())
    if logprobs and not settings.logprobs:
        raise InvalidRequest(
            f"Model '{request.model}' is served by an upstream without logprob support.",
            param="include",
            code="unsupported_parameter",
        )
    top_logprobs = effective_top_logprobs(request.top_logprobs, settings.max_top_logprobs)
    stream = bool(request.stream)
    chat: dict[str, Any] = dict(
        model=settings.model,
        messages=_messages(request, settings.reasoning_field),
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
    chat = {**(settings.defaults or {}), **{key: value for key, value in chat.items() if value is not None}}
    return Call(chat=chat, stream=stream, logprobs=logprobs, echo=_echo(request, top_logprobs))


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters, "strict": tool.strict}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: str | ToolChoiceFunction | None) -> str | dict[str, Any] | None:
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


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
    return "".join(part.text for part in parts if not isinstance(part, InputImage))


def _chat_content(parts: str | list[ContentPart]) -> str | list[dict[str, Any]]:
    """Text-only content becomes a plain string, which every chat template accepts."""
    if isinstance(parts, str) or not any(isinstance(part, InputImage) for part in parts):
        return _part_text(parts)
    return [
        {"type": "image_url", "image_url": {"url": p.image_url, "detail": p.detail} if p.detail else {"url": p.image_url}}
        if isinstance(p, InputImage)
        else {"type": "text", "text": p.text}
        for p in parts
    ]


def _messages(request: CreateResponse, reasoning_field: str | None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    reasoning: list[str] = []

    def assistant() -> dict[str, Any]:
        """The assistant message the next assistant item joins: the last one, or a new one."""
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant"}
            messages.append(last)
        if reasoning and reasoning_field:
            last[reasoning_field] = (last.get(reasoning_field) or "") + "".join(reasoning)
        reasoning.clear()
        return last

    def add(message: dict[str, Any]) -> None:
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
