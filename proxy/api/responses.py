"""POST /v1/responses: parse, route, call the upstream, write what the translator produces."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiohttp import web
from prometheus_client import Histogram

from ..appkeys import MODEL_PATTERN, REQUEST_ID, RUNTIME
from ..errors import ProxyError
from ..relay import relay
from ..responses import compaction
from ..responses.body import load_json
from ..responses.plan import plan_call
from ..responses.schema import parse_request, unknown_fields
from ..responses.translate import ResponseTranslator
from ..upstream.client import Exchange
from . import background, compact
from .body import read_body
from .calls import CHAT_PATH, Keep, call_session, translation_settings
from .common import find_target, json_response, upstream_headers
from .stored import read_history, stored_form
from .streaming import ClientWatch, EventStream

log = logging.getLogger("proxy")


async def create_response(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    runtime = request.app[RUNTIME]
    data = load_json(await read_body(request), runtime.config.requests.max_depth)
    parsed = parse_request(data)
    fields = unknown_fields(data, reject=runtime.config.requests.unknown_fields == "reject")
    target, client = find_target(request, parsed.model)
    past = await read_history(request, parsed)
    store = runtime.store
    stored = store is not None and parsed.store is not False
    call = plan_call(past.request, translation_settings(target, runtime.sealer), stored=stored)
    _note_ignored(request, [*(f"field:{name}" for name in fields), *call.ignored])

    session = call_session(request, past) if client.keyed else None
    as_stored = stored_form(request, data, past, session) if stored else None

    async def keep(response: dict[str, Any]) -> None:
        if store is not None and as_stored is not None:
            await store.save(as_stored(response))

    if compaction.triggered(past.request):
        return await compact.compaction_turn(request, past, call, target, client, keep)
    # A background run keeps its events even when its client asked for none (design.md 10.2).
    streaming = call.stream or call.background
    translator = ResponseTranslator(
        call, streaming=streaming, request_id=request[REQUEST_ID], max_event=target.upstream.max_event_bytes
    )

    def post() -> AbstractAsyncContextManager[Exchange]:
        return client.post(CHAT_PATH, call.chat, upstream_headers(request), session=session)

    if call.background:
        return await background.start(request, translator, as_stored, post, stream=call.stream)
    try:
        async with post() as exchange:
            if call.stream:
                response, output = await _stream(request, translator, exchange, started, keep)
            else:
                output = translator.complete(await exchange.read_body())
                await keep(output)
                response = json_response(output)
    except ProxyError as error:
        if not (call.stream and error.in_stream):
            raise
        response, output = await _failed_stream(request, translator, error, keep)
    usage = output and output["usage"]
    if usage:
        metrics = runtime.metrics
        metrics.output_tokens.labels(target.pattern).inc(usage["output_tokens"])
        metrics.prompt_tokens.labels(target.upstream.name).inc(usage["input_tokens"])
        metrics.cached_prompt_tokens.labels(target.upstream.name).inc(usage["input_tokens_details"]["cached_tokens"])
    return response


def _note_ignored(request: web.Request, ignored: Iterable[str]) -> None:
    """Count what the request named that the upstream is not sent; log each kind once per
    process, since the same client sends the same thing on every turn (design.md 8.1)."""
    metrics = request.app[RUNTIME].metrics
    for what in ignored:
        if metrics.ignored(what):
            log.info("ignored in requests from now on, and counted in proxy_ignored_total: %s", what)


async def _stream(
    request: web.Request, translator: ResponseTranslator, exchange: Exchange, started: float, keep: Keep
) -> tuple[web.StreamResponse, dict[str, Any] | None]:
    runtime = request.app[RUNTIME]
    metrics = runtime.metrics
    response = EventStream()
    await response.prepare(request)
    watch = ClientWatch(request, response, runtime.config.keepalive, exchange.timeouts.client_idle, exchange.deadline)
    sink = _ClientSink(watch, translator, keep, metrics.first_token.labels(request[MODEL_PATTERN]), started)
    metrics.streams.inc()
    try:
        await sink.write(translator.start())
        whole = await relay(translator, exchange, sink)
    except ConnectionResetError:
        whole = False  # the client left before aiohttp cancelled us; leaving closes the upstream
    finally:
        watch.stop()
        metrics.streams.dec()
    if whole:
        await exchange.drain()
    _log_failure(request, translator)
    return response, translator.response


class _ClientSink:
    """A stream's client as the relay's sink: one write per upstream read, the last with the
    end of the body (design.md 4.10), the finished response kept before it (9.2)."""

    __slots__ = ("_watch", "_translator", "_keep", "_first_token", "_started")

    def __init__(
        self,
        watch: ClientWatch,
        translator: ResponseTranslator,
        keep: Keep,
        first_token: Histogram | None,
        started: float,
    ) -> None:
        self._watch = watch
        self._translator = translator
        self._keep = keep
        self._first_token = first_token  # observed once, then None
        self._started = started

    async def write(self, events: bytes) -> None:
        finished = self._translator.response
        if finished is not None:
            await self._keep(finished)
        await self._watch.write(events, last=finished is not None)
        if self._first_token is not None and self._translator.generating:
            self._first_token.observe(time.monotonic() - self._started)
            self._first_token = None


def _log_failure(request: web.Request, translator: ResponseTranslator) -> None:
    """An upstream failure's own words, which the client saw only as a request id (design.md 5.7)."""
    error = translator.error
    if error is not None and error.internal:
        log.warning("%s %s: %s", request.method, request.path, error.message, extra={"request_id": request[REQUEST_ID]})


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
