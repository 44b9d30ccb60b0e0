"""The relay loop, for a foreground stream and a background run alike (design.md 4.10, 10.2):
one upstream read through the translator, one write to a sink, until the terminal event. The
sink is where the events go: a client's stream, or the store's event log."""

from __future__ import annotations

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


async def relay(translator: ResponseTranslator, exchange: Exchange, sink: Sink, compactor: Compactor) -> bool:
    """Until the terminal event; False when the upstream broke off, so there is nothing left
    to drain. An upstream read that makes no event is no write. A turn whose conversation
    crossed its compaction threshold ends after its compaction."""
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
            if translator.compacting:
                await sink.write(await compacted(translator, compactor))
            return True


async def compacted(translator: ResponseTranslator, compactor: Compactor) -> bytes:
    """The end of a response that waits for its compaction (design.md 8.10)."""
    made = await compactor(translator.output)
    return translator.compacted(*(made or (None, None)))
