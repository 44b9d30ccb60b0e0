"""A real loopback HTTP server that impersonates an SGLang or vLLM chat-completions upstream.

Tests script what it answers (`Generation`, `Reply`) and inspect what it received
(`requests`, `headers`) and whether the client walked away (`disconnects`, `disconnected`).
The wire shapes follow SGLang 0.5.x, vLLM and llama.cpp's llama-server as recorded (design.md 6).
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

StepKind = Literal["reasoning", "text", "tool", "scores", "finish"]
Dialect = Literal["sglang", "vllm", "llama.cpp"]

# Qwen's <|im_end|>: SGLang reports the stop token it matched.
EOS_TOKEN_ID = 151645
# What llama.cpp adds to its usage chunk and non-streaming body.
LLAMA_TIMINGS = {"cache_n": 0, "prompt_n": 7, "prompt_ms": 12.5, "predicted_n": 3, "predicted_ms": 40.1, "predicted_per_second": 74.8}
STREAM_ERROR_MESSAGE = "fake upstream: generation failed"
_CONTENT_KINDS = ("reasoning", "text", "tool")


def score(
    token: str, logprob: float | None = -0.5, *, top: int = 2, with_bytes: bool = True
) -> dict[str, Any]:
    """One chat logprob entry; its first top entry is the token itself, the others are
    distinct made-up alternatives, each less likely than the one before."""

    def entry(tok: str, lp: float | None) -> dict[str, Any]:
        e: dict[str, Any] = {"token": tok, "logprob": lp}
        if with_bytes:
            e["bytes"] = list(tok.encode())
        return e

    base = -20.0 if logprob is None else logprob
    alternatives = [entry(f"{token}#{i}", base - i) for i in range(1, top)]
    return {**entry(token, logprob), "top_logprobs": [entry(token, logprob), *alternatives][:top]}


@dataclass
class Step:
    """One upstream chunk's worth of generation."""

    kind: StepKind
    text: str = ""  # reasoning or text content; for "tool": the arguments fragment
    scores: list[dict[str, Any]] = field(default_factory=list)  # carried by this chunk
    tool_index: int = 0
    tool_id: str | None = None  # only on the first fragment of a call
    tool_name: str | None = None  # likewise
    finish_reason: str | None = None


