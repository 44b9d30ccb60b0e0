"""POST /v1/responses: parse, route, call the upstream, write what the translator produces."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
from aiohttp import web

from ..appkeys import MODEL_PATTERN, REQUEST_ID, RUNTIME
from ..config import Target
from ..errors import ProxyError
from ..responses.plan import TranslationSettings, plan_call
from ..responses.schema import parse_request, unknown_fields
from ..responses.sealing import Sealer
from ..responses.translate import ResponseTranslator
from ..upstream.client import Exchange
from . import background
from .common import KEEPALIVE, EventStream, find_target, load_json, read_body, upstream_headers
from .stored import read_history, recorder

CHAT_PATH = "/v1/chat/completions"
# Keeps a finished response before its last event leaves, so that a client that chains at once
# never races the write (design.md 9.2).
Keep = Callable[[dict[str, Any]], Awaitable[object]]

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

    record = recorder(request, data, past) if stored else None

    async def keep(response: dict[str, Any]) -> None:
        if store is not None and record is not None:
            await store.save(record(response))

    # A background run keeps its events even when its client asked for none (design.md 10.2).
    streaming = call.stream or call.background
    translator = ResponseTranslator(call, streaming=streaming, request_id=request[REQUEST_ID], max_event=target.upstream.max_event_bytes)
    def post() -> AbstractAsyncContextManager[Exchange]:
        return client.post(CHAT_PATH, call.chat, upstream_headers(request))

    if call.background:
        return await background.start(request, translator, record, post, stream=call.stream)
    try:
        async with post() as exchange:
            if call.stream:
                response, output = await _stream(request, translator, exchange, started, keep)
            else:
                output = translator.complete(await exchange.read_body())
                await keep(output)
                response = web.Response(body=orjson.dumps(output), content_type="application/json")
    except ProxyError as error:
        if not (call.stream and error.in_stream):
            raise
        response, output = await _failed_stream(request, translator, error, keep)
    usage = output and output["usage"]
    if usage:
        runtime.metrics.output_tokens.labels(target.pattern).inc(usage["output_tokens"])
    return response


def translation_settings(target: Target, sealer: Sealer) -> TranslationSettings:
    upstream = target.upstream
    return TranslationSettings(
        model=target.model,
        max_top_logprobs=upstream.max_top_logprobs,
        logprobs=upstream.logprobs,
        reasoning_field=None if upstream.reasoning_field == "none" else upstream.reasoning_field,
        defaults=upstream.defaults,
        hosted_tools=upstream.hosted_tools,
        late_system_role=upstream.late_system_messages,
        sealer=sealer,
    )


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
    metrics = request.app[RUNTIME].metrics
    response = EventStream()
    await response.prepare(request)

    def first_token() -> None:
        metrics.first_token.labels(request[MODEL_PATTERN]).observe(time.monotonic() - started)

    runtime = request.app[RUNTIME]
    watch = _ClientWatch(request, response, runtime.config.keepalive, exchange.timeouts.client_idle, exchange.deadline)
    metrics.streams.inc()
    try:
        whole = await _relay(watch, translator, exchange, first_token, keep)
    except ConnectionResetError:
        whole = False  # the client left before aiohttp cancelled us; leaving closes the upstream
    finally:
        watch.stop()
        metrics.streams.dec()
    if whole:
        await exchange.drain()
    _log_failure(request, translator)
    return response, translator.response


async def _relay(watch: _ClientWatch, translator: ResponseTranslator, exchange: Exchange, first_token: Callable[[], None], keep: Keep) -> bool:
    """One client write per upstream read, the last with the end of the body, until the
    terminal event (design.md 4.10). False when the upstream broke off, so there is nothing
    left to drain."""
    await watch.write(translator.start())
    waiting = True
    while True:
        try:
            data = await exchange.read_chunk()
        except ProxyError as error:
            events = translator.fail(error)
            await _keep_finished(translator, keep)
            await watch.write(events, last=True)
            return False
        events = translator.feed(data) if data else translator.finish()
        finished = translator.response
        if finished is not None:
            await keep(finished)
        if events or finished is not None:
            await watch.write(events, last=finished is not None)
        if waiting and translator.generating:
            waiting = False
            first_token()
        if finished is not None:
            return True


def _log_failure(request: web.Request, translator: ResponseTranslator) -> None:
    """An upstream failure's own words, which the client saw only as a request id (design.md 5.7)."""
    error = translator.error
    if error is not None and error.internal:
        log.warning("%s %s: %s", request.method, request.path, error.message, extra={"request_id": request[REQUEST_ID]})


