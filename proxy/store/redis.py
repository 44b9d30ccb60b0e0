"""The shared backend: Redis, so that a response created on one replica is readable and
chainable on every other. Records and items are keys that expire on their own; a sorted set of
response ids by age bounds how many are kept."""

from __future__ import annotations

from typing import cast

import msgspec
from redis.asyncio import Redis

from . import StoredResponse, decode_record, encode_record, record_items

# The surplus past the size bound goes in one trim every this many writes.
_TRIM_EVERY = 64


class _ItemEntry(msgspec.Struct):
    response_id: str
    item: msgspec.Raw


_encode_entry = msgspec.json.Encoder().encode
_decode_entry = msgspec.json.Decoder(_ItemEntry).decode


class RedisBackend:
    def __init__(self, url: str, prefix: str, ttl: float, max_responses: int, timeout: float) -> None:
        self._redis = Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._prefix = prefix
        self._ttl = max(1, round(ttl))
        self._max = max_responses
        self._writes = 0

    def _response_key(self, id: str) -> str:
        return f"{self._prefix}response:{id}"

    def _item_key(self, owner: str, id: str) -> str:
        return f"{self._prefix}item:{owner}:{id}"

    @property
    def _index(self) -> str:
        return f"{self._prefix}responses"

    async def put(self, record: StoredResponse) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:  # kept whole or not at all
            pipe.set(self._response_key(record.id), encode_record(record), ex=self._ttl)
            for item_id, item in record_items(record):
                entry = _encode_entry(_ItemEntry(record.id, msgspec.Raw(item)))
                pipe.set(self._item_key(record.owner, item_id), entry, ex=self._ttl)
            pipe.zadd(self._index, {record.id: record.created_at})
            await pipe.execute()
        self._writes += 1
        if self._writes % _TRIM_EVERY == 1:
            await self._trim()

    async def _trim(self) -> None:
        """The oldest responses past the size bound go, with their items."""
        surplus = await self._redis.zcard(self._index) - self._max
        if surplus > 0:
            for id, _ in cast("list[tuple[bytes, float]]", await self._redis.zpopmin(self._index, surplus)):
                await self._remove(id.decode(), None)

    async def get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        found = await self._redis.mget([self._response_key(id) for id in ids])
        records = [decode_record(data) for data in found if data is not None]
        return {record.id: record for record in records if record.owner == owner}

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        found = await self._redis.mget([self._item_key(owner, id) for id in ids])
        return {id: bytes(_decode_entry(data).item) for id, data in zip(ids, found, strict=True) if data is not None}

    async def delete(self, id: str, owner: str) -> bool:
        return await self._remove(id, owner)

    async def _remove(self, id: str, owner: str | None) -> bool:
        """Delete a response (only `owner`'s, when given) and the items that still name it."""
        data = await self._redis.get(self._response_key(id))
        record = None if data is None else decode_record(data)
        if record is None or (owner is not None and record.owner != owner):
            return False
        keys = [self._item_key(record.owner, item_id) for item_id, _ in record_items(record)]
        entries = await self._redis.mget(keys) if keys else []
        # An item id a later response repeated (a client's own input id) now names that one.
        mine = [key for key, entry in zip(keys, entries, strict=True) if entry is not None and _decode_entry(entry).response_id == id]
        await self._redis.delete(self._response_key(id), *mine)
        await self._redis.zrem(self._index, id)
        return True

    async def close(self) -> None:
        await self._redis.aclose()
