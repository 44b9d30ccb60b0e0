"""Operational endpoints: health, readiness, metrics, the model list."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from .. import __version__
from ..appkeys import RUNTIME
from ..config import Route, Target, resolve
from ..errors import UpstreamProtocolError
from ..metrics import CONTENT_TYPE
from .common import json_response


async def health(request: web.Request) -> web.Response:
    """200 while the process is up, with the version it runs (design.md 12.2)."""
    return json_response({"status": "ok", "version": __version__})


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
    """Prometheus text, its version named: a scraper picks its parser by the content type
    (design.md 12.2)."""
    return web.Response(body=request.app[RUNTIME].metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    """With routes: the models they serve (exact names and patterns); without: the upstream's
    list. Codex asks with its `client_version`, and reads its own shape: the routes' model cards
    (design.md 8.11)."""
    runtime = request.app[RUNTIME]
    config = runtime.config
    if "client_version" in request.query:
        cards = [_card(route, resolve(config, route.model)) for route in config.routes if route.codex is not None]
        return json_response({"models": cards})
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


def _card(route: Route, target: Target | None) -> dict[str, Any]:
    """A route's model as Codex's `ModelInfo` reads it: every field it requires, the rest what
    Codex assumes of a model it does not know (its shell tool, truncation), so that only the
    context window, reasoning levels and instructions change what it sends."""
    card, window = route.codex, target.upstream.context_window if target is not None else None
    assert card is not None
    levels = [{"effort": effort, "description": effort} for effort in card.reasoning_levels]
    model: dict[str, Any] = {
        "slug": route.model,
        "display_name": route.model,
        "default_reasoning_level": card.default_reasoning_level,
        "supported_reasoning_levels": levels,
        "shell_type": "unified_exec",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 0,
        "base_instructions": card.base_instructions,
        "supports_reasoning_summaries": True,  # the reasoning, word for word (design.md 8.5)
        "support_verbosity": False,
        "truncation_policy": {"mode": "bytes", "limit": 10000},
        "supports_parallel_tool_calls": True,
        "experimental_supported_tools": [],
    }
    return model if window is None else {**model, "context_window": window}
