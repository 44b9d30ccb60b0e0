"""What a request names, found (the upstream for its model, the store, a stored response of
its key), and JSON answers, built one way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from ..appkeys import MODEL_PATTERN, OWNER, REQUEST_ID, RUNTIME
from ..config import Target
from ..errors import NotFound
from ..store import ResponseStore, StoredResponse
from ..turns.turn import Caller, Turn, plan_turn, route, routed
from ..upstream.client import UpstreamClient


def find_target(request: web.Request, model: str) -> tuple[Target, UpstreamClient]:
    found = route(request.app[RUNTIME], model)
    request[MODEL_PATTERN] = found[0].pattern
    return found


def caller_of(request: web.Request) -> Caller:
    """The request as the turn layer knows its caller (design.md 2.3)."""
    return Caller(request[OWNER], request[REQUEST_ID], request.headers)


async def plan(
    request: web.Request,
    data: Any,
    kept: Mapping[str, StoredResponse] | None = None,
    keep_here: Callable[[StoredResponse], None] | None = None,
    *,
    writes: bool = True,
    runs: bool = True,
) -> Turn:
    """A Responses call planned by the turn layer (`plan_turn`), its route a metrics label from
    the moment it is known."""
    runtime = request.app[RUNTIME]
    call = routed(runtime, data)
    request[MODEL_PATTERN] = call.target.pattern
    return await plan_turn(runtime, caller_of(request), call, kept, keep_here, writes=writes, runs=runs)


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
