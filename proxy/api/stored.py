"""Stored responses over HTTP (design.md 9): reading a request's history from the store,
keeping its response, and GET / DELETE /v1/responses/{id} and its input_items."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
from aiohttp import web

from ..appkeys import OWNER, RUNTIME
from ..errors import InvalidRequest, NotFound
from ..responses import history
from ..responses.schema import CreateResponse
from ..responses.translate import new_id
from ..store import ResponseStore, StoredResponse


@dataclass(frozen=True, slots=True)
class History:
    """What a request's own input leans on: the chain before it and the items it references."""

    request: CreateResponse  # with its input expanded: the chain's items, then its own
    ancestors: list[str]  # for the record of its response
    referenced: dict[str, dict[str, Any]]


def store_of(request: web.Request) -> ResponseStore:
    store = request.app[RUNTIME].store
    if store is None:
        raise NotFound("This proxy keeps no responses (its config says store: none).")
    return store


async def read_history(request: web.Request, parsed: CreateResponse) -> History:
    """The request's input with what it refers to read from the store; an unknown previous
    response or reference is a 400 naming the field (design.md 9.4)."""
    previous_id, wanted = parsed.previous_response_id, history.references(parsed)
    if previous_id is None and not wanted:
        return History(parsed, [], {})
    store = request.app[RUNTIME].store
    if store is None:
        param = "previous_response_id" if previous_id else "input"
        raise InvalidRequest("This proxy keeps no responses (store: none): nothing to continue or refer to.", param=param)
    owner = request[OWNER]
    ancestors: list[str] = []
    records: list[StoredResponse] = []
    if previous_id is not None:
        previous = await store.get(previous_id, owner)
        if previous is None:
            raise InvalidRequest(f"No stored response with id '{previous_id}'.", param="previous_response_id")
        ancestors = [*previous.ancestors, previous.id]
        found = await store.get_many(previous.ancestors, owner) if previous.ancestors else {}
        missing = [id for id in previous.ancestors if id not in found]
        if missing:
            raise InvalidRequest(f"The response '{missing[-1]}' of this chain is no longer stored.", param="previous_response_id")
        records = [*(found[id] for id in previous.ancestors), previous]
    referenced = {id: orjson.loads(item) for id, item in (await store.items(wanted, owner) if wanted else {}).items()}
    chain = history.chain_items([(bytes(record.input_items), bytes(record.response)) for record in records])
    return History(history.expand(parsed, chain, referenced), ancestors, referenced)


def record_of(request: web.Request, data: dict[str, Any], past: History, response: dict[str, Any]) -> StoredResponse:
    """The record a finished response is kept as."""
    items = history.stored_input(data["input"], past.referenced, new_id)
    return StoredResponse(
        id=response["id"],
        owner=request[OWNER],
        created_at=response["created_at"],
        response=msgspec.Raw(orjson.dumps(response)),
        input_items=msgspec.Raw(orjson.dumps(items)),
        ancestors=past.ancestors,
    )


def _include(request: web.Request) -> list[str]:
    return [*request.query.getall("include[]", ()), *request.query.getall("include", ())]


async def _record(request: web.Request) -> StoredResponse:
    id = request.match_info["id"]
    record = await store_of(request).get(id, request[OWNER])
    if record is None:
        raise NotFound(f"No response with id '{id}'.", param="response_id")
    return record


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


async def retrieve(request: web.Request) -> web.Response:
    record = await _record(request)
    return _json(history.shown(bytes(record.response), _include(request)))


async def delete(request: web.Request) -> web.Response:
    id = request.match_info["id"]
    if not await store_of(request).delete(id, request[OWNER]):
        raise NotFound(f"No response with id '{id}'.", param="response_id")
    return _json({"id": id, "object": "response.deleted", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    record = await _record(request)
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be asc or desc.", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise InvalidRequest("'limit' must be an integer from 1 to 100.", param="limit")
    items = orjson.loads(bytes(record.input_items))
    return _json(history.page(items, order=order, after=query.get("after"), before=query.get("before"), limit=limit))
