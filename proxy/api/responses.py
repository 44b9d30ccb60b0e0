"""POST /v1/responses: parse, route, call the upstream, write what the translator produces."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from ..appkeys import MODEL_PATTERN, RUNTIME
from ..config import Target
from ..errors import ProxyError
from ..responses.plan import Call, TranslationSettings, plan_call
from ..responses.schema import parse_request
from ..responses.translate import ResponseTranslator, translate_completion
from ..upstream.client import Exchange
from .common import find_target, load_json, read_body, upstream_headers

CHAT_PATH = "/v1/chat/completions"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def create_response(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    parsed = parse_request(load_json(await read_body(request)))
    target, client = find_target(request, parsed.model)
    call = plan_call(parsed, translation_settings(target))
    async with client.post(CHAT_PATH, call.chat, upstream_headers(request)) as exchange:
        if call.stream:
            response, output = await _stream(request, call, exchange, started)
        else:
            output = translate_completion(call, await exchange.read_body())
            response = web.Response(body=orjson.dumps(output), content_type="application/json")
    usage = output and output["usage"]
    if usage:
        request.app[RUNTIME].metrics.output_tokens.labels(target.pattern).inc(usage["output_tokens"])
    return response


def translation_settings(target: Target) -> TranslationSettings:
    upstream = target.upstream
    return TranslationSettings(
        model=target.model,
        max_top_logprobs=upstream.max_top_logprobs,
        logprobs=upstream.logprobs,
        reasoning_field=None if upstream.reasoning_field == "none" else upstream.reasoning_field,
        defaults=upstream.defaults,
    )


async def _stream(request: web.Request, call: Call, exchange: Exchange, started: float) -> tuple[web.StreamResponse, dict[str, Any] | None]:
    metrics = request.app[RUNTIME].metrics
    translator = ResponseTranslator(call)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)

    def first_token() -> None:
        metrics.first_token.labels(request[MODEL_PATTERN]).observe(time.monotonic() - started)

    metrics.streams.inc()
    try:
        whole = await _relay(response, translator, exchange, first_token)
        await response.write_eof()
    except ConnectionResetError:
        whole = False  # the client left before aiohttp cancelled us; leaving closes the upstream
    finally:
        metrics.streams.dec()
    if whole:
        await exchange.drain()
    return response, translator.response


async def _relay(response: web.StreamResponse, translator: ResponseTranslator, exchange: Exchange, first_token: Callable[[], None]) -> bool:
    """One client write per upstream read, until the terminal event (design.md 4.10). False
    when the upstream broke off, so there is nothing left to drain."""
    await response.write(translator.start())
    waiting = True
    while not translator.done:
        try:
            data = await exchange.read_chunk()
        except ProxyError as error:
            await response.write(translator.fail(error))
            return False
        await response.write(translator.feed(data) if data else translator.finish())
        if waiting and translator.generating:
            waiting = False
            first_token()
    return True
