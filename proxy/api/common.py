"""What a request names, found (the upstream for its model, the store, a stored response of
its key), and JSON answers, built one way."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..appkeys import MODEL_PATTERN, OWNER, REQUEST_ID, RUNTIME
from ..config import Target, served_models
from ..errors import NotFound, ServerShuttingDown
from ..store import ResponseStore, StoredResponse
from ..upstream.client import UpstreamClient


def find_target(request: web.Request, model: str) -> tuple[Target, UpstreamClient]:
    runtime = request.app[RUNTIME]
    if runtime.draining:  # new generations go to a replica that stays (design.md 5.10)
        raise ServerShuttingDown("The proxy is shutting down; retry on another replica.")
    found = runtime.target(model)
    if found is None:
        served = ", ".join(served_models(runtime.config))
        raise NotFound(
            f"The model '{model}' is not served here. Served: {served}.", param="model", code="model_not_found"
        )
    request[MODEL_PATTERN] = found[0].pattern
    return found


def upstream_headers(request: web.Request) -> dict[str, str]:
    return {"X-Request-ID": request[REQUEST_ID]}


def store_of(request: web.Request) -> ResponseStore:
    store = request.app[RUNTIME].store
    if store is None:
        raise NotFound("This proxy keeps no responses (its config says store: none).")
    return store


async def find_stored(request: web.Request, id: str) -> StoredResponse:
    """A stored response of the request's key; anyone else's is as unknown (design.md 9.5)."""
    stored = await store_of(request).get(id, request[OWNER])
    if stored is None:
        raise NotFound(f"No response with id '{id}'.", param="response_id")
    return stored


def json_response(data: Any, status: int = 200) -> web.Response:
    """Every JSON answer, errors included; bytes that are JSON already go as `orjson.Fragment`."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
