"""How a turn's Response is kept (design.md 9): its record (the form a Response is kept in), put in
the store, on its WebSocket connection (8.9) or nowhere, and added to the conversation it is made
in (9.7). A background run's record is its event log's to put, under its lease (10.2)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from ..background import Record
from ..errors import ProxyError
from ..responses import history
from ..responses.lifecycle import new_id
from ..store import ResponseStore, StoredResponse
from ..upstream.affinity import Session
from .conversations import Held
from .history import History

log = logging.getLogger("proxy")

# The responses one connection keeps for `previous_response_id`: an agent continues the last one;
# a few more cost little.
_ON_A_CONNECTION = 16


def record_of(owner: str, data: dict[str, Any], past: History, session: Session | None) -> Record:
    """A request's Response as it is kept: its input items encoded once, so that every copy of
    it kept while it runs (design.md 10.2) names them by the same ids."""
    input_items = msgspec.Raw(orjson.dumps(history.stored_input(data.get("input"), past.referenced, new_id)))

    def record(response: dict[str, Any]) -> StoredResponse:
        return StoredResponse(
            id=response["id"],
            owner=owner,
            created_at=response["created_at"],
            response=msgspec.Raw(orjson.dumps(response)),
            input_items=input_items,
            previous=None if past.previous is None else past.previous.id,
            referenced=list(past.referenced),
            session=None if session is None else session.key,
            replica=None if session is None else session.served_by,
        )

    return record


class Connection:
    """The Responses a WebSocket connection keeps, the last few, each whole with its chain's
    items: continued with `previous_response_id` on it even when not stored (design.md 8.9)."""

    def __init__(self) -> None:
        self.responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, kept: StoredResponse, chain: list[dict[str, Any]]) -> None:
        own = orjson.loads(bytes(kept.input_items))
        whole = msgspec.Raw(orjson.dumps([*chain, *own]))
        self.responses[kept.id] = msgspec.structs.replace(kept, input_items=whole, previous=None)
        self.responses.move_to_end(kept.id)
        while len(self.responses) > _ON_A_CONNECTION:
            self.responses.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Keeping:
    """Where a turn's finished Response goes before its last event leaves (design.md 9.2).
    `record`: None where it is kept nowhere; `put`: where its record goes (the store, a
    connection), None where nothing puts it or its run's log does (10.2)."""

    record: Record | None = None
    put: Callable[[StoredResponse], Awaitable[object]] | None = None
    conversation: Held | None = None  # the conversation it is added to, held until the turn ends (9.7)

    async def keep(self, response: dict[str, Any]) -> None:
        """The Response kept; a store or a conversation that does not take it is logged, and the
        Response goes out all the same."""
        if self.record is None:
            return
        kept = self.record(response)
        if self.put is not None:
            await self.put(kept)
        if self.conversation is not None:
            own = orjson.loads(bytes(kept.input_items))
            try:
                await self.conversation.append([*own, *response["output"]])
            except ProxyError as error:
                log.error("response %s was not added to its conversation: %s", kept.id, error.message)


def keeping_of(
    owner: str,
    data: dict[str, Any],
    past: History,
    session: Session | None,
    *,
    store: ResponseStore | None,
    background: bool,
    connection: Connection | None,
    conversation: Held | None,
) -> Keeping:
    """The one way a turn's Response is kept: in the store where it is stored (`store`; a
    background run's log puts it there, 10.2); else on its WebSocket connection, unless a
    conversation takes it; else nowhere but in its conversation, if any."""
    if store is None and connection is None and conversation is None:
        return Keeping()
    record = record_of(owner, data, past, session)
    if store is not None:
        return Keeping(record, None if background else store.save, conversation)
    if connection is None or conversation is not None:
        return Keeping(record, None, conversation)
    chain = past.chain

    async def on_connection(kept: StoredResponse) -> None:
        connection.put(kept, chain)

    return Keeping(record, on_connection, conversation)
