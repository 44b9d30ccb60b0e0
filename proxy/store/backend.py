"""What a store backend is (design.md 9.6): five small protocols, records, an event log,
leases, conversations and files, over the types they exchange. A backend implements the five and
nothing else: time limits, failures, the wait for new events and the hand-off of events within
one process are `ResponseStore`'s, the same for every backend."""

from __future__ import annotations

from typing import Protocol

import msgspec


class StoredResponse(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """One response as kept: the Response object and its own input items as JSON, whose key
    created it, and the response it continues: a chain is its links, each record of a size of
    its own whatever the chain's length, read in one round trip (`Records.chain`, design.md
    9.4)."""

    # The first three fields, in this order, are where Redis's chain walk reads a record's
    # owner and link without decoding the rest (`redis._CHAIN`); a link of none is left out.
    id: str
    owner: str
    previous: str | None = None
    created_at: int
    response: msgspec.Raw
    input_items: msgspec.Raw
    # A record written before links named every earlier response of its chain here, oldest
    # first; it is still read so (design.md 9.4), and none is written now.
    ancestors: list[str] = []
    # Input items that were `item_reference`s: they stay the items of the responses that made
    # them, so that this one's end (deleted, expired) leaves them referable (design.md 9.4).
    referenced: list[str] = []
    # The session it belongs to and the replica that served it: a turn chained on it goes
    # there, where its prefix is cached (design.md 11.1).
    session: str | None = None
    replica: str | None = None


encode_stored = msgspec.json.Encoder().encode
decode_stored = msgspec.json.Decoder(StoredResponse).decode


class StoredConversation(msgspec.Struct, gc=False):
    """A conversation as kept (design.md 9.7): whose key made it, its metadata, and its items
    in order, each the JSON of an item with its id."""

    id: str
    owner: str
    created_at: int
    metadata: dict[str, str] = {}
    items: list[msgspec.Raw] = []


encode_conversation = msgspec.json.Encoder().encode
decode_conversation = msgspec.json.Decoder(StoredConversation).decode


class StoredFile(msgspec.Struct, gc=False, kw_only=True):
    """A file the Files API keeps (design.md 8.16): whose key uploaded it and what it is; its
    bytes are kept apart, read only when a request or a download asks for them."""

    id: str
    owner: str
    created_at: int
    filename: str
    bytes: int
    purpose: str


encode_file = msgspec.json.Encoder().encode
decode_file = msgspec.json.Decoder(StoredFile).decode


class _ItemId(msgspec.Struct):
    id: str | None = None


class _Output(msgspec.Struct):
    output: list[msgspec.Raw]


_item_id = msgspec.json.Decoder(_ItemId).decode
_raw_items = msgspec.json.Decoder(list[msgspec.Raw]).decode
_output = msgspec.json.Decoder(_Output).decode


def referable_items(stored: StoredResponse) -> list[tuple[str, bytes]]:
    """(id, JSON) of every item of the response, input and output, that `item_reference` can
    name: each item's bytes read twice (its place, then its id), the scores in them most of it."""
    found = []
    for item in (*_raw_items(stored.input_items), *_output(stored.response).output):
        id = _item_id(item).id
        if id and id not in stored.referenced:
            found.append((id, bytes(item)))
    return found


class Runs(msgspec.Struct, frozen=True):
    """A number of runs that hold a live lease (found, or the most allowed): in all, and one
    owner's."""

    total: int
    mine: int


class Claim(msgspec.Struct, frozen=True):
    taken: bool  # the lease is the claimant's now
    running: Runs  # the runs found holding a live lease, before this one


class Renewal(msgspec.Struct, frozen=True):
    held: bool  # the lease is still the holder's
    cancel: bool  # a client asked the run to stop


Event = tuple[int, bytes]  # a background response's event: its sequence number, its bytes


class Fenced(Exception):
    """A write of a background run whose lease is no longer the writer's (another replica took
    the run over, design.md 10.4): refused, nothing of it kept."""


class Records(Protocol):
    """Stored responses and their items. A response is kept whole or not at all; what expired
    (`ttl`) is never answered, even before a sweep drops it."""

    async def put(self, stored: StoredResponse, items: bool, fence: str | None) -> None:
        """Keep a response, replacing what was kept under its id; with `items`, its items
        (`referable_items`) too, each under the owner and its id (a later response's item of
        the same id takes its place). With `fence` (a run's lease token), only while that token
        holds the run's lease, checked in the same step as the write; else `Fenced`."""
        ...

    async def get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        """The responses of these ids that are kept and belong to `owner`."""
        ...

    async def chain(self, id: str, owner: str) -> tuple[list[StoredResponse], str | None]:
        """The owner's response `id` and the responses before it, each its `previous`, oldest
        first, in one round trip; with the id of the link where the walk stopped because it is
        not kept (or not the owner's): `id` itself when nothing was read, None when the walk
        reached the chain's first response."""
        ...

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        """Items of `owner`'s stored responses, by id."""
        ...

    async def recent(self, owner: str, after: str | None, limit: int) -> list[StoredResponse] | None:
        """The owner's responses, newest first (by creation, then id): up to `limit` of those
        after the response `after`; None when `after` names none of the owner's."""
        ...

    async def delete(self, id: str, owner: str) -> bool:
        """Forget `owner`'s response, its items (those no later response took) and its events;
        whether there was one."""
        ...

    async def sweep(self) -> None:
        """Drop what expired, and each owner's oldest responses past the size bound (a backend may
        drop those at its writes, and expire keys itself: then a sweep has nothing to do)."""
        ...


class EventLog(Protocol):
    """A background response's events, by sequence number, readable from every replica."""

    async def append(self, id: str, events: list[Event], fence: str) -> None:
        """Add a batch, whole or not at all, while `fence` holds the run's lease (else
        `Fenced`, checked in the same step). An event kept already with the same bytes stays (a
        batch whose answer was lost goes again); one kept with other bytes refuses the whole
        batch, by raising."""
        ...

    async def read(self, id: str, after: int, wait: float) -> list[Event]:
        """The events past sequence number `after`, in order. A backend that another process's
        append can wake (Redis) may wait up to `wait` seconds for one; one that cannot (SQLite)
        answers at once, and is asked again."""
        ...


class Leases(Protocol):
    """Who runs each background response (design.md 10.4, 10.5). Times are the wall clock's."""

    async def claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> Claim:
        """`holder` runs the response for `lease` seconds unless renewed, if fewer runs than
        `caps` hold a live lease; else nothing is taken. One step, so that requests arriving
        together cannot pass a cap. `holder` is the lease's fencing token: unique to this claim,
        and each takeover brings its own, so that a holder that was taken for dead and comes
        back has every write refused (`Fenced`)."""
        ...

    async def renew(self, id: str, holder: str, lease: float) -> Renewal: ...

    async def release(self, id: str, holder: str) -> None:
        """The run ended: its lease and its cancel flag go, if `holder` still holds it."""
        ...

    async def cancel(self, id: str) -> None:
        """Raise the run's cancel flag, if a run holds a lease (else nothing is made)."""
        ...

    async def take(self, id: str, holder: str, lease: float) -> bool:
        """Take over a run whose lease expired; whether `holder` now holds it (one replica
        wins)."""
        ...

    async def expired(self) -> list[tuple[str, str]]:
        """The runs whose lease expired: (response id, owner)."""
        ...


class Conversations(Protocol):
    """Conversations, each kept whole (design.md 9.7), and the hold that lets one writer at a
    time change one."""

    async def conversation(self, id: str, owner: str) -> StoredConversation | None:
        """The owner's conversation; what expired is never answered."""
        ...

    async def keep_conversation(self, conversation: StoredConversation) -> None:
        """Write it whole, its time to live started again; its hold stays as it is."""
        ...

    async def forget_conversation(self, id: str, owner: str) -> bool:
        """Whether the owner's conversation was there to delete."""
        ...

    async def hold(self, id: str, owner: str, holder: str, seconds: float) -> bool:
        """Take the hold of `owner`'s conversation for `seconds`: when no one holds it, its
        holder's hold ran out, or `holder` has it already (then it runs `seconds` from now); one
        holder wins. Another owner's, or none, takes nothing (checked in the same step)."""
        ...

    async def let_go(self, id: str, holder: str) -> None:
        """Give the hold back, if `holder` still has it."""
        ...


class Files(Protocol):
    """The Files API's files (design.md 8.16), each owner's bounded; kept until deleted."""

    async def put_file(self, file: StoredFile, content: bytes, max_files: int, max_bytes: int) -> str | None:
        """Keep a file and its bytes unless its owner's files would then be more than `max_files`,
        or hold more than `max_bytes` together, checked in the same step as the write: None when
        it was kept, else the bound it would pass (`files`, `bytes`)."""
        ...

    async def file(self, id: str, owner: str) -> StoredFile | None: ...

    async def file_content(self, id: str, owner: str) -> bytes | None: ...

    async def files(self, owner: str) -> list[StoredFile]:
        """Every file of the owner's (at most its bound), in no order."""
        ...

    async def forget_file(self, id: str, owner: str) -> bool:
        """Whether the owner's file was there to delete (its bytes go with it)."""
        ...


class Backend(Records, EventLog, Leases, Conversations, Files, Protocol):
    async def close(self) -> None: ...
