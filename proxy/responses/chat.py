"""What the upstream sends: chat.completion objects, chat.completion.chunk frames, errors.

Typed with msgspec so one decode validates a chunk. Unknown keys (SGLang's `matched_stop`,
vLLM's `stop_reason`...) are ignored; null and absent are the same thing everywhere. A
non-streaming completion reuses the chunk types (its `message` has the shape of a `delta`),
so both modes run through one translator.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import orjson

from ..errors import ContextLengthExceeded, ProxyError, rejected_by_upstream

_MAX_ERROR_TEXT = 1000
# How SGLang, vLLM and llama.cpp word a prompt longer than the context (design.md 6.6): "The
# input (N tokens) is longer than the model's context length", "This model's maximum context
# length is N tokens", "the request exceeds the available context size" (exceed_context_size_error).
_NO_STREAMED_TOOL_SCORES = "logprobs is not supported with tools + stream"
_CONTEXT_OVERFLOW = re.compile(r"context length|context size|context window|context_length_exceeded|exceed_context_size", re.I)


class TopLogprob(msgspec.Struct, gc=False):
    token: str
    logprob: float | None = None
    bytes: list[int] | None = None


class LogprobEntry(msgspec.Struct, gc=False):
    token: str
    logprob: float | None = None
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] | None = None


class ChoiceLogprobs(msgspec.Struct, gc=False):
    # Kept as the upstream's own bytes: most scores reach the client as they came.
    content: list[msgspec.Raw] | None = None


class FunctionDelta(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, gc=False):
    index: int | None = None
    id: str | None = None
    function: FunctionDelta | None = None


class Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class Choice(msgspec.Struct, gc=False):
    index: int = 0
    delta: Delta | None = None
    message: Delta | None = None
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class PromptTokensDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class CompletionTokensDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class Usage(msgspec.Struct, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    reasoning_tokens: int | None = None  # SGLang reports it here, not in the details


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] | None = None
    usage: Usage | None = None
    # An error frame: vLLM's and SGLang's nested `{"error": {...}}`, or SGLang's flat error
    # body `{"object": "error", ...}` sent as a frame. Read by `upstream_error`.
    error: Any = None
    object: str | None = None

    @property
    def is_error(self) -> bool:
        return self.error is not None or self.object == "error"


decode_chunk = msgspec.json.Decoder(Chunk).decode


def upstream_error(body: bytes, status: int | None = None) -> ProxyError:
    """The error an upstream reported, as an HTTP error body (with its `status`) or as a stream
    frame (whose integer `code` stands in for a status, design.md 6.6): SGLang's flat body,
    the OpenAI nested one, FastAPI's `detail`, or plain text."""
    message, param, code, kind = _error_fields(body)
    if status is None:
        status = code if isinstance(code, int) else 500
    message = message or f"the upstream reported an error ({status})"
    if 400 <= status < 500 and _CONTEXT_OVERFLOW.search(f"{message} {code} {kind}"):
        return ContextLengthExceeded(message, param=param)
    if 400 <= status < 500 and _NO_STREAMED_TOOL_SCORES in message:
        # llama.cpp (design.md 6.13): say which of the client's own choices to change.
        message = f"The upstream {message}: drop message.output_text.logprobs from include, or the tools, or stream."
        param = "include"
    return rejected_by_upstream(status, message, param)


def _error_fields(body: bytes) -> tuple[str, str | None, Any, Any]:
    """The message, param, code and type of an error body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:_MAX_ERROR_TEXT], None, None, None
    if not isinstance(data, dict):
        return body.decode(errors="replace")[:_MAX_ERROR_TEXT], None, None, None
    error = data["error"] if isinstance(data.get("error"), dict) else data
    message, param = error.get("message"), error.get("param")
    if not message and isinstance(data.get("detail"), (str, list)):  # FastAPI's own validation errors
        message = data["detail"]
    text = str(message).strip()[:_MAX_ERROR_TEXT] if message else ""
    return text, param if isinstance(param, str) else None, error.get("code"), error.get("type")
