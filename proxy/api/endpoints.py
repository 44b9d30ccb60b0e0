"""Operational endpoints: health, readiness, metrics, the model list."""

from __future__ import annotations

import orjson
from aiohttp import web

from ..appkeys import RUNTIME
from ..errors import UpstreamProtocolError
from .common import json_response


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def ready(request: web.Request) -> web.Response:
    """503 while draining or while a route has no healthy replica, so traffic goes elsewhere.
    A failing response store shows in the body but keeps the 200: answers still stream without
    it, and a store shared by every replica would otherwise take them all out at once
    (design.md 9.1)."""
    runtime = request.app[RUNTIME]
    ok = runtime.ready()
    store = None if runtime.store is None else runtime.store.health()
    return json_response({"ready": ok, "store": store}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[RUNTIME].metrics.render(), content_type="text/plain", charset="utf-8")


async def models(request: web.Request) -> web.Response:
    """With routes: the models they serve (exact names and patterns); without: the upstream's list."""
    runtime = request.app[RUNTIME]
    config = runtime.config
    if config.routes:
        data = [{"id": route.model, "object": "model", "owned_by": route.upstream} for route in config.routes]
        return json_response({"object": "list", "data": data})
    status, body = await runtime.clients[config.upstreams[0].name].get("/v1/models")
    try:
        listed = orjson.loads(body) if status == 200 else None
    except orjson.JSONDecodeError:
        listed = None
    if not isinstance(listed, dict):  # an HTML error page, say: never relayed as JSON
        raise UpstreamProtocolError(
            f"upstream {config.upstreams[0].name} answered /v1/models with {status}: {body[:200]!r}"
        )
    return json_response(orjson.Fragment(body))
