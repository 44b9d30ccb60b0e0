"""The relay loop, for a foreground stream and a background run alike (design.md 4.10, 10.2):
one upstream read through the translator, one write to a sink, until the terminal event. The
sink is where the events go: a client's stream, or the store's event log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .errors import ProxyError
from .responses.translate import ResponseTranslator
from .upstream.client import Exchange

# A turn's compaction after its answer (design.md 8.10), from the output: the `compaction` item
# and the summary call's usage, or None when the summary failed.
Compactor = Callable[[list[dict[str, Any]]], Awaitable[tuple[dict[str, Any], dict[str, Any]] | None]]


class Sink(Protocol):
    async def write(self, events: bytes) -> None:
        """The translator's output for one upstream read. Once the translator is done, its
        `response` is final, and is kept before its terminal event leaves (design.md 9.2)."""
        ...


async def relay(translator: ResponseTranslator, exchange: Exchange, sink: Sink) -> bool:
    """Until the terminal event, or the answer's end where the response waits for its
    compaction (`end_compaction`, once the upstream call is over); False when the upstream
    broke off, so there is nothing left to drain. An upstream read that makes no event is no
    write."""
    while True:
        try:
            data = await exchange.read_chunk()
        except ProxyError as error:
            await sink.write(translator.fail(error))
            return False
        events = translator.feed(data) if data else translator.finish()
        if events or translator.done:
            await sink.write(events)
        if translator.done:
            return True


async def end_compaction(translator: ResponseTranslator, compactor: Compactor, sink: Sink) -> None:
    """End a response that waits for its compaction (design.md 8.10), after its answer's
    upstream call is over (its connection back for the summary's): the `compaction` item, or,
    where the summary failed or the turn is cancelled meanwhile (a client gone, a cancel, a
    shutdown), the answer completed as it is: its own tokens are whole, and kept."""
    if not translator.compacting:
        return
    try:
        made = await compactor(translator.output)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # the client may be gone: the sink keeps it first
            await sink.write(translator.compacted(None, None))
        raise
    await sink.write(translator.compacted(*(made or (None, None))))
