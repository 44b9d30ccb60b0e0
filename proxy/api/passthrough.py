"""/v1/chat/completions and /v1/completions: routed, then relayed byte for byte."""

from __future__ import annotations

from aiohttp import hdrs, web

from ..appkeys import RUNTIME
from ..errors import InvalidRequest
from ..responses.body import load_json
from ..responses.chat import RelayedUsage
from ..responses.plan import cache_salt
from ..responses.session import chat_session, from_headers
from ..upstream.affinity import Session
from .body import read_body
from .common import caller_of, find_target
from .streaming import ClientWatch, cut_short_on_failure


async def forward(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    data = load_json(body, request.app[RUNTIME].config.requests.max_depth)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str):
        raise InvalidRequest("'model' must be a string.", param="model")
    target, client = find_target(request, model)
    caller = caller_of(request)
    sent = {**data, "model": target.model} if target.model != model else body
    tenant = target.upstream.tenant(caller.owner)
    if tenant is not None:  # salted as a translated call is (design.md 11.6)
        asked = data.get("cache_salt")
        if asked is not None and not (isinstance(asked, str) and asked):
            raise InvalidRequest("'cache_salt' must be a non-empty string.", param="cache_salt")
        sent = {**data, "model": target.model, "cache_salt": cache_salt(asked, tenant)}
    session = None
    if client.keyed:
        key = chat_session(data, from_headers(request.headers, request.app[RUNTIME].config.requests.session_headers))
        session = None if key is None else Session(key)
    async with client.post(request.path, sent, caller.upstream_headers(), relayed=True, session=session) as exchange:
        upstream = exchange.response
        headers = {"Content-Type": upstream.headers.get("Content-Type", "application/json")}
        if hdrs.CONTENT_ENCODING in upstream.headers:  # the bytes go as they came: say how (design.md 6.10)
            headers[hdrs.CONTENT_ENCODING] = upstream.headers[hdrs.CONTENT_ENCODING]
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        # A session placed for its prefix: its usage says whether its replica held it (11.5).
        placed = session is not None and session.placed is not None and hdrs.CONTENT_ENCODING not in upstream.headers
        streamed = headers["Content-Type"].startswith("text/event-stream")
        usage = RelayedUsage(streamed, target.upstream.max_answer_bytes) if placed else None
        # A client that stops reading is let go as on /v1/responses (design.md 4.12); nothing is
        # added to bytes relayed as they came, keep-alives included.
        watch = ClientWatch(request, response, None, exchange.timeouts.client_idle, exchange.deadline)
        try:
            with cut_short_on_failure(request):
                while data := await exchange.read_chunk():
                    await watch.write(data)
                    if usage is not None:
                        usage.feed(data)
                await watch.write(b"", last=True)
        finally:
            watch.stop()
    if usage is not None and session is not None:
        client.answered(session, usage.usage())
    return response
