"""A request's history (design.md 9.4, 9.7): the chain it continues, the conversation it is made
in and the items it refers to, read from the store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import InvalidRequest
from ..responses import history
from ..responses.schema import CreateResponse
from ..store import ResponseStore, StoredConversation, StoredResponse

# OpenAI's code for a previous response it does not know (design.md 9.4).
_NOT_FOUND = "previous_response_not_found"
# A request may refer to hundreds of thousands of items within the body's limit: more ids than
# one read binds (SQLite's variables) or should carry.
_ITEMS_PER_READ = 500


@dataclass(frozen=True, slots=True)
class History:
    """What a request's own input leans on: the chain before it and the items it references."""

    request: CreateResponse  # with its input expanded: the chain's items, then its own
    referenced: dict[str, dict[str, Any]]
    previous: StoredResponse | None = None  # the response it continues
    chain: list[dict[str, Any]] = field(default_factory=list)  # the chain's items, oldest first
    conversation: StoredConversation | None = None  # the conversation it is made in (design.md 9.7)


async def read_history(
    store: ResponseStore | None, owner: str, parsed: CreateResponse, kept: Mapping[str, StoredResponse] | None = None
) -> History:
    """The request's input with what it refers to read from the store, or from `kept` (the
    responses of a WebSocket connection, design.md 8.9); an unknown previous response or
    reference is a 400 naming the field (design.md 9.4)."""
    previous_id, wanted = parsed.previous_response_id, history.references(parsed)
    if parsed.conversation_id is not None:
        return await _conversation_history(store, owner, parsed, parsed.conversation_id, wanted)
    if previous_id is None and not wanted:
        return History(history.expand(parsed, [], {}), {})
    kept = kept or {}
    if store is None and (wanted or previous_id not in kept):
        param = "previous_response_id" if previous_id else "input"
        raise InvalidRequest(
            "This proxy keeps no responses (store: none): nothing to continue or refer to.", param=param
        )
    chain = [] if previous_id is None else await _chain(store, previous_id, owner, kept)
    referenced = await _referenced(store, wanted, owner)
    items = history.chain_items([(bytes(stored.input_items), bytes(stored.response)) for stored in chain])
    previous = chain[-1] if chain else None
    return History(history.expand(parsed, items, referenced), referenced, previous, items)


async def _chain(
    store: ResponseStore | None, id: str, owner: str, kept: Mapping[str, StoredResponse]
) -> list[StoredResponse]:
    """The chain that ends with the response `id`, oldest first: its links read from the store
    in one walk, back to its first response or to one the connection keeps, which holds its
    whole chain (design.md 8.9). An unknown previous response, or a link no longer stored, is a
    400 (design.md 9.4)."""
    chain, stopped = await store.chain(id, owner) if store is not None and id not in kept else ([], id)
    if stopped is not None and stopped in kept:
        chain, stopped = [kept[stopped], *chain], None
    if not chain:
        raise InvalidRequest(
            f"Previous response with id '{id}' not found.", param="previous_response_id", code=_NOT_FOUND
        )
    earlier = chain[0].ancestors if stopped is None else []
    if earlier and store is not None:  # a record written before links names its whole chain
        found = await store.get_many(earlier, owner)
        stopped = next((link for link in reversed(earlier) if link not in found), None)
        chain = [*(found[link] for link in earlier if link in found), *chain]
    if stopped is not None:
        raise InvalidRequest(
            f"The response '{stopped}' of this chain is no longer stored.",
            param="previous_response_id",
            code=_NOT_FOUND,
        )
    return chain


async def _conversation_history(
    store: ResponseStore | None, owner: str, parsed: CreateResponse, id: str, wanted: list[str]
) -> History:
    """A request made with `conversation`: the conversation's items before its own input."""
    if store is None:
        raise InvalidRequest("This proxy keeps no conversations (store: none).", param="conversation")
    found = await store.conversation(id, owner)
    if found is None:
        raise InvalidRequest(f"Conversation with id '{id}' not found.", param="conversation")
    referenced = await _referenced(store, wanted, owner)
    items = [orjson.loads(bytes(item)) for item in found.items]
    return History(history.expand(parsed, items, referenced), referenced, None, items, found)


async def _referenced(store: ResponseStore | None, wanted: list[str], owner: str) -> dict[str, dict[str, Any]]:
    """The stored items the request's `item_reference`s name, by id (design.md 9.4): each id
    once, read `_ITEMS_PER_READ` at a time, up to the first read that lacks one (the request is
    a 400 naming it then, whatever the others name)."""
    if store is None:  # then nothing is: `read_history` refused the request
        return {}
    found: dict[str, bytes] = {}
    distinct = list(dict.fromkeys(wanted))
    for start in range(0, len(distinct), _ITEMS_PER_READ):
        read = distinct[start : start + _ITEMS_PER_READ]
        found |= await store.items(read, owner)
        if len(found) < start + len(read):
            break
    return {id: orjson.loads(item) for id, item in found.items()}
