"""Chat completion chunks in, Responses events out: the pure core of the proxy.

`ResponseTranslator` is a sans-I/O state machine in the manner of h11: `feed(bytes)` takes what
the upstream sent and returns the SSE bytes to write, `finish()` the end of its body, `fail(error)`
a break; it never awaits. A non-streaming completion goes through the same machine (its `message`
read as one delta), so both build the same Response. A Response may take several rounds
(design.md 2.3): a round's finish leaves it open (`round_over`) where something is due, which
`due()` says (the calls to run, the model's next round, the end, a summary) for the turn to do.

Scores (3.7): every score lands in a `ScoreBuffer` in arrival order, over every round; a delta
carries those not yet delivered, the done events the whole list, so the message closes last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from ..errors import ProxyError, UpstreamError, UpstreamProtocolError
from .calls import NAMELESS_CALL, ToolCall, cut_short, status_at, whole
from .chat import Chunk, ChunkShape, Delta, ToolCallDelta, Usage, decode_chunk, upstream_error, usage_of
from .compaction import compaction_item
from .events import Events, OpenItem, open_form, text_part
from .lifecycle import (
    INCOMPLETE_REASONS,
    TERMINAL_EVENTS,
    Clock,
    IdSource,
    error_event,
    new_id,
    response_error,
    response_id,
    response_object,
    usage_object,
    usage_sum,
)
from .logprobs import ScoreBuffer
from .mcp import finished_call, tool_message
from .plan import Call
from .schema import Tool
from .sse import DEFAULT_MAX_EVENT, SSEDecoder

# What is due after a round (design.md 2.3), as `due()` says it, for the turn to match on.


@dataclass(frozen=True, slots=True)
class RunCalls:
    """The round's calls of tools the proxy runs itself, each as it runs: its item's `id`,
    `server_label`, `name` and `arguments` (14.4); `ran` takes their outcomes."""

    calls: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class NextRound:
    """The model's next round (14.4): the messages its chat adds (the round's text and calls,
    then each call's result), the output tokens left it (None: no limit), and the functions its
    chat offers besides the rounds' before (those the round's tool search loaded, 8.17)."""

    messages: list[dict[str, Any]]
    tokens_left: int | None
    functions: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class End:
    """The Response ends (`end`): the round's model called a tool of the client's or asked for
    an approval (14.4, 14.5), its output owed to the client; or, `incomplete`, spent its output
    tokens."""

    incomplete: str | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    """The conversation, the answer whole, crossed its compaction threshold (8.10): the summary
    is due, then `end` with its item."""


Due = RunCalls | NextRound | End | Summary | None  # None: nothing, the Response ended or a round runs


class ResponseTranslator:
    def __init__(
        self,
        call: Call,
        *,
        streaming: bool = True,
        clock: Clock = time.time,
        ids: IdSource = new_id,
        request_id: str = "",
        max_event: int = DEFAULT_MAX_EVENT,
    ) -> None:
        self._call = call
        self._request_id = request_id  # named in what a client sees of an upstream failure
        self._streaming = streaming
        self._logprobs = call.logprobs
        self._clock = clock
        self._new_id = ids
        self._id = response_id(call.echo, ids)
        self._created_at = int(clock())
        self._sse = SSEDecoder(max_event)
        self._events = Events(streaming)
        self._output: list[dict[str, Any]] = []
        self._current: OpenItem | None = None  # the open reasoning, tool call or refusal item
        self._message: OpenItem | None = None
        # What the last generated token went to: an item, or a tool call still waiting for its id.
        self._generating: OpenItem | ToolCall | None = None
        self._calls: dict[int, ToolCall] = {}
        self._scores = ScoreBuffer(call.alternatives)
        self._shape: ChunkShape | None = None  # of the last chunk that held one text and nothing else
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        # The usage of the response's first upstream call: the one a new session was placed
        # for, whose cached tokens say whether its replica held its prefix (11.5).
        self.first_usage: Usage | None = None
        self._max_event = max_event
        self._spent: dict[str, Any] | None = None  # the usage of the rounds before this one
        self._limit: int | None = call.echo["max_output_tokens"]  # this round's output tokens
        # The calls the proxy runs that the model made, to run after its round, with what runs (14.4).
        self._pending: list[tuple[OpenItem, dict[str, Any]]] = []
        self._next: list[dict[str, Any]] = []  # the next round's messages, once the calls ran
        self._loaded: list[dict[str, Any]] = []  # the functions this round's searches loaded (8.17)
        self._round_text = 0  # the message's parts from before this round
        self._compaction: OpenItem | None = None  # opened as its summary is sampled (8.8)
        self.response: dict[str, Any] | None = None  # set once a terminal event is built
        self.error: ProxyError | None = None
        self.round_over = False  # its upstream call finished, another round due (design.md 2.3)
        # What the upstream said of its answer, for its span (design.md 12.1): its first round's
        # completion id and model, and each round's finish reason.
        self.answer_id: str | None = None
        self.answer_model: str | None = None
        self.finish_reasons: list[str] = []

    @property
    def done(self) -> bool:
        """Whether the upstream's part is over: the response ended, or its round did."""
        return self.response is not None or self.round_over

    @property
    def calling(self) -> bool:
        """Whether the model is amid a tool call: no boundary to stop a steered turn at (8.14)."""
        current = self._current
        return isinstance(self._generating, ToolCall) or (
            current is not None and current.item["type"] not in ("reasoning", "message")
        )

    @property
    def summary_due(self) -> bool:
        """Whether the Response waits between rounds with its answer whole (a compaction due)."""
        return self.round_over and not self._runs_tools()

    @property
    def streaming(self) -> bool:
        """Whether it makes events: a whole answer's Response alone is not streamed."""
        return self._streaming

    @property
    def output(self) -> list[dict[str, Any]]:
        """The output items as they stand: between rounds, the message open across them holds
        its text and scores so far."""
        return [self._as_it_stands(item) for item in self._output]

    @property
    def generating(self) -> bool:
        """Whether a generated token has been translated yet."""
        return self._generating is not None

    def flushed(self) -> list[tuple[int, bytes]]:
        return self._events.flushed()  # the last output's, as an event log keeps them (10.2)

    def progress(self) -> dict[str, Any]:
        """The response as it stands, its open items with what they hold so far: what a
        background response shows while it runs (design.md 10.2)."""
        response = self._snapshot("in_progress" if self._events.sequence else "queued")
        response["output"] = self.output
        return response

    # -- the driving interface -------------------------------------------------------------

    def start(self) -> bytes:
        snapshot = self._snapshot("in_progress")
        # A background response is queued until the upstream answers (design.md 10.1).
        self._events.emit(
            "response.created", response={**snapshot, "status": "queued"} if self._call.background else snapshot
        )
        self._events.emit("response.in_progress", response=snapshot)
        self._add_prelude()
        return self._flush()

    def _add_prelude(self) -> None:
        """What the turn did before the model's first round (design.md 14.3, 14.5), once."""
        if not self._output:
            for item in self._call.prelude:
                self._add_whole(item)

    def feed(self, data: bytes) -> bytes:
        if self.response is not None:
            return b""
        self._read(self._sse.feed(data))
        return self._flush()

    def finish(self) -> bytes:
        """The upstream body ended (with or without `[DONE]`): an event cut short of its blank
        line is read too."""
        if not self.done:
            self._read(self._sse.close())
            self._end()
        return self._flush()

    def _read(self, payloads: list[bytes]) -> None:
        try:
            for payload in payloads:
                self._payload(payload)
                if self.response is not None:
                    return
            if self._sse.failure is not None:
                raise self._sse.failure
        except UpstreamProtocolError as error:
            # After the finish only usage and `[DONE]` come: one unreadable is usage lost, as a
            # break loses it (design.md 4.9).
            if self._finish_reason is None:
                self._fail(error)
            else:
                self._end()
        except ProxyError as error:
            self._fail(error)

    def fail(self, error: ProxyError) -> bytes:
        """The upstream broke off. A generation that already finished still completes: only
        the usage chunk or `[DONE]` was lost; between rounds, a whole answer completes (its
        compaction left out, 8.10), and one that never came fails (14.4)."""
        if self.summary_due:
            return self.end()
        if self.round_over or self._finish_reason is None:
            self.round_over = False
            self._fail(error)
        elif not self.done:
            self._end()  # a frame cut short by the break is left unread: usage or [DONE]
        return self._flush()

    def cancel(self, steered: bool = False) -> bytes:
        """The client cancelled a background response (design.md 10.3): what was open closes
        `incomplete`, and the response ends `cancelled`, with no error; or it steered a WebSocket
        turn (8.14): `incomplete`, for `steered`. Between rounds, a whole answer completes."""
        if self.summary_due:
            return self.end()
        self.round_over = False
        if not self.done:
            self._close_all(None, "incomplete")
            self._terminate(
                "incomplete" if steered else "cancelled", incomplete_details={"reason": "steered"} if steered else None
            )
        return self._flush()

    def complete(self, body: bytes) -> dict[str, Any] | None:
        """A whole non-streaming chat completion, read as one chunk whose `message` is the
        delta, then the end of input: the Response, for orjson to encode (its scores are
        pre-encoded `orjson.Fragment`s), or None when another round is due. An upstream failure
        raises."""
        self._add_prelude()
        try:
            self._payload(body)
        except ProxyError as error:
            self._fail(error)
        self._end()
        if self.error is not None:
            raise self.error
        return self.response

    # -- chunk handling --------------------------------------------------------------------

    def _payload(self, payload: bytes) -> None:
        shape = self._shape
        if shape is not None:
            found = shape.match(payload)
            if found is not None and (not found[1] or self._scores.add_exact(found[1])):
                text = found[0]
                if text:
                    (self._reasoning if shape.reasoning else self._text)(text)
                return
        if payload == b"[DONE]":
            self._end()
            return
        try:
            chunk = decode_chunk(payload)
        except msgspec.MsgspecError as exc:
            raise UpstreamProtocolError(f"unreadable upstream chunk: {exc}") from None
        if chunk.error is not None or chunk.object == "error":
            self._fail(upstream_error(payload))
            return
        exact = self._apply(chunk)
        if self._streaming:
            # Scores that needed mapping would fail the shape's check on every later chunk.
            self._shape = ChunkShape.learn(payload, chunk, self._logprobs) if exact else None

    def _apply(self, chunk: Chunk) -> bool:
        """Whether the chunk's scores, if any, needed no mapping."""
        exact = True
        if chunk.id is not None and self.answer_id is None:
            self.answer_id, self.answer_model = chunk.id, chunk.model
        if chunk.usage is not None:
            self._usage = usage_of(chunk)
            if self._spent is None:
                self.first_usage = self._usage
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            if self._logprobs and choice.logprobs is not None and choice.logprobs.content:
                exact = self._scores.add(bytes(choice.logprobs.content))
            delta = choice.delta or choice.message
            if delta is not None:
                self._delta(delta)
            if choice.finish_reason is not None:
                self._finish_reason = choice.finish_reason
                self.finish_reasons.append(choice.finish_reason)
                if choice.finish_reason == "abort":
                    self._fail(UpstreamError("the upstream aborted the generation"))
        return exact

    def _delta(self, delta: Delta) -> None:
        reasoning = delta.reasoning or delta.reasoning_content
        if reasoning:
            self._reasoning(reasoning)
        if delta.content:
            self._text(delta.content)
        if delta.refusal:
            self._refusal(delta.refusal)
        for position, tool_call in enumerate(delta.tool_calls or ()):
            self._tool_call(position, tool_call)

    def _reasoning(self, text: str) -> None:
        item = self._current
        if item is None or item.item["type"] != "reasoning":
            self._close_current()
            item = self._current = self._open(
                {"id": self._new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            )
            self._events.part("response.content_part.added", item, {"type": "reasoning_text", "text": ""})
            if self._call.summary:
                self._events.summary_part("response.reasoning_summary_part.added", item, "")
        item.parts.append(text)
        self._generating = item
        delta = orjson.dumps(text)
        self._events.delta(item, "response.reasoning_text.delta", "content_index", delta)
        if self._call.summary:
            self._events.delta(item, "response.reasoning_summary_text.delta", "summary_index", delta)

    def _text(self, text: str) -> None:
        if self._current is not None:
            self._close_current()
        message = self._message or self._open_message()
        message.parts.append(text)
        self._generating = message
        self._events.delta(
            message,
            "response.output_text.delta",
            "content_index",
            orjson.dumps(text),
            b',"logprobs":' + self._scores.take(),
        )

    def _refusal(self, text: str) -> None:
        """A refusal is a message of its own, its one part a `refusal` (design.md 4.5)."""
        item = self._current
        if item is None or item.item["type"] != "message":
            self._close_current()
            item = self._current = self._new_message({"type": "refusal", "refusal": ""})
        item.parts.append(text)
        self._generating = item
        self._events.delta(item, "response.refusal.delta", "content_index", orjson.dumps(text))

    def _tool_call(self, position: int, delta: ToolCallDelta) -> None:
        index = position if delta.index is None else delta.index
        call = self._calls.get(index)
        function = delta.function
        named = function is not None and bool(function.name)
        if call is None or (named and delta.id and call.call_id and delta.id != call.call_id):
            # design.md 6.4: another id and a name at an index is another call.
            if call is not None and call.item is None:
                raise UpstreamProtocolError(NAMELESS_CALL)
            call = self._calls[index] = ToolCall()
        elif call.item is not None and call.item is not self._current:
            raise UpstreamProtocolError(f"tool call {index} continued after another item began")
        call.call_id = call.call_id or delta.id
        if function is not None:
            if call.name is None and function.name:
                call.name = function.name
                call.ref = self._call.tools.lookup(function.name)
            if function.arguments:
                call.arguments.append(function.arguments)
                if call.item is not None and call.delta_event is not None:
                    self._events.delta(call.item, call.delta_event, None, orjson.dumps(function.arguments))
        if call.item is None and call.call_id and call.name:
            self._open_call(call)
        self._generating = call.item or call

    # -- items -----------------------------------------------------------------------------

    def _open(self, item: dict[str, Any]) -> OpenItem:
        opened = OpenItem(len(self._output), item)
        self._output.append(item)
        self._events.emit("response.output_item.added", output_index=opened.index, item=item)
        return opened

    def _open_message(self) -> OpenItem:
        self._message = self._new_message(text_part("", []))
        return self._message

    def _new_message(self, part: dict[str, Any]) -> OpenItem:
        """A message item opened with its one content part, empty: text, or a refusal."""
        item = self._open(
            {"id": self._new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        )
        self._events.part("response.content_part.added", item, part)
        return item

    def _open_call(self, call: ToolCall) -> None:
        self._close_current()
        item = call.item = self._current = self._open(call.opened(self._new_id))
        item.parts = call.arguments  # one list: fragments that come later are the item's too
        if call.ref.builtin is not None:
            self._events.emit(f"response.{item.item['type']}.in_progress", **item.at)
        # Fragments that came before the id and name were known.
        if call.arguments and call.delta_event is not None:
            self._events.delta(item, call.delta_event, None, orjson.dumps("".join(call.arguments)))

    def _close_current(self, status: str = "completed") -> None:
        item = self._current
        if item is None:
            return
        self._current = None
        text = "".join(item.parts)
        kind = item.item["type"]
        if kind == "reasoning":
            self._events.close_reasoning(item, text, self._call.summary, self._call.seal)
        elif kind == "message":  # a refusal
            part = {"type": "refusal", "refusal": text}
            self._events.emit("response.refusal.done", **item.at, content_index=0, refusal=text)
            self._events.part("response.content_part.done", item, part)
            item.item["content"] = [part]
        else:
            call = next((call for call in self._calls.values() if call.item is item), None)  # None: replaced (6.4)
            runs = call is not None and call.ref.runs_here and not call.ref.approval
            events = whole(item, text)
            for event, fields in events if status == "completed" or not runs else ():
                self._events.emit(event, **fields)
            if call is not None and runs and status == "completed":  # it runs after the round (14.4, 8.17)
                self._pending.append((item, call.run()))
                return
        self._close(item, status)

    def _close_message(self, status: str) -> None:
        message = self._message
        if message is not None and message.item["status"] != "in_progress":
            return  # closed at the end of a round
        if message is None:
            if not self._scores.count:
                return
            # design.md 3.9: scores with no text part still reach the client, on an empty message.
            message = self._open_message()
        text = "".join(message.parts)
        scores = self._scores.whole()
        self._events.emit("response.output_text.done", **message.at, content_index=0, text=text, logprobs=scores)
        part = text_part(text, scores)
        self._events.part("response.content_part.done", message, part)
        message.item["content"] = [part]
        self._close(message, status)

    def _close(self, item: OpenItem, status: str) -> None:
        kind = item.item["type"]
        if kind != "mcp_approval_request":  # the one item without a status; a patch's never says incomplete
            item.item["status"] = "in_progress" if kind == "apply_patch_call" and status == "incomplete" else status
        self._events.emit("response.output_item.done", output_index=item.index, item=item.item)

    def _close_all(self, cut: OpenItem | ToolCall | None, default: str) -> None:
        """Close every open item; `cut` (the item generated when the stream stopped) gets
        `incomplete`, the others `default`; a compaction item as it stands (empty, where no
        summary came)."""
        self._close_calls(cut, default)
        self._ran({})  # MCP calls that did not run, their turn over
        self._close_message(status_at(self._message, cut, default))
        compaction, self._compaction = self._compaction, None
        if compaction is not None:
            self._events.emit("response.output_item.done", output_index=compaction.index, item=compaction.item)

    def _close_calls(self, cut: OpenItem | ToolCall | None, default: str) -> None:
        """Close every open item but the message, which stays open across rounds (3.8)."""
        self._close_current(status_at(self._current, cut, default))
        for call in self._calls.values():
            if call.item is None and call.name:  # its id never came: still the client's call
                self._open_call(call)
                self._close_current(status_at(call.item, cut, default))

    # -- endings ---------------------------------------------------------------------------

    def _end(self) -> None:
        if self.done:
            return
        reason = self._finish_reason
        if reason is None:
            self._fail(UpstreamProtocolError("the upstream stream ended before the generation finished"))
            return
        if any(call.name is None for call in self._calls.values()):
            self._fail(UpstreamProtocolError(NAMELESS_CALL))
            return
        spent = (self._usage.completion_tokens or 0) if self._usage is not None else None
        if reason == "tool_calls" and cut_short(self._generating, self._limit, spent):
            reason = "length"
        incomplete = INCOMPLETE_REASONS.get(reason)
        if incomplete:
            self._close_all(self._generating, "completed")
            self._terminate("incomplete", incomplete_details={"reason": incomplete})
        elif self._round_due():
            if self._runs_tools():  # the message stays open: the next round's scores follow (3.7, 3.8)
                self._close_calls(None, "completed")
            else:  # what is due makes no scores (a compaction's summary): the rounds' items are whole
                self._close_all(None, "completed")
            self.round_over = True
        else:
            self._close_all(None, "completed")
            self._terminate("completed", completed_at=int(self._clock()))

    def _round_due(self) -> bool:
        """Whether the turn goes on after this round: it called a tool the proxy runs, or its
        conversation reached its compaction threshold (design.md 8.10)."""
        compact_at = self._call.compact_at
        return self._runs_tools() or (compact_at is not None and self.context() >= compact_at)

    def _runs_tools(self) -> bool:
        return any(call.ref.runs_here and not call.ref.approval for call in self._calls.values())

    def due(self) -> Due:
        """What is due after this round (design.md 2.3, 14.4, 8.10): the calls the proxy runs,
        then, once they ran, the end where the client owes output or the output tokens are
        spent, else the model's next round; or, the answer whole, its summary."""
        if not self.round_over:
            return None
        if self._pending:
            return RunCalls([run for _, run in self._pending])
        if not self._runs_tools():
            return Summary()
        if self._awaits_client():
            return End()
        left = self._tokens_left()
        if left is not None and left <= 0:
            return End("max_output_tokens")
        return NextRound(self._next, left, self._loaded)

    def ran(self, results: dict[str, tuple[str | None, dict[str, Any] | None]]) -> bytes:
        """This round's calls the proxy runs done, each with its output or its error by item id
        (a search's output the JSON of the tools it found, 8.17); one without a result did not
        run, and the model reads so (design.md 14.4)."""
        runs = [run for _, run in self._pending]
        said = self._round_message()
        read = self._ran(results)
        tool = [
            {"role": "tool", "tool_call_id": run["answers"], "content": text}
            for run, text in zip(runs, read, strict=True)
        ]
        self._next = [said, *tool]
        return self._flush()

    def _ran(self, results: dict[str, tuple[str | None, dict[str, Any] | None]]) -> list[str]:
        """The pending calls closed with their outcomes: what the model reads of each."""
        read = []
        for item, run in self._pending:
            output, error = results.get(run["id"], (None, None))
            status, event = finished_call(item.item, output, error)
            if event is not None:
                self._events.emit(event, **item.at)
            self._close(item, status)
            if item.item["type"] == "tool_search_call" and output is not None:
                read.append(self._found(item.item, output))
            else:
                read.append(tool_message(output, error))
        self._pending = []
        return read

    def _found(self, call: dict[str, Any], output: str) -> str:
        """What the proxy's search found (`output`, the tools as JSON): its `tool_search_output`
        item, whole, and those tools offered from the next round on; what the model reads of
        them (design.md 8.17)."""
        item = {
            "id": self._new_id("tso"),
            "type": "tool_search_output",
            "call_id": call["call_id"],
            "execution": "server",
            "status": "completed",
            "tools": orjson.loads(output),
        }
        self._add_whole(item)
        functions, said = self._call.tools.load(msgspec.json.decode(output, type=list[Tool]))
        self._loaded += functions
        return said

    def _awaits_client(self) -> bool:
        """Whether this round called a tool the client runs, or one whose call it must approve:
        the Response then ends after the round, for the client (design.md 14.4, 14.5)."""
        return any(not call.ref.runs_here or call.ref.approval for call in self._calls.values())

    def _round_message(self) -> dict[str, Any]:
        """This round as the next round's chat reads it: its text and its calls, each MCP call
        under its item's id, which its tool message answers (design.md 14.4)."""
        text = "".join(self._message.parts[self._round_text :]) if self._message is not None else ""
        calls = [call.chat_form() for call in self._calls.values() if call.item is not None]
        return {"role": "assistant", "content": text or None, "tool_calls": calls}

    def _tokens_left(self) -> int | None:
        """The output tokens `max_output_tokens` leaves the next round; None: no limit."""
        limit: int | None = self._call.echo["max_output_tokens"]
        return limit and limit - self._usage_so_far()["output_tokens"]

    def context(self) -> int:
        """The tokens of the conversation as it stands after this round."""
        return (self._usage.prompt_tokens or 0) + (self._usage.completion_tokens or 0) if self._usage else 0

    def next_round(self) -> None:
        """Take the next round's upstream call: its events continue this response's sequence
        numbers and output indexes, its scores follow the rounds' before it, and its usage adds
        to theirs (design.md 2.3)."""
        if not self.round_over:
            return
        self.round_over = False
        self._limit = self._tokens_left()
        self._spent = self._usage_so_far()
        self._round_text = len(self._message.parts) if self._message is not None else 0
        self._usage = None
        self._sse = SSEDecoder(self._max_event)
        self._shape = None
        self._finish_reason = None
        self._calls = {}
        self._next = []
        self._loaded = []

    def compacting(self) -> bytes:
        """The conversation's summary is being sampled (design.md 8.8, 8.10): its `compaction`
        item added, empty, and `response.compaction.compacting`, before the summary's call, so
        that a client sees the turn go on; `end` closes the item."""
        self._compaction = self._open(compaction_item("", self._new_id))
        self._events.emit("response.compaction.compacting", **self._compaction.at)
        return self._flush()

    def end(
        self, summary: str | None = None, usage: dict[str, Any] | None = None, incomplete: str | None = None
    ) -> bytes:
        """End a response between rounds, or before the first where the turn makes it whole
        itself (a `compaction_trigger` turn's, 8.8; one that generates nothing, 8.9): the item
        `compacting` opened takes the sealed `summary` (without one, it ends empty), `usage` (the
        summary call's) added to the rounds'; completed, or `incomplete` for that reason (its
        output tokens spent before the next round, 14.4)."""
        if self.response is not None:
            return b""
        self.round_over = False
        if summary is not None and self._compaction is not None:
            self._compaction.item["encrypted_content"] = summary
        self._close_all(None, "completed")
        if incomplete is not None:
            self._terminate("incomplete", incomplete_details={"reason": incomplete})
        else:
            self._terminate("completed", completed_at=int(self._clock()), added=usage)
        return self._flush()

    def _add_whole(self, item: dict[str, Any]) -> None:
        self._output.append(item)
        self._events.whole(len(self._output) - 1, item)

    def _usage_so_far(self) -> dict[str, Any]:
        """The usage of every round up to this one."""
        usage = usage_object(self._usage)
        return usage if self._spent is None else usage_sum(self._spent, usage)

    def _fail(self, error: ProxyError) -> None:
        if self.done:
            return
        self._close_all(None, "incomplete")
        self.error = error  # as it was, for the log
        shown = error.for_client(self._request_id)
        self._events.emit("error", **error_event(shown))
        self._terminate("failed", error=response_error(shown))

    def _terminate(self, status: str, added: dict[str, Any] | None = None, **fields: Any) -> None:
        response = self._snapshot(status)
        response.update(fields)
        usage = self._usage_so_far()
        response["usage"] = usage if added is None else usage_sum(usage, added)
        self.response = response
        self._events.emit(TERMINAL_EVENTS[status], response=response)

    # -- building events -------------------------------------------------------------------

    def _snapshot(self, status: str) -> dict[str, Any]:
        return response_object(self._id, self._created_at, status, self._output, self._call.echo)

    def _as_it_stands(self, item: dict[str, Any]) -> dict[str, Any]:
        message, current = self._message, self._current
        if message is not None and item is message.item and item["status"] == "in_progress":
            return {**item, "content": [text_part("".join(message.parts), self._scores.whole())]}
        return open_form(item, "".join(current.parts)) if current is not None and item is current.item else item

    def _flush(self) -> bytes:
        return self._events.take(ended=self.response is not None)
