"""The relay loop, for a foreground stream and a background run alike (design.md 4.10, 10.2):
one upstream read through the translator, one write to a sink, until the terminal event. The
sink is where the events go: a client's stream, or the store's event log."""

from __future__ import annotations

from typing import Protocol

from .errors import ProxyError
from .responses.translate import ResponseTranslator
from .upstream.client import Exchange


class Sink(Protocol):
    async def write(self, events: bytes) -> None:
        """The translator's output for one upstream read. Once the translator is done, its
        `response` is final, and is kept before its terminal event leaves (design.md 9.2)."""
        ...


async def relay(translator: ResponseTranslator, exchange: Exchange, sink: Sink) -> bool:
    """Until the terminal event, or the round's end where another round is due (design.md
    2.3); False when the upstream broke off, so there is nothing left to drain. An upstream
    read that makes no event is no write."""
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
