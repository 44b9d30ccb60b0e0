"""Endpoints that answer without translation."""

from __future__ import annotations

from aiohttp import web

from ..appkeys import CLIENTS, CONFIG


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def models(request: web.Request) -> web.Response:
    """The upstream's model list (the first upstream's, when no routes name models)."""
    config = request.app[CONFIG]
    client = request.app[CLIENTS][config.upstreams[0].name]
    status, body = await client.get("/v1/models")
    return web.Response(status=status, body=body, content_type="application/json")