async def _keep_finished(translator: ResponseTranslator, keep: Keep) -> None:
    if translator.response is not None:
        await keep(translator.response)


async def _failed_stream(
    request: web.Request, translator: ResponseTranslator, error: ProxyError, keep: Keep
) -> tuple[web.StreamResponse, dict[str, Any] | None]:
    """An error the client acts on from the event (design.md 8.7), as a stream of its own."""
    response = EventStream()
    await response.prepare(request)
    events = translator.start() + translator.fail(error)
    await _keep_finished(translator, keep)
    await response.write_eof(events)
    return response, translator.response


class _ClientWatch:
    """One timer on the client's side of a stream. While the upstream is silent, an SSE comment
    every `keepalive` seconds keeps idle timers between the proxy and the client from cutting
    a long prefill (design.md 4.11). A client that takes nothing for `client_idle` seconds, or
    whose stream outlives the exchange's `total` with a write still pending, is let go: its
    connection closes, and with it the upstream request (design.md 4.12). A timer, not a
    timeout per write: writes come thousands of times a second."""

    __slots__ = ("_request", "_response", "_keepalive", "_client_idle", "_deadline", "_loop", "_last", "_writing_since", "_timer", "_beat")

    def __init__(self, request: web.Request, response: web.StreamResponse, keepalive: float | None, client_idle: float, deadline: float | None) -> None:
        self._request = request
        self._response = response
        self._keepalive = keepalive
        self._client_idle = client_idle
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()  # the end of the last write
        self._writing_since: float | None = None
        self._beat: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(self._due(self._last), self._check)

    async def write(self, data: bytes, last: bool = False) -> None:
        self._writing_since = self._loop.time()
        try:
            await (self._response.write_eof(data) if last else self._response.write(data))
        finally:
            self._writing_since = None
            self._last = self._loop.time()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._beat is not None:
            self._beat.cancel()  # a beat still waiting to write must not follow the last event

    def _due(self, now: float) -> float:
        """When to look next: a write that began may not be seen for half of `client_idle`,
        since a write starts without touching the timer."""
        writing = self._writing_since
        if writing is not None:
            due = writing + self._client_idle
        else:
            due = now + self._client_idle / 2
            if self._keepalive is not None:
                due = min(due, self._last + self._keepalive)
        return due if self._deadline is None else min(due, self._deadline)

    def _check(self) -> None:
        now = self._loop.time()
        writing = self._writing_since
        if writing is not None and (now - writing >= self._client_idle or (self._deadline is not None and now >= self._deadline)):
            self._timer = None
            if self._request.transport is not None:
                self._request.transport.abort()  # the pending write fails; the handler ends
            return
        if writing is None and self._keepalive is not None and now - self._last >= self._keepalive and (self._beat is None or self._beat.done()):
            # The relay is waiting on the upstream, so this write interleaves with none of its own.
            self._beat = asyncio.create_task(self._send_keepalive())
            self._last = now
        self._timer = self._loop.call_at(max(self._due(now), now + 0.01), self._check)

    async def _send_keepalive(self) -> None:
        if self._writing_since is not None:  # the relay began a write, maybe its last, meanwhile
            return
        with contextlib.suppress(ConnectionError):  # the client left: the relay finds out too
            await self.write(KEEPALIVE)
