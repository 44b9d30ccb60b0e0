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
from .sse import SSEDecoder

_MAX_ERROR_TEXT = 1000
# llama.cpp's refusal of scores with tools on a streamed request (design.md 6.13).
_NO_STREAMED_TOOL_SCORES = "logprobs is not supported with tools + stream"
# How SGLang, vLLM and llama.cpp word a prompt longer than the context (design.md 6.6): "The
# input (N tokens) is longer than the model's context length", "This model's maximum context
# length is N tokens", "the request exceeds the available context size" (exceed_context_size_error).
_CONTEXT_OVERFLOW = re.compile(
    r"context length|context size|context window|context_length_exceeded|exceed_context_size", re.I
)


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
    # The array as the upstream's own bytes: most scores reach the client as they came.
    content: msgspec.Raw = msgspec.Raw()


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
    refusal: str | None = None
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
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    reasoning_tokens: int | None = None  # SGLang reports it here, not in the details


class Timings(msgspec.Struct, gc=False):
    cache_n: int | None = None  # prompt tokens llama.cpp found in its cache


class Chunk(msgspec.Struct, gc=False):
    choices: list[Choice] | None = None
    usage: Usage | None = None
    timings: Timings | None = None  # llama.cpp's, beside its usage
    # An error frame: vLLM's and SGLang's nested `{"error": {...}}`, or SGLang's flat error
    # body `{"object": "error", ...}` sent as a frame. Read by `upstream_error`.
    error: Any = None
    object: str | None = None
    id: str | None = None  # the upstream's completion id, which its own logs know the call by
    model: str | None = None


decode_chunk = msgspec.json.Decoder(Chunk).decode


def usage_of(chunk: Chunk) -> Usage | None:
    """The chunk's usage, its cached prompt tokens taken from llama.cpp's `timings.cache_n`
    where the usage itself has none (design.md 5.2)."""
    usage, timings = chunk.usage, chunk.timings
    if usage is None or timings is None or timings.cache_n is None:
        return usage
    details = usage.prompt_tokens_details
    if details is not None and details.cached_tokens is not None:
        return usage
    return msgspec.structs.replace(usage, prompt_tokens_details=PromptTokensDetails(cached_tokens=timings.cache_n))


class RelayedUsage:
    """The usage of a chat answer relayed as it came, read as its bytes pass (design.md 11.5):
    a stream's last chunk that carries one, or a whole body up to `limit` bytes (past it,
    none). Only a call whose usage places the next sessions is read so."""

    def __init__(self, streamed: bool, limit: int) -> None:
        self._events = SSEDecoder() if streamed else None
        self._body: list[bytes] = []
        self._left = limit
        self._usage: Usage | None = None

    def feed(self, data: bytes) -> None:
        if self._events is None:
            self._left -= len(data)
            if self._left >= 0:
                self._body.append(data)
            else:
                self._body.clear()  # past the limit: nothing to read, nothing kept
            return
        for payload in self._events.feed(data):
            if b'"usage"' in payload and b'"usage":null' not in payload:  # SGLang's every chunk has one
                self._take(payload)

    def usage(self) -> Usage | None:
        if self._events is None and self._left >= 0:
            self._take(b"".join(self._body))
        return self._usage

    def _take(self, payload: bytes) -> None:
        try:
            usage = usage_of(decode_chunk(payload))
        except msgspec.DecodeError:  # not a chat answer's: nothing learnt
            return
        if usage is not None:
            self._usage = usage


class ChunkShape:
    """The bytes around the one text of a chunk that carries nothing else (a delta's `content`
    or its reasoning) and, when scores were asked for, around its scores: learned from a chunk
    decoded in full, then recognised in the next ones, which an upstream writes byte for byte
    alike but for those two values (design.md 7.4).

    A payload that starts, continues and ends with this shape's bytes, with one JSON string
    and one JSON value in between, is that chunk with other values in their places: the string
    is checked by decoding it, the scores by the score check; anything else is not a match and
    is decoded in full.
    """

    __slots__ = ("reasoning", "_head", "_middle", "_tail")

    def __init__(self, reasoning: bool, head: bytes, middle: bytes | None, tail: bytes) -> None:
        self.reasoning = reasoning  # the text is reasoning, not output text
        self._head = head
        self._middle = middle  # between the text and the scores; None: no scores
        self._tail = tail

    @classmethod
    def learn(cls, payload: bytes, chunk: Chunk, scores_wanted: bool) -> ChunkShape | None:
        """The shape of `payload` (decoded: `chunk`), if it is one text with scores after it
        when they are wanted, without when not, each found once in its bytes (the scores'
        tokens may repeat the text)."""
        if chunk.usage is not None or chunk.error is not None or not chunk.choices or len(chunk.choices) != 1:
            return None
        choice = chunk.choices[0]
        delta = choice.delta
        if choice.index != 0 or choice.finish_reason is not None or delta is None or delta.tool_calls:
            return None
        texts = [text for text in (delta.content, delta.reasoning_content, delta.reasoning) if text]
        if len(texts) != 1:
            return None
        text = orjson.dumps(texts[0])
        scores = bytes(choice.logprobs.content) if choice.logprobs is not None and choice.logprobs.content else b""
        if bool(scores) != scores_wanted:
            return None
        at = payload.find(scores) if scores else len(payload)
        if at < 0 or (scores and payload.find(scores, at + 1) >= 0):
            return None
        start = payload.find(text, 0, at)
        if start < 0 or payload.find(text, start + 1, at) >= 0:
            return None
        end = start + len(text)
        middle = payload[end:at] if scores else None
        return cls(not delta.content, payload[:start], middle, payload[at + len(scores) if scores else end :])

    def match(self, payload: bytes) -> tuple[str, bytes] | None:
        """The text and the bytes in the scores' place (b"" when the shape has none) of a
        payload of this shape; None for any other payload. Those bytes still have to pass the
        score check to be one JSON array (`ScoreBuffer.add_exact`)."""
        start, tail = len(self._head), self._tail
        if (
            len(payload) <= start
            or payload[start] != 34
            or not payload.startswith(self._head)
            or not payload.endswith(tail)
        ):
            return None  # (34: a quote)
        end = start
        while True:  # the closing quote: one not escaped, so after an even run of backslashes
            end = payload.find(b'"', end + 1)
            if end < 0:
                return None
            before = end - 1
            while payload[before] == 92:  # backslash
                before -= 1
            if (end - before) % 2:
                break
        end += 1
        stop = len(payload) - len(tail)
        if self._middle is None:
            if end != stop:
                return None
            scores = b""
        else:
            at = end + len(self._middle)
            if at >= stop or not payload.startswith(self._middle, end):
                return None
            scores = payload[at:stop]
        try:
            text = orjson.loads(payload[start:end])
        except orjson.JSONDecodeError:
            return None
        return text, scores


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
    detail = data.get("detail")
    if not message and isinstance(detail, str):
        message = detail
    elif not message and isinstance(detail, list):  # FastAPI's own validation errors: where, and what
        message = "; ".join(
            f"{'.'.join(map(str, entry.get('loc') or ()))}: {entry.get('msg')}"
            for entry in detail
            if isinstance(entry, dict)
        )
    text = str(message).strip()[:_MAX_ERROR_TEXT] if message else ""
    return text, param if isinstance(param, str) else None, error.get("code"), error.get("type")