@dataclass
class Generation:
    """A scripted generation, rendered as one upstream dialect would stream or return it."""

    steps: list[Step]
    prompt_tokens: int = 7
    completion_tokens: int | None = None  # None: the number of scores, else of content steps
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    # llama.cpp: older servers count cached prompt tokens only in `timings.cache_n`.
    cached_in_usage: bool = True
    dialect: Dialect = "sglang"
    model: str = "fake-model"
    # Fixed per generation so that rendering it twice gives the same bytes.
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def _sglang(self) -> bool:
        return self.dialect == "sglang"

    @property
    def _llama(self) -> bool:
        return self.dialect == "llama.cpp"

    def _scores(self, scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """llama.cpp puts the token's id first on every entry and alternative."""
        if not self._llama:
            return scores
        ided = [{"id": 1000 + i, **entry} for i, entry in enumerate(scores)]
        return [{**e, "top_logprobs": [{"id": 2000 + j, **t} for j, t in enumerate(e.get("top_logprobs") or [])]} for e in ided]

    def usage(self) -> dict[str, Any]:
        completion = self.completion_tokens
        if completion is None:
            completion = sum(len(s.scores) for s in self.steps) or sum(
                s.kind in _CONTENT_KINDS for s in self.steps
            )
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        cached = {"cached_tokens": self.cached_tokens}
        if self._llama:
            if self.cached_in_usage:
                usage["prompt_tokens_details"] = cached
        elif self._sglang:
            usage["prompt_tokens_details"] = cached if self.cached_tokens else None
            usage["reasoning_tokens"] = self.reasoning_tokens
        else:
            if self.cached_tokens:
                usage["prompt_tokens_details"] = cached
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage

    def _timings(self) -> dict[str, Any]:
        return {**LLAMA_TIMINGS, "cache_n": self.cached_tokens}

    def _head(self, obj: str) -> dict[str, Any]:
        head = {
            "id": self.id if self._sglang else f"chatcmpl-{self.id}",
            "object": obj,
            "created": self.created,
            "model": self.model,
        }
        return {**head, "system_fingerprint": "b11434-unknown"} if self._llama else head

    def _tool_call(self, step: Step) -> dict[str, Any]:
        if self._sglang:
            return {
                "id": step.tool_id,
                "index": step.tool_index,
                "type": "function",
                "function": {"name": step.tool_name, "arguments": step.text},
            }
        call: dict[str, Any] = {"index": step.tool_index}
        if step.tool_id is not None:
            call |= {"id": step.tool_id, "type": "function"}
        function = {"name": step.tool_name} if step.tool_name is not None else {}
        return call | {"function": function | {"arguments": step.text}}

    def _delta(self, step: Step) -> dict[str, Any]:
        if self._sglang:
            delta: dict[str, Any] = dict.fromkeys(
                ("role", "content", "reasoning_content", "tool_calls")
            )
            key = {"reasoning": "reasoning_content", "text": "content", "tool": "tool_calls"}
        else:
            delta = {}
            key = {"reasoning": "reasoning_content" if self._llama else "reasoning", "text": "content", "tool": "tool_calls"}
        if step.kind == "tool":
            delta["tool_calls"] = [self._tool_call(step)]
        elif step.kind in key:
            delta[key[step.kind]] = step.text
            if step.kind == "text" and self.dialect == "vllm":
                delta["tool_calls"] = []  # as in the recorded vLLM 0.9 stream
        return delta

    def _chunk(
        self, delta: dict[str, Any], scores: list[dict[str, Any]], finish_reason: str | None
    ) -> dict[str, Any]:
        logprobs = {"content": self._scores(scores)} if scores else None
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        if self._sglang:
            matched = EOS_TOKEN_ID if finish_reason == "stop" else None
            choice |= {"logprobs": logprobs, "finish_reason": finish_reason,
                       "matched_stop": matched}
            return {**self._head("chat.completion.chunk"), "choices": [choice], "usage": None}
        if self._llama:
            choice = {"finish_reason": finish_reason, **choice}
            if logprobs:
                choice["logprobs"] = logprobs
            return {"choices": [choice], **self._head("chat.completion.chunk")}
        # vLLM leaves out what it did not set (exclude_unset), as recorded.
        if logprobs:
            choice["logprobs"] = logprobs
        if finish_reason is not None:
            choice |= {"finish_reason": finish_reason, "stop_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def chunks(self, logprobs: bool = True, usage: bool = True) -> list[dict[str, Any]]:
        """The streamed chat.completion.chunk objects, ending with the usage chunk if `usage`."""
        role: dict[str, Any] = {"role": "assistant", "content": None if self._llama else ""}
        if self._sglang:
            role |= {"reasoning_content": None, "tool_calls": None}
        first = self._chunk(role, [], None)
        if not self._llama:
            first["choices"][0] |= {"logprobs": None, "finish_reason": None}  # vLLM sets them here
        out = [first]
        previous: Step | None = None
        for step in self.steps:
            if step.kind == "scores" and not logprobs:
                continue
            scores = step.scores if logprobs else []
            if (
                step.kind == "finish"
                and self.dialect == "vllm"
                and previous is not None
                and previous.kind in _CONTENT_KINDS
            ):
                last = out[-1]["choices"][0]
                merged = [*(last.get("logprobs") or {}).get("content", []), *scores]
                out[-1] = self._chunk(last["delta"], merged, step.finish_reason)
            else:
                delta = {} if step.kind == "finish" and self._llama else self._delta(step)
                out.append(self._chunk(delta, scores, step.finish_reason))
            previous = step
        if usage:
            tail = {**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage()}
            if self._llama:
                tail["timings"] = self._timings()
            out.append(tail)
        return out

    def completion(self, logprobs: bool = True) -> dict[str, Any]:
        """The non-streaming chat.completion equivalent of `chunks()`."""
        calls: dict[int, dict[str, Any]] = {}
        for s in self.steps:
            if s.kind != "tool":
                continue
            call = calls.setdefault(
                s.tool_index,
                {"id": None, "index": s.tool_index, "type": "function",
                 "function": {"name": None, "arguments": ""}},
            )
            call["id"] = call["id"] or s.tool_id
            call["function"]["name"] = call["function"]["name"] or s.tool_name
            call["function"]["arguments"] += s.text
        if not self._sglang:
            for call in calls.values():
                del call["index"]

        def joined(kind: str) -> str | None:
            return "".join(s.text for s in self.steps if s.kind == kind) or None

        message = {
            "role": "assistant",
            # llama.cpp: an empty string beside tool calls, not null.
            "content": joined("text") or ("" if self._llama else None),
            "reasoning" if self.dialect == "vllm" else "reasoning_content": joined("reasoning"),
            "tool_calls": list(calls.values()) or None,
        }
        scores = self._scores([sc for s in self.steps for sc in s.scores]) if logprobs else []
        finish = next((s.finish_reason for s in self.steps if s.kind == "finish"), None)
        if not self._sglang:
            message = {k: v for k, v in message.items() if v is not None}
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {"content": scores} if scores else None,
            "finish_reason": finish,
        }
        out = {**self._head("chat.completion"), "choices": [choice], "usage": self.usage()}
        if self._sglang:
            choice["matched_stop"] = EOS_TOKEN_ID if finish == "stop" else None
            out["metadata"] = None
        elif self._llama:
            out["timings"] = self._timings()
        else:
            choice["stop_reason"] = None
        return out


@dataclass
class Reply:
    """How the fake answers one chat request. Event counts (`*_after`) index the SSE events
    in the order they are sent, the mid-stream error frame included."""

    generation: Generation | None = None
    status: int = 200
    # Sent as-is, as application/json, with `status`; with no generation either: empty body.
    body: bytes | dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)  # on that plain answer
    write_size: int | None = None  # split the stream into writes of this many bytes
    coalesce: bool = False  # the whole stream in one write
    delay: float = 0.0  # before each write
    headers_delay: float = 0.0
    stall_after: int | None = None  # then hang until the client leaves (or close())
    hold: asyncio.Event | None = None  # the stream's headers sent, its events wait until it is set
    drop_after: int | None = None  # then abort the TCP connection
    error_frame_after: int | None = None  # SGLang's `data: {"error": ...}`; the rest still follows
    extra_frames: list[bytes] = field(default_factory=list)  # raw, just before [DONE]
    done: bool = True
    line_ending: str = "\n"
    reset: bool = False  # abort the TCP connection before any response headers
    # Raw SSE bytes sent instead of the generation's stream (pulled lazily, so a generator
    # shows how far the client read); `delay` applies, nothing else is added.
    frames: Iterable[bytes] | None = None
    # Non-streaming: send headers (full Content-Length) and this many bytes of the body,
    # then hang until the client leaves (`body_stall_after`) or abort (`body_drop_after`).
    body_stall_after: int | None = None
    body_drop_after: int | None = None
    # As llama.cpp does: close the connection this long after a whole stream, though the
    # answer said keep-alive (a client may have put the connection back in its pool by then).
    close_after: float | None = None


