"""What the upstream sends: chat.completion objects and chat.completion.chunk frames.

Typed with msgspec so one decode validates a chunk. Unknown keys (SGLang's `matched_stop`,
vLLM's `stop_reason`...) are ignored; null and absent are the same thing everywhere. A
non-streaming completion reuses the chunk types (its `message` has the shape of a `delta`),
so both modes run through one translator.
"""

from __future__ import annotations

import msgspec


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


class ErrorBody(msgspec.Struct, gc=False):
    message: str = "upstream error"
    code: int | str | None = None


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] | None = None
    usage: Usage | None = None
    error: ErrorBody | None = None
    # SGLang's flat error body `{"object": "error", "message", "code"}`, when it is a frame.
    object: str | None = None
    message: str | None = None
    code: int | str | None = None


decode_chunk = msgspec.json.Decoder(Chunk).decode
