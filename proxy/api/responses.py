"""POST /v1/responses over HTTP: the body read, the turn planned and run by the turn layer
(design.md 2.3), its events written as an SSE stream or its Response as JSON."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from aiohttp import web

from ..appkeys import MODEL_PATTERN, REQUEST_ID, RUNTIME
from ..background import Calls
from ..errors import ProxyError
from ..metrics import GenAI, Metrics
from ..responses import compaction
from ..responses.body import load_json
from ..responses.translate import ResponseTranslator
from ..turns import rounds
from ..turns.turn import Keep, Turn, log_failure
from . import background, compact
from .body import read_body
from .common import json_response, plan
from .streaming import ClientWatch, EventStream

log = logging.getLogger("proxy")


async def create_response(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    turn = await plan(request, data)
    # Before `background`: a trigger turn is answered at once, never queued (design.md 8.8).
    if turn.call.background and not compaction.triggered(turn.past.request):
        translator = turn.translator()
        # The run ends the turn, its conversation's hold with it (design.md 9.7).
        calls = Calls(lambda sink: rounds.run(turn, translator, sink), turn.end)
        return await background.start(request, translator, turn.stored_as, calls, turn.release, stream=turn.call.stream)
    try:
        return await _answered(request, turn, started)
    finally:
        await turn.release()


async def _answered(request: web.Request, turn: Turn, started: float) -> web.StreamResponse:
    call, keep = turn.call, turn.keep
    if compaction.triggered(turn.past.request):
        return await compact.compaction_turn(request, turn)
    translator = turn.translator()
    first_chunk = None  # seconds to the first generated token, of a stream that had one
    try:
        if call.stream:
            response, output, first_chunk = await _stream(request, turn, translator, started)
        else:
            await rounds.run(turn, translator, _Kept(translator, keep))
            output = translator.response
            assert output is not None  # the rounds end it
            response = json_response(output)
    except ProxyError as error:
        if not (call.stream and error.in_stream):
            raise
        response, output = await _failed_stream(request, translator, error, keep)
    if output is not None:
        turn.answered(output, started, first_chunk)
    return response


async def _stream(
    request: web.Request, turn: Turn, translator: ResponseTranslator, started: float
) -> tuple[web.StreamResponse, dict[str, Any] | None, float | None]:
    """The stream, the response it ended with, and the seconds to its first generated token."""
    runtime = request.app[RUNTIME]
    metrics = runtime.metrics
    async with contextlib.AsyncExitStack() as upstream:
        # Entered before the stream begins: the upstream's refusal is an HTTP answer.
        exchange = await upstream.enter_async_context(turn.post(answer=translator))
        response = EventStream()
        await response.prepare(request)
        watch = ClientWatch(
            request, response, runtime.config.keepalive, exchange.timeouts.client_idle, exchange.deadline
        )
        sink = _ClientSink(watch, translator, turn.keep, request[MODEL_PATTERN], turn.gen_ai, metrics, started)
        metrics.streams.inc()
        try:
            await sink.write(translator.start())
            await rounds.answer(translator, exchange, sink)
            await upstream.aclose()  # the first round's call is over: its connection serves the next
            await rounds.go_on(turn, translator, sink)
        except ConnectionResetError:
            pass  # the client left before aiohttp cancelled us; leaving closes the upstream
        finally:
            watch.stop()
            metrics.streams.dec()
    log_failure(translator.error, f"{request.method} {request.path}", request[REQUEST_ID])
    return response, translator.response, sink.first_chunk


class _Kept:
    """A non-streaming call's sink: nothing to write, the response kept once it is final."""

    def __init__(self, translator: ResponseTranslator, keep: Keep) -> None:
        self._translator, self._keep = translator, keep

    async def write(self, events: bytes) -> None:
        if self._translator.response is not None:
            await self._keep(self._translator.response)


class _ClientSink:
    """A stream's client as the relay's sink: one write per upstream read, the last with the
    end of the body (design.md 4.10), the finished response kept before it (9.2)."""

    __slots__ = ("_watch", "_translator", "_keep", "_route", "_gen_ai", "_metrics", "_started", "first_chunk")

    def __init__(
        self,
        watch: ClientWatch,
        translator: ResponseTranslator,
        keep: Keep,
        route: str,
        gen_ai: GenAI,
        metrics: Metrics,
        started: float,
    ) -> None:
        self._watch = watch
        self._translator = translator
        self._keep = keep
        self._route = route
        self._gen_ai = gen_ai
        self._metrics = metrics
        self._started = started
        self.first_chunk: float | None = None  # seconds to the first generated token, once sent

    async def write(self, events: bytes) -> None:
        finished = self._translator.response
        if finished is not None:
            await self._keep(finished)
        await self._watch.write(events, last=finished is not None)
        if self.first_chunk is None and self._translator.generating:
            self.first_chunk = time.monotonic() - self._started
            self._metrics.first_chunk(self._route, self._gen_ai, self.first_chunk)


async def _failed_stream(
    request: web.Request, translator: ResponseTranslator, error: ProxyError, keep: Keep
) -> tuple[web.StreamResponse, dict[str, Any] | None]:
    """An error the client acts on from the event (design.md 8.7), as a stream of its own."""
    response = EventStream()
    await response.prepare(request)
    events = translator.start() + translator.fail(error)
    if translator.response is not None:
        await keep(translator.response)
    await response.write_eof(events)
    return response, translator.response
