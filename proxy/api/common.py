"""What a request names, found (the upstream for its model, its caller, the store, a stored
response of its key), its turn planned, and JSON answers, built one way."""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from ..appkeys import MODEL_PATTERN, OWNER, REQUEST_ID, RUNTIME
from ..config import Target
from ..errors import NotFound
from ..responses.session import from_headers
from ..sink import Client
from ..store import ResponseStore, StoredResponse
from ..turns.keeping import Connection
from ..turns.rounds import Asks
from ..turns.turn import Caller, Turn, plan_turn, route, routed
from ..upstream.client import UpstreamClient


def find_target(request: web.Request, model: str) -> tuple[Target, UpstreamClient]:
    found = route(request.app[RUNTIME], model)
    request[MODEL_PATTERN] = found[0].pattern
    return found


def caller_of(request: web.Request, started: float | None = None) -> Caller:
    """The request as the turn layer knows its caller (design.md 2.3): its session header read
    here, by aiohttp's case-insensitive headers (11.1); `started`: when it came, else now."""
    session = from_headers(request.headers, request.app[RUNTIME].config.requests.session_headers)
    started = time.monotonic() if started is None else started
    return Caller(request[OWNER], request[REQUEST_ID], session, started, f"{request.method} {request.path}")


async def plan(
    request: web.Request,
    data: Any,
    asks: Asks = Asks.RESPONSE,
    connection: Connection | None = None,
    started: float | None = None,
) -> Turn:
    """A Responses call planned by the turn layer (`plan_turn`), its route a metrics label from
    the moment it is known."""
    runtime = request.app[RUNTIME]
    call = routed(runtime, data)
    request[MODEL_PATTERN] = call.target.pattern
    return await plan_turn(runtime, caller_of(request, started), call, asks, connection)


def store_of(request: web.Request) -> ResponseStore:
    store = request.app[RUNTIME].store
    if store is None:
        raise NotFound("This proxy keeps no responses (its config says store: none).")
    return store


async def find_stored(request: web.Request, id: str) -> StoredResponse:
    """A stored response of the request's key; anyone else's is as unknown (design.md 9.5)."""
    return await stored_of(store_of(request), request[OWNER], id)


async def stored_of(store: ResponseStore, owner: str, id: str) -> StoredResponse:
    stored = await store.get(id, owner)
    if stored is None:
        raise NotFound(f"No response with id '{id}'.", param="response_id")
    return stored


class Whole:
    """A turn's sink where its Response is sent whole, as JSON: nothing is sent until it
    ends, its status with it (a failure of its first round is then an HTTP status)."""

    client = Client.GONE

    async def opened(self, deadline: float | None) -> None:
        pass

    async def write(self, events: bytes) -> None:
        pass


def json_response(data: Any, status: int = 200) -> web.Response:
    """Every JSON answer, errors included; bytes that are JSON already go as `orjson.Fragment`."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
