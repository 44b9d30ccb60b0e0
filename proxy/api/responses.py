"""POST /v1/responses: parse, route, call the upstream, write what the translator produces."""

from __future__ import annotations

import orjson
from aiohttp import web

from ..appkeys import CLIENTS, CONFIG
from ..config import resolve, served_models
from ..errors import NotFound, ProxyError
from ..responses.request import parse_request, plan_call
from ..responses.translate import ResponseTranslator, translate_completion

CHAT_PATH = "/v1/chat/completions"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def create_response(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG]
    parsed = parse_request(await request.read())
    route = resolve(config, parsed.model)
    if route is None:
        raise NotFound(
            f"The model '{parsed.model}' is not served here. Served: {', '.join(served_models(config))}.",
            param="model",
            code="model_not_found",
        )
    call = plan_call(parsed, route.translation())
    client = request.app[CLIENTS][route.upstream.name]
    async with client.post(CHAT_PATH, call.chat) as upstream:
        if not call.stream:
            completion = await client.read_body(upstream)
            return web.Response(body=orjson.dumps(translate_completion(call, completion)), content_type="application/json")
        translator = ResponseTranslator(call)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        await response.write(translator.start())
        while True:
            try:
                data = await client.read_chunk(upstream)
            except ProxyError as error:
                await response.write(translator.fail(error))
                break
            # After the terminal event the rest of the body is read only so that the
            # connection goes back to the pool.
            events = translator.feed(data) if data else translator.finish()
            if events:
                await response.write(events)
            if not data:
                break
        await response.write_eof()
        return response
