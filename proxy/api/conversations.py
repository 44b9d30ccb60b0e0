"""The Conversations API on the response store (design.md 9.7): a conversation and its items,
owned by the API key like responses, and written by one writer at a time (the hold); a response
made with `conversation` reads its items as history and adds its input and output to it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import orjson
from aiohttp import web

from ..appkeys import OWNER, RUNTIME
from ..errors import Conflict, InvalidRequest, NotFound, StoreUnavailable
from ..responses import history
from ..responses.body import load_json
from ..responses.lifecycle import new_id
from ..responses.schema import parse_items, parse_metadata
from ..store import ResponseStore, StoredConversation
from .body import read_body
from .common import json_response, store_of
from .stored import items_page

_MAX_ITEMS = 20  # a request adds at most this many items, as OpenAI's API allows


class Held:
    """A conversation its holder may write to, until `release`. The hold is a lease
    (`store.conversation_lease`) renewed every third of it while held, so that one whose process
    died lets its conversation go within a lease (design.md 9.7)."""

    def __init__(self, store: ResponseStore, id: str, owner: str, holder: str, lease: float) -> None:
        self._store, self.id, self._owner, self._holder, self._lease = store, id, owner, holder, lease
        self._renewing = asyncio.create_task(self._renew())
        self._released = False

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            with contextlib.suppress(StoreUnavailable):  # counted and logged; it may yet be renewed in time
                await self._store.hold(self.id, self._owner, self._holder, self._lease)

    async def append(self, items: list[dict[str, Any]]) -> None:
        """Add items to the conversation as it is now; taken again if the hold ran out."""
        if not await self._store.hold(self.id, self._owner, self._holder, self._lease):
            raise Conflict(f"The conversation '{self.id}' is held by another writer.", param="conversation")
        found = await self._store.conversation(self.id, self._owner)
        if found is None:
            raise NotFound(f"No conversation with id '{self.id}'.", param="conversation")
        added = [msgspec.Raw(orjson.dumps(item)) for item in items]
        await self._store.keep_conversation(msgspec.structs.replace(found, items=[*found.items, *added]))

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self._renewing.cancel()
            with contextlib.suppress(Exception):  # a store down: the hold runs out on its own
                await self._store.let_go(self.id, self._holder)


async def hold(request: web.Request, id: str) -> Held:
    """The conversation held for its caller: a 409 while another writer has it, a 404 for none
    of the key's. Only its owner can hold it: another key's attempt takes nothing (9.5)."""
    store, owner = store_of(request), request[OWNER]
    holder = new_id("hold")
    lease = request.app[RUNTIME].config.store.conversation_lease
    if not await store.hold(id, owner, holder, lease):
        if await store.conversation(id, owner) is None:
            raise NotFound(f"No conversation with id '{id}'.", param="conversation_id")
        raise Conflict(
            f"The conversation '{id}' is being written to (a response on it is in progress); try again when it ends.",
            param="conversation",
        )
    return Held(store, id, owner, holder, lease)


@contextlib.asynccontextmanager
async def _changing(request: web.Request) -> AsyncIterator[tuple[Held, StoredConversation]]:
    """The conversation as it is once held, for one change."""
    held = await hold(request, request.match_info["id"])
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
    return items_page(request, [orjson.loads(bytes(item)) for item in found.items])


async def add_items(request: web.Request) -> web.Response:
    items = _new_items(await _body(request), required=True)
    async with _changing(request) as (held, _):
        await held.append(items)
    return json_response(
        {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"], "has_more": False}
    )


async def retrieve_item(request: web.Request) -> web.Response:
    found = await _found(request)
    return json_response(orjson.loads(bytes(found.items[_found_item(found, request.match_info["item_id"])])))


async def delete_item(request: web.Request) -> web.Response:
    async with _changing(request) as (_, found):
        index = _found_item(found, request.match_info["item_id"])
        changed = msgspec.structs.replace(found, items=[*found.items[:index], *found.items[index + 1 :]])
        await store_of(request).keep_conversation(changed)
    return json_response(_shown(changed))
