"""A Response as a loop of rounds (design.md 2.3): from what its turn asks (the model's rounds, a
summary, nothing) to its end, each round one upstream call read through the one translator into
the transport's sink, the first like every other; after each, what the translator says is due:
the MCP calls its model made, then the next round (14.4); the end, the client owing output; or
the compaction's summary (8.10)."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ProxyError
from ..responses.translate import End, NextRound, ResponseTranslator, RunCalls, Summary
from ..sink import Sink
from ..upstream.client import Exchange
from . import compaction
from .keeping import Keeping

if TYPE_CHECKING:  # the turn runs its rounds: the module that makes turns imports this one
    from .turn import Turn

log = logging.getLogger("proxy")


class Asks(enum.Enum):
    """What a turn is asked (design.md 2.3), each a case of the one loop."""

    RESPONSE = "response"  # the model's rounds, to the Response's end
    SUMMARY = "summary"  # a `compaction_trigger` turn: its summary is its one round (8.8)
    NOTHING = "nothing"  # `generate: false`: the Response kept without output (8.9)
    COMPACTION = "compaction"  # `/v1/responses/compact`: the summary given back, no Response (8.8)
    COUNT = "count"  # `/v1/responses/input_tokens`: a count, nothing generated (8.12)

    @property
    def ends_a_turn(self) -> bool:
        """Whether it makes a Response: kept, and added to its conversation (9.7)."""
        return self in (Asks.RESPONSE, Asks.SUMMARY, Asks.NOTHING)


class Output:
    """A Response's way to its sink: the finished Response kept before the write that ends it
    (design.md 9.2), its first generated token's time noted (12.2), and whether its events
    began (a failure is then the Response's, no longer the transport's)."""

    __slots__ = (
        "sink",
        "_translator",
        "_keeping",
        "_started",
        "_first",
        "waiting_first",
        "first_chunk",
        "opened",
        "began",
        "made",
    )

    def __init__(
        self,
        translator: ResponseTranslator,
        sink: Sink,
        keeping: Keeping,
        started: float,
        first: Callable[[float], None] | None,
    ) -> None:
        self.sink = sink
        self._translator = translator
        self._keeping = keeping
        self._started = started  # when its request came
        self._first = first  # told the seconds to the first generated token of a stream
        self.waiting_first = first is not None and translator.streaming
        self.first_chunk: float | None = None
        self.opened = False  # the sink told the first reply came
        self.began = False  # the Response's first events written
        self.made: dict[str, Any] | None = None  # what a turn that makes no Response made (8.8)

    async def open(self, deadline: float | None) -> None:
        """The first round's reply came, or the turn made its Response itself: the
        sink told, once, and a streamed Response's first events written, where they were not
        already (a background run's, 10.1)."""
        self.opened = True
        await self.sink.opened(deadline)
        if self._translator.streaming and not self.began:
            await self.begin()

    async def begin(self) -> None:
        await self.write(self._translator.start())
        self.began = True

    async def write(self, events: bytes) -> None:
        translator = self._translator
        if translator.response is not None:
            await self._keeping.keep(translator.response)
        elif self.waiting_first and translator.generating:
            self.waiting_first = False
            self.first_chunk = time.monotonic() - self._started
            assert self._first is not None
            self._first(self.first_chunk)
        await self.sink.write(events)


async def run(turn: Turn, out: Output) -> None:
    """The turn's rounds to the Response's end (`compaction` for a turn that asks for a summary
    and makes no Response: `out.made`). A round after the first that the upstream refuses fails
    the Response with the rounds done (14.4); a summary due after the rounds that fails leaves
    the answer whole, completed (8.10)."""
    translator = turn.translator
    match turn.asks:
        case Asks.COMPACTION:
            out.made = await compaction.compacted(turn)
            return
        case Asks.SUMMARY:  # its one round: the Response is its compaction item, open while it is sampled (8.8)
            await out.open(None)
            await out.write(translator.compacting())
            await out.write(translator.end(*await compaction.summary(turn)))
            return
        case Asks.NOTHING:
            await out.open(None)
            await out.write(translator.end())
            return
    await _round(turn, out, turn.call.chat)
    messages = list(turn.call.chat["messages"])
    functions = list(turn.call.chat.get("tools", ()))
    while True:
        match translator.due():
            case None:
                return
            case RunCalls(calls):
                parallel = turn.call.chat.get("parallel_tool_calls") is not False
                await out.write(translator.ran(await turn.tools.run(calls, parallel, turn.call.tools.search)))
            case NextRound(said, left, loaded):
                messages += said
                functions += loaded
                translator.next_round()
                try:
                    await _round(turn, out, _next_body(turn, messages, functions, left))
                except ProxyError as error:
                    await out.write(translator.fail(error))
            case End(incomplete):
                await out.write(translator.end(incomplete=incomplete))
            case Summary():
                await out.write(translator.compacting())
                await out.write(translator.end(*await _summary(turn)))


async def _round(turn: Turn, out: Output, body: dict[str, Any]) -> None:
    """One round's upstream call, its connection back in the pool once read (an upstream of one
    connection serves every round): streamed, one sink write an upstream read (design.md 4.10);
    or whole, its events not made."""
    translator = turn.translator
    async with turn.post(body, feeds=translator) as exchange:
        if not out.opened:
            await out.open(exchange.deadline)
        if not translator.streaming:
            translator.complete(await exchange.read_body())
            await out.write(b"")
        elif await _relay(translator, exchange, out):
            await exchange.drain()


async def _relay(translator: ResponseTranslator, exchange: Exchange, out: Output) -> bool:
    """Upstream reads through the translator into the sink until the terminal event, or the
    round's end; False where the upstream broke off, leaving nothing to drain. A read that makes
    no event is no write; past the first generated token, the sink takes the writes itself."""
    sink = out.sink
    while True:
        try:
            data = await exchange.read_chunk()
        except ProxyError as error:
            await out.write(translator.fail(error))
            return False
        events = translator.feed(data) if data else translator.finish()
        done = translator.done
        if done or out.waiting_first:
            if events or done:
                await out.write(events)
        elif events:
            await sink.write(events)
        if done:
            return True


def _next_body(
    turn: Turn, messages: list[dict[str, Any]], functions: list[dict[str, Any]], left: int | None
) -> dict[str, Any]:
    """The next round's chat request: the conversation grown by the rounds' calls and their
    results, its `functions` those of the first round and those a search loaded since (8.17);
    the model chooses its tools again (a forced choice held would call one forever), and is
    offered none that the proxy runs past the budget (14.4)."""
    chat = turn.call.chat
    body = {**chat, "messages": messages, "tools": functions}
    if left is not None:
        body["max_tokens"] = body["max_completion_tokens"] = left
    if "tool_choice" in chat:
        body["tool_choice"] = "auto"
    if turn.tools.left <= 0:
        run_here = turn.call.tools.run_here
        body["tools"] = [tool for tool in functions if tool["function"]["name"] not in run_here]
    if not body["tools"]:  # chat servers refuse a `tool_choice` without `tools`
        body.pop("tools")
        body.pop("tool_choice", None)
    return body


async def _summary(turn: Turn) -> tuple[str | None, dict[str, Any] | None]:
    """The summary due after a turn whose conversation, its answer included, crossed its
    `context_management` threshold (design.md 8.10), sealed, and the summary call's usage. One
    that fails is logged, and the answer completes with its compaction item empty: the turn's
    own tokens are whole."""
    try:
        sealed, usage = await compaction.summary(turn, turn.translator.output)
    except Exception as error:  # whatever failed, the answer stays whole; the unforeseen logged whole
        foreseen = error.message if isinstance(error, ProxyError) else None
        log.warning(
            "a compaction after its turn failed: %s",
            foreseen or repr(error),
            exc_info=foreseen is None,
            extra={"request_id": turn.caller.request_id},
        )
        return None, None
    return sealed, usage