def _error_type(status: int) -> str:
    return "BadRequestError" if status < 500 else "InternalServerError"


def sglang_error(status: int, message: str, param: str | None = None) -> Reply:
    body = {"object": "error", "message": message, "type": _error_type(status),
            "param": param, "code": status}
    return Reply(status=status, body=body)


def vllm_error(status: int, message: str, param: str | None = None) -> Reply:
    body = {"error": {"message": message, "type": _error_type(status), "param": param,
                      "code": status}}
    return Reply(status=status, body=body)


class FakeUpstream:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # lower-cased names
        self.tokenized: list[dict[str, Any]] = []  # the tokenizer requests, with their path
        self.disconnects = 0
        self.disconnected = asyncio.Event()
        self.active_streams = 0
        # When set, picks the reply for each request body (instead of the scripted queue).
        self.choose: Callable[[dict[str, Any]], Reply] | None = None
        self._queue: deque[Reply] = deque()
        self._last = sglang_error(500, "fake upstream: no reply scripted")
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._spent: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()  # connections closing after a stream

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def script(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        for path in ("/v1/tokenize", "/tokenize"):  # SGLang's, vLLM's: the chat template applied
            app.router.add_post(path, self._tokenize)
        # handler_cancellation: a client that goes away cancels its handler at once,
        # which is how a stalled stream learns about it.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def close(self) -> None:
        # Releases stalled streams at once; shutdown_timeout bounds paced ones.
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _models(self, _: web.Request) -> web.Response:
        model = {"id": "fake-model", "object": "model", "owned_by": "sglang"}
        return web.json_response({"object": "list", "data": [model]})

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response()

    async def _tokenize(self, request: web.Request) -> web.Response:
        """A chat request's count: its words, and four tokens of template a message."""
        body = await request.json()
        self.tokenized.append({"path": request.path, **body})
        words = sum(len(str(message.get("content") or "").split()) for message in body["messages"])
        return web.json_response({"count": words + 4 * len(body["messages"]), "max_model_len": 32768})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if request.transport in self._spent:
            request.transport.close()
            return web.Response()  # never sent: the connection is gone
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        nulls = [k for k, v in body.items() if v is None]
        # SGLang's pydantic request model refuses null for most fields: the proxy must
        # drop null keys, so a scripted reply is not spent on such a request.
        if nulls:
            reply = sglang_error(400, f"{nulls[0]}: Input should not be None", nulls[0])
        else:
            reply = self.choose(body) if self.choose is not None else self._next_reply()
        try:
            await asyncio.sleep(reply.headers_delay)
            if reply.reset:
                request.transport.abort()
                return web.Response()  # never sent: the connection is gone
            if reply.frames is not None:
                return await self._stream(request, reply, body, False)
            if reply.body_stall_after is not None or reply.body_drop_after is not None:
                return await self._partial(request, reply, body)
            if reply.generation is None or reply.body is not None:
                raw = reply.body
                if isinstance(raw, dict):
                    raw = orjson.dumps(raw)
                return web.Response(status=reply.status, body=raw, content_type="application/json", headers=reply.headers)
            wants_logprobs = body.get("logprobs") is True
            if reply.generation.dialect == "llama.cpp" and body.get("top_logprobs", 20) == 0:
                wants_logprobs = False  # llama-server's n_probs: with 0 it keeps no scores at all
            if body.get("stream") is True:
                return await self._stream(request, reply, body, wants_logprobs)
            raw = orjson.dumps(reply.generation.completion(logprobs=wants_logprobs))
            return web.Response(status=reply.status, body=raw, content_type="application/json")
        except asyncio.CancelledError:
            if not self._closing.is_set():
                self._record_disconnect()
            raise

    def _next_reply(self) -> Reply:
        if self._queue:
            self._last = self._queue.popleft()
        return self._last

    def _record_disconnect(self) -> None:
        self.disconnects += 1
        self.disconnected.set()

    async def _stream(
        self, request: web.Request, reply: Reply, body: dict[str, Any], logprobs: bool
    ) -> web.StreamResponse:
        if reply.frames is not None:
            events: list[bytes] = []
            writes: Iterable[bytes] = reply.frames
            cut = 0
        else:
            events, writes, cut = self._render(reply, body, logprobs)
        resp = web.StreamResponse(status=reply.status)
        resp.content_type = "text/event-stream"
        resp.headers["Cache-Control"] = "no-cache"
        self.active_streams += 1
        try:
            await resp.prepare(request)
            if reply.hold is not None:
                await reply.hold.wait()
            for chunk in writes:
                await asyncio.sleep(reply.delay)
                await resp.write(chunk)
            if cut >= len(events):
                await resp.write_eof()
                if reply.close_after is not None and request.transport is not None:
                    # Done with this connection: what else comes on it is never read.
                    self._spent.add(request.transport)
                    asyncio.get_running_loop().call_later(reply.close_after, request.transport.close)
                return resp
            if cut != reply.drop_after:  # stalled: hang until the client leaves or close()
                await self._closing.wait()
            if request.transport is not None:
                request.transport.abort()  # so the client sees a broken stream, not an end
        except ConnectionError:
            # The client left between two writes; handler cancellation usually gets there first.
            self._record_disconnect()
        finally:
            self.active_streams -= 1
        return resp

    async def _partial(self, request: web.Request, reply: Reply, body: dict[str, Any]) -> web.StreamResponse:
        assert reply.generation is not None
        raw = orjson.dumps(reply.generation.completion(logprobs=body.get("logprobs") is True))
        resp = web.StreamResponse(status=reply.status)
        resp.content_type = "application/json"
        resp.content_length = len(raw)
        await resp.prepare(request)
        await resp.write(raw[: reply.body_stall_after if reply.body_drop_after is None else reply.body_drop_after])
        if reply.body_drop_after is None:
            await self._closing.wait()
        if request.transport is not None:
            request.transport.abort()
        return resp

    def _render(self, reply: Reply, body: dict[str, Any], logprobs: bool) -> tuple[list[bytes], list[bytes], int]:
        """The generation's SSE events, the writes to send and where the stream is cut."""
        assert reply.generation is not None
        nl = reply.line_ending.encode()
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        events = [b"data: " + orjson.dumps(c) + nl + nl
                  for c in reply.generation.chunks(logprobs=logprobs, usage=usage)]
        if reply.error_frame_after is not None:
            error = {"object": "error", "message": STREAM_ERROR_MESSAGE,
                     "type": "BadRequestError", "param": None, "code": 400}
            frame = b"data: " + orjson.dumps({"error": error}) + nl + nl
            events.insert(reply.error_frame_after, frame)
        events += reply.extra_frames
        if reply.done:
            events.append(b"data: [DONE]" + nl + nl)
        cut = min((n for n in (reply.stall_after, reply.drop_after) if n is not None),
                  default=len(events))
        data = b"".join(events[:cut])
        if reply.coalesce:
            writes = [data]
        elif reply.write_size:
            writes = [data[i:i + reply.write_size] for i in range(0, len(data), reply.write_size)]
        else:
            writes = events[:cut]
        return events, writes, cut
