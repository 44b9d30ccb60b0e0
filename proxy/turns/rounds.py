"""A Response as a loop of rounds (design.md 2.3): each round one upstream call through the one
translator, whose events continue the rounds' before it, into the transport's sink; after a
round, the turn runs what is due (its compaction's summary, 8.10) and ends the Response. The
transports enter the first round's call themselves (an HTTP stream must know the upstream
answered before its status leaves), and hand the rest to `go_on`, the same for every one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..errors import ProxyError
from ..relay import Sink, relay
from ..responses import compaction
from ..responses.lifecycle import new_id
from ..responses.translate import ResponseTranslator
from ..upstream.client import Exchange
from .compaction import summarised
from .turn import Turn

log = logging.getLogger("proxy")


async def run(turn: Turn, translator: ResponseTranslator, sink: Sink) -> None:
    """Every round, the first one's call entered here: for a transport that writes nothing
    that waits on the upstream's answer (a whole Response, a background run)."""
    async with turn.post() as exchange:
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
    while translator.round_over:
        try:
            ending = await _compaction(turn, translator)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the client may be gone: the sink keeps it first
                await sink.write(translator.end())
            raise
        await sink.write(translator.end(*ending))


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
