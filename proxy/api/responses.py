"""POST /v1/responses: parse, route, call the upstream, write what the translator produces."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from ..appkeys import ROUTE, RUNTIME
from ..errors import ProxyError
from ..responses.request import Call, parse_request, plan_call
from ..responses.translate import ResponseTranslator, translate_completion
from ..upstream.client import Exchange
from .common import read_body, route, upstream_headers

CHAT_PATH = "/v1/chat/completions"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def create_response(request: web.Request) -> web.StreamResponse:
    started = time.monotonic()
    parsed = parse_request(await read_body(request))
    found, client = route(request, parsed.model)
    call = plan_call(parsed, found.translation())
    async with client.post(CHAT_PATH, call.chat, upstream_headers(request)) as exchange:
        if call.stream:
            response, output = await _stream(request, call, exchange, started)
        else:
            output = translate_completion(call, await exchange.read_body())
            response = web.Response(body=orjson.dumps(output), content_type="application/json")
    usage = output.get("usage")
    if usage:
        request.app[RUNTIME].metrics.output_tokens.labels(found.pattern).inc(usage["output_tokens"])
    return response


async def _stream(request: web.Request, call: Call, exchange: Exchange, started: float) -> tuple[web.StreamResponse, dict]:
    metrics = request.app[RUNTIME].metrics
    translator = ResponseTranslator(call)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    metrics.streams.inc()
    try:
        await response.write(translator.start())
        first_token = True
        while not translator.done:
            try:
                data = await exchange.read_chunk()
            except ProxyError as error:
                await response.write(translator.fail(error))
                await response.write_eof()
                return response, translator.response
            await response.write(translator.feed(data) if data else translator.finish())
            if first_token and translator.generating:
                first_token = False
                metrics.first_token.labels(request[ROUTE]).observe(time.monotonic() - started)
        await response.write_eof()
    finally:
        metrics.streams.dec()
    await exchange.drain()
    return response, translator.response
