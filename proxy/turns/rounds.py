"""A Response as a loop of rounds (design.md 2.3): each round one upstream call through the one
translator, whose events continue the rounds' before it, into the transport's sink; after a
round, the turn runs what is due: the MCP calls its model made, then the next round (14.4), or
its compaction's summary (8.10), then the end of the Response. The transports enter the first
round's call themselves (an HTTP stream must know the upstream answered before its status
leaves), and hand the rest to `go_on`, the same for every one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..errors import ProxyError
from ..relay import Sink, relay
from ..responses import compaction
from ..responses.lifecycle import new_id
from ..responses.mcp import tool_message
from ..responses.translate import ResponseTranslator
from ..upstream.client import Exchange
from .compaction import summarised
from .tools import tool_call_cap
from .turn import Turn

log = logging.getLogger("proxy")


async def run(turn: Turn, translator: ResponseTranslator, sink: Sink) -> None:
    """Every round, the first one's call entered here: for a transport that writes nothing
    that waits on the upstream's answer (a whole Response, a background run)."""
    async with turn.post(answer=translator) as exchange:
        await answer(translator, exchange, sink)
    await go_on(turn, translator, sink)


async def answer(translator: ResponseTranslator, exchange: Exchange, sink: Sink) -> None:
    """One round's upstream answer through the translator into the sink: streamed (one write
    an upstream read, design.md 4.10), or whole (its events not made; the sink keeps the
    Response once it ends)."""
    if translator.streaming:
        if await relay(translator, exchange, sink):
            await exchange.drain()
    else:
        translator.complete(await exchange.read_body())
        await sink.write(b"")


async def go_on(turn: Turn, translator: ResponseTranslator, sink: Sink) -> None:
    """The rounds after the first one's upstream call is over (its connection back in the pool:
    an upstream of one connection serves them all), until the Response ends. A turn cancelled
    between rounds (its client gone, a background cancel, a shutdown) ends the Response with
    the rounds done, kept, before the cancel goes on."""
    rounds = _Rounds(turn)
    while translator.round_over:
        try:
            if translator.calls_to_run():
                await rounds.tools(translator, sink)
                continue
            ending = await _compaction(turn, translator)
        except asyncio.CancelledError:
            if translator.answered:  # kept without its compaction (8.10); an unanswered one is not (14.6)
                with contextlib.suppress(Exception):  # the client may be gone: the sink keeps it first
                    await sink.write(translator.end())
            raise
        await sink.write(translator.end(*ending))


class _Rounds:
    """The chat of a turn's rounds after its first: its messages grow by each round's calls and
    their results, its MCP calls count against `max_tool_calls` (design.md 14.4)."""

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        chat = turn.call.chat
        self._messages = list(chat["messages"])
        self._ran = sum(item["type"] == "mcp_call" for item in turn.call.prelude)  # approved ones
        self._cap = tool_call_cap(turn.runtime.mcp, turn.past.request)
        self._parallel = chat.get("parallel_tool_calls") is not False

    async def tools(self, translator: ResponseTranslator, sink: Sink) -> None:
        """Run the round's MCP calls, up to the cap (those past it are not run, and the model is
        told), then the next round; the Response ends instead where the round called a tool of the
        client's, or asked for an approval, or spent its output tokens."""
        turn, calls = self._turn, translator.calls_to_run()
        runnable = calls[: max(self._cap - self._ran, 0)]
        self._ran += len(runnable)
        outcomes = await turn.servers.run(runnable, self._parallel)
        said = translator.round_message()
        await sink.write(translator.ran(outcomes))
        left = translator.tokens_left()
        if translator.awaits_client or (left is not None and left <= 0):
            await sink.write(translator.end(incomplete=None if translator.awaits_client else "max_output_tokens"))
            return
        self._messages.append(said)
        for item in calls:
            output, error = outcomes.get(item["id"], (None, None))  # none: the cap kept it from running
            self._messages.append({"role": "tool", "tool_call_id": item["id"], "content": tool_message(output, error)})
        translator.next_round()
        try:
            async with turn.post(self._body(translator.tokens_left()), answer=translator) as exchange:
                await answer(translator, exchange, sink)
        except ProxyError as error:  # the upstream refused the round: the Response fails with the rounds done
            await sink.write(translator.fail(error))

    def _body(self, left: int | None) -> dict[str, Any]:
        """The next round's chat request: the model chooses its tools again (a forced choice held
        would call one forever), and is offered none of the MCP servers' past the cap."""
        chat = self._turn.call.chat
        body = {**chat, "messages": self._messages}
        if left is not None:
            body["max_tokens"] = body["max_completion_tokens"] = left
        if "tool_choice" in chat:
            body["tool_choice"] = "auto"
        if self._ran >= self._cap and "tools" in chat:
            run_here = self._turn.call.tools.run_here
            body["tools"] = [tool for tool in chat["tools"] if tool["function"]["name"] not in run_here]
            if not body["tools"]:  # chat servers refuse a `tool_choice` without `tools`
                body.pop("tools")
                body.pop("tool_choice", None)
        return body


async def _compaction(turn: Turn, translator: ResponseTranslator) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The round of a turn whose conversation, its answer included, crossed its
    `context_management` threshold (design.md 8.10): the `compaction` item and the summary
    call's usage. A summary that fails is logged, and the answer completes without it: the
    turn's own tokens are whole."""
    try:
        summary, usage = await summarised(turn, translator.output)
    except Exception as error:  # whatever failed, the answer stays whole; the unforeseen logged whole
        foreseen = error.message if isinstance(error, ProxyError) else None
        log.warning(
            "a compaction after its turn failed: %s",
            foreseen or repr(error),
            exc_info=foreseen is None,
            extra={"request_id": turn.caller.request_id},
        )
        return [], None
    return [compaction.compaction_item(summary, turn.runtime.sealer, new_id)], usage
