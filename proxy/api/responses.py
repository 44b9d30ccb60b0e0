"""POST /v1/responses over HTTP: the body read, the turn planned and run by the turn layer
(design.md 2.3) into a sink: the client's SSE stream, or nothing until its Response is whole, sent
as JSON; a background run's is its event log (`api/background.py`)."""

from __future__ import annotations

import time

from aiohttp import web

from ..appkeys import RUNTIME
from ..responses.body import load_json
from ..sink import Client
from ..turns.turn import Turn
from . import background
from .body import read_body
from .common import Whole, json_response, plan
from .streaming import ClientWatch, EventStream


async def create_response(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    turn = await plan(request, data, started=started)
    if turn.call.background:
        return await background.start(request, turn)
    if not turn.call.stream:
        return json_response(await turn.run(Whole()))
    sink = _Stream(request, turn)
    try:
        await turn.run(sink)
    except ConnectionResetError:
        pass  # the client left before aiohttp cancelled us; leaving closed the upstream
    finally:
        sink.close()
    return sink.response


class _Stream:
    """The client's SSE stream as a turn's sink: its headers with the first events, one write
    an upstream read, the last with the end of the body (design.md 4.10), watched for a client
    that stops reading (4.11, 4.12)."""

    __slots__ = ("_request", "_turn", "_translator", "response", "_watch")
    client = Client.GONE  # a cancel is its client gone

    def __init__(self, request: web.Request, turn: Turn) -> None:
        self._request = request
        self._turn = turn
        self._translator = turn.translator
        self.response = EventStream()
        self._watch: ClientWatch | None = None

    async def opened(self, deadline: float | None) -> None:
        request, turn = self._request, self._turn
        await self.response.prepare(request)
        keepalive = request.app[RUNTIME].config.keepalive
        self._watch = ClientWatch(request, self.response, keepalive, turn.client_idle, deadline)
        turn.metrics.streams.inc()

    async def write(self, events: bytes) -> None:
        assert self._watch is not None  # opened first
        await self._watch.write(events, last=self._translator.response is not None)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._turn.metrics.streams.dec()
