"""The Conversations API on the response store (design.md 9.7): a conversation and its items,
owned by the API key like responses, and written by one writer at a time (the hold,
`turns.conversations`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import orjson
from aiohttp import web

from ..appkeys import OWNER, RUNTIME
from ..errors import InvalidRequest, NotFound
from ..responses import history
from ..responses.body import load_json
from ..responses.lifecycle import new_id
from ..responses.schema import parse_items, parse_metadata
from ..store import StoredConversation
from ..turns.conversations import Held, hold
from .body import read_body
from .common import json_response, store_of
from .stored import items_page

_MAX_ITEMS = 20  # a request adds at most this many items, as OpenAI's API allows


@contextlib.asynccontextmanager
async def _changing(request: web.Request) -> AsyncIterator[tuple[Held, StoredConversation]]:
    """The conversation as it is once held, for one change."""
    lease = request.app[RUNTIME].config.store.conversation_lease
    held = await hold(store_of(request), request.match_info["id"], request[OWNER], lease)
    try:
        yield held, await _found(request)
    finally:
        await held.release()


def _shown(conversation: StoredConversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": conversation.created_at,
        "metadata": conversation.metadata,
    }


async def _body(request: web.Request) -> dict[str, Any]:
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


def _metadata(data: dict[str, Any]) -> dict[str, str]:
    return parse_metadata(data.get("metadata"))


def _new_items(data: dict[str, Any], required: bool) -> list[dict[str, Any]]:
    """The request's `items`, checked as input items are, each with an id."""
    items = data.get("items")
    if not required and not items:
        return []
    if not isinstance(items, list) or not 0 < len(items) <= _MAX_ITEMS:
        raise InvalidRequest(f"'items' is a list of 1 to {_MAX_ITEMS} input items.", param="items")
    parse_items(items, "items")  # what is wrong names the item
    return history.stored_input(items, {}, new_id)


def _found_item(conversation: StoredConversation, item_id: str) -> int:
    for index, item in enumerate(conversation.items):
        if orjson.loads(bytes(item)).get("id") == item_id:
            return index
    raise NotFound(f"No item with id '{item_id}' in conversation '{conversation.id}'.", param="item_id")


async def _found(request: web.Request) -> StoredConversation:
    id = request.match_info["id"]
    found = await store_of(request).conversation(id, request[OWNER])
    if found is None:
        raise NotFound(f"No conversation with id '{id}'.", param="conversation_id")
    return found


async def create(request: web.Request) -> web.Response:
    data = await _body(request)
    metadata, items = _metadata(data), _new_items(data, required=False)
    conversation = StoredConversation(
        new_id("conv"), request[OWNER], int(time.time()), metadata, [msgspec.Raw(orjson.dumps(i)) for i in items]
    )
    await store_of(request).keep_conversation(conversation)
    return json_response(_shown(conversation))


async def retrieve(request: web.Request) -> web.Response:
    return json_response(_shown(await _found(request)))


async def update(request: web.Request) -> web.Response:
    data = await _body(request)
    metadata = _metadata(data)
    async with _changing(request) as (_, found):
        changed = msgspec.structs.replace(found, metadata=metadata)
        await store_of(request).keep_conversation(changed)
    return json_response(_shown(changed))


async def delete(request: web.Request) -> web.Response:
    async with _changing(request) as (held, _):
        await store_of(request).forget_conversation(held.id, request[OWNER])
    return json_response({"id": held.id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: web.Request) -> web.Response:
    found = await _found(request)
    return items_page(request, [history.with_status(orjson.loads(bytes(item))) for item in found.items])


async def add_items(request: web.Request) -> web.Response:
    items = _new_items(await _body(request), required=True)
    async with _changing(request) as (held, _):
        await held.append(items)
    return json_response(
        {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"], "has_more": False}
    )


async def retrieve_item(request: web.Request) -> web.Response:
    found = await _found(request)
    item = found.items[_found_item(found, request.match_info["item_id"])]
    return json_response(history.with_status(orjson.loads(bytes(item))))


async def delete_item(request: web.Request) -> web.Response:
    async with _changing(request) as (_, found):
        index = _found_item(found, request.match_info["item_id"])
        changed = msgspec.structs.replace(found, items=[*found.items[:index], *found.items[index + 1 :]])
        await store_of(request).keep_conversation(changed)
    return json_response(_shown(changed))
