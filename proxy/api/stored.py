"""Stored responses over HTTP (design.md 9): reading a request's history from the store,
keeping its response, and GET / DELETE /v1/responses/{id} and its input_items."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..appkeys import OWNER
from ..errors import InvalidRequest, NotFound
from ..responses import history
from ..responses.lifecycle import running
from . import background
from .common import find_stored, json_response, store_of


def _include(request: web.Request) -> list[str]:
    return [*request.query.getall("include[]", ()), *request.query.getall("include", ())]


async def retrieve(request: web.Request) -> web.StreamResponse:
    """The response as it stands, or (`stream=true`, a background response) its events past
    `starting_after`, then the live ones (design.md 10.2)."""
    id = request.match_info["id"]
    stored = await find_stored(request, id)
    response = await background.current(
        background.runs_of(request), request[OWNER], orjson.loads(bytes(stored.response))
    )
    if request.query.get("stream", "false").lower() != "true":
        return json_response(history.shown(response, _include(request)))
    if not response.get("background"):
        raise InvalidRequest("Only background responses keep their events to stream again.", param="stream")
    try:
        after: int | None = int(request.query.get("starting_after", "-1"))
    except ValueError:
        after = None
    if after is None or not -1 <= after < 2**63:  # the stores keep sequence numbers in 64 bits
        raise InvalidRequest(
            "'starting_after' must be an event's sequence number (or -1, for all).", param="starting_after"
        )
    return await background.follow(request, id, after)


async def delete(request: web.Request) -> web.Response:
    """A running background response is cancelled first (design.md 9.3): its run would keep
    the response it makes, again, after it was forgotten."""
    id = request.match_info["id"]
    stored = await find_stored(request, id)
    runs, owner = background.runs_of(request), request[OWNER]
    response = await background.current(runs, owner, orjson.loads(bytes(stored.response)))
    if running(response) and await background.cancel_and_wait(runs, owner, response) is None:
        raise InvalidRequest(
            "The response is still running: it was asked to stop; delete it once it has.", param="response_id"
        )
    if not await store_of(request).delete(id, request[OWNER]):
        raise NotFound(f"No response with id '{id}'.", param="response_id")
    return json_response({"id": id, "object": "response.deleted", "deleted": True})


async def listed(request: web.Request) -> web.Response:
    """GET /v1/responses, an extension (OpenAI lists no responses): the key's stored responses,
    newest first, paged by `after` (a response id) and `limit` (design.md 9.3)."""
    limit, after = _limit(request), request.query.get("after")
    found = await store_of(request).recent(request[OWNER], after, limit + 1)
    if found is None:
        raise InvalidRequest(f"No response with id '{after}'.", param="after")
    include = _include(request)
    data = [history.shown(orjson.loads(bytes(stored.response)), include) for stored in found[:limit]]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(found) > limit,
        }
    )


def _limit(request: web.Request) -> int:
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise InvalidRequest("'limit' must be an integer from 1 to 100.", param="limit")
    return limit


async def input_items(request: web.Request) -> web.Response:
    stored = await find_stored(request, request.match_info["id"])
    return items_page(request, orjson.loads(bytes(stored.input_items)))


def items_page(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    """The page of `items` the query asks for (`order`, `after`, `before`, `limit`): a stored
    response's input items, a conversation's (design.md 9.3, 9.7)."""
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be asc or desc.", param="order")
    limit = _limit(request)
    return json_response(
        history.page(items, order=order, after=query.get("after"), before=query.get("before"), limit=limit)
    )
