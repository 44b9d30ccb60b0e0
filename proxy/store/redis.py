"""The shared backend: Redis, so that a response created on one replica is readable and
chainable on every other. Records and items are keys that expire on their own; a sorted set of
response ids by age bounds how many are kept."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import msgspec
import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import ResponseError

from .backend import (
    Claim,
    Event,
    Fenced,
    Renewal,
    Runs,
    StoredConversation,
    StoredResponse,
    decode_conversation,
    decode_stored,
    encode_conversation,
    encode_stored,
    referable_items,
)

log = logging.getLogger("proxy.store")
T = TypeVar("T")
# The sentinels' addresses, the service they watch, its database, its user and password.
Sentinels = tuple[list[tuple[str, int]], str, int, str | None, str | None]
# The longest a call's routing waits on the session map: a Redis answers in a millisecond when
# well, and a call is routed by its hash alone when not.
_ROUTING_WAIT = 0.25
_RETRY = 5.0  # seconds a failing session map is left alone

# A run's lease lives in a sorted set (score: when it ends) and its owner, holder and cancel flag
# in a hash; claiming within the caps, renewing and taking over read and write them in one step.
# The claim reads every running run's hash by its name: one Redis server, not a cluster.
_CLAIM = """
local running = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[2], '+inf')
local mine = 0
for _, id in ipairs(running) do
  if redis.call('HGET', ARGV[9] .. id, 'owner') == ARGV[4] then
    mine = mine + 1
  end
end
if #running >= tonumber(ARGV[7]) or mine >= tonumber(ARGV[8]) then
  return {0, #running, mine}
end
redis.call('HSET', KEYS[2], 'owner', ARGV[4], 'holder', ARGV[5], 'cancel', '0')
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return {1, #running, mine}
"""
_RENEW = """
local held = 0
if redis.call('HGET', KEYS[2], 'holder') == ARGV[2] then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
  held = 1
end
return {held, redis.call('HGET', KEYS[2], 'cancel') == '1' and 1 or 0}
"""
_TAKE = """
local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if lease_end and tonumber(lease_end) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('HSET', KEYS[2], 'holder', ARGV[4])
  return 1
end
return 0
"""
# A write of a background run goes only while its lease (KEYS[1], the run's hash) is held by the
# fencing token ARGV[1], checked in the script that writes (design.md 10.4); '' for a write of no
# run. Every fenced script begins with it, its own keys and arguments after those two.
_FENCE = """
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then
  return redis.error_reply('FENCED')
end
"""
# Writes of several keys go as one script: kept whole or not at all, and at half the proxy's CPU of
# a pipeline in a transaction. A record (KEYS[2], ARGV[2]) and its items (KEYS[5...], ARGV[6...]),
# each with the time to live ARGV[3], and its id (ARGV[5]) by age (ARGV[4]) in the index of all
# (KEYS[3]) and in its owner's (KEYS[4], which lives as long as the owner's newest):
_PUT = (
    _FENCE
    + """
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
for i = 5, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 1], 'EX', ARGV[3])
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[5])
redis.call('EXPIRE', KEYS[4], ARGV[3])
-- Ids made longer ago than records live have expired with their records: out of the indexes.
local expired = '(' .. (tonumber(ARGV[4]) - tonumber(ARGV[3]))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', expired)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', expired)
"""
)
# A chain read in one step (design.md 9.4): from the response ARGV[1] back along each record's
# link, while each is kept and its owner is ARGV[2]; the records (keys ARGV[3] .. id), newest
# first, after the id of the link where the walk stopped ('' when it reached the chain's first
# response). The owner and the link are read where `encode_stored` writes them, first in the
# record: a link costs the one GET of the record the walk returns anyway, where a key of its own
# would be a second read a link, and a second key to write, expire and delete with each record.
# Records are named here, not passed: one Redis server, not a cluster (as `_CLAIM`).
_CHAIN = """
local found = {''}
local id = ARGV[1]
while id do
  local record = redis.call('GET', ARGV[3] .. id)
  local owner, link = nil, nil
  if record then
    owner, link = string.match(record, '^{"id":"[^"]*","owner":"([^"]*)",()')
  end
  if owner ~= ARGV[2] then
    found[1] = id
    return found
  end
  found[#found + 1] = record
  id = string.match(record, '^"previous":"([^"]*)"', link)
end
return found
"""
# A batch of a run's events (KEYS[2]; ARGV[3...]: sequence number, event; ids as `_stream_id`
# makes them) and the key's time to live (ARGV[2]), fenced as `_FENCE` says. An event the stream
# holds already as it is stays (a batch whose answer was lost goes again); one it holds with other
# bytes refuses the batch. Sequence numbers rise, so a refusal comes before any XADD.
_APPEND = (
    _FENCE
    + """
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
local last = top and tonumber(string.match(top[1], '%-(%d+)$')) or 0
for i = 3, #ARGV, 2 do
  local n = tonumber(ARGV[i]) + 1
  if n > last then
    redis.call('XADD', KEYS[2], '0-' .. n, 'e', ARGV[i + 1])
  else
    local held = redis.call('XRANGE', KEYS[2], '0-' .. n, '0-' .. n)[1]
    if not held or held[2][2] ~= ARGV[i + 1] then
      return redis.error_reply('event ' .. ARGV[i] .. ' of ' .. KEYS[2] .. ' is kept already, with other bytes')
    end
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
"""
)
# A run's end: its lease (KEYS[1], a sorted set of ARGV[1]) and its hash (KEYS[2]) go, if the
# fencing token ARGV[2] still holds it.
_RELEASE = """
if redis.call('HGET', KEYS[2], 'holder') == ARGV[2] then
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[1], ARGV[1])
end
"""


# The oldest ids in the index of all (KEYS[1]) past the bound ARGV[1], taken out of it.
_SURPLUS = """
local surplus = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if surplus <= 0 then
  return {}
end
local ids = {}
for i, entry in ipairs(redis.call('ZPOPMIN', KEYS[1], surplus)) do
  if i % 2 == 1 then
    ids[#ids + 1] = entry
  end
end
return ids
"""


# A conversation's hold (KEYS[1]): taken when free or already the holder's (ARGV[1]), for
# ARGV[2] ms, only by the conversation's owner: its record (KEYS[2]) begins with ARGV[3], its id
# and owner as `encode_conversation` writes them first; given back only by its holder.
_HOLD = """
if redis.call('GETRANGE', KEYS[2], 0, #ARGV[3] - 1) ~= ARGV[3] then
  return 0
end
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_LET_GO = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
"""


class _ItemEntry(msgspec.Struct):
    response_id: str
    item: msgspec.Raw


_Entries = list[tuple[bytes, dict[bytes, bytes]]]  # a stream's entries: (id, fields)
_encode_entry = msgspec.json.Encoder().encode
_decode_entry = msgspec.json.Decoder(_ItemEntry).decode


class RedisBackend:
    """Records, event log and leases (`backend.Backend`) on one Redis server. A read of events
    blocks on the stream, so an append on any replica wakes it."""

    def __init__(
        self,
        url: str,
        prefix: str,
        ttl: float,
        max_responses: int,
        timeout: float,
        max_connections: int,
        sentinel: Sentinels | None = None,
    ) -> None:
        """`sentinel`: the Sentinels that name the primary, its database and credentials, as the
        config reads a `redis+sentinel://` URL (9.1); else `url` is the one server's."""
        # No socket timeout: every operation is bounded by the store's own (design.md 9.1), a
        # blocking read of a background response's events by its wait as well, and redis-py
        # drops a connection whose command was cancelled. A socket timeout would cut those
        # reads, and wraps every command's send in a task of its own. A full pool is waited for
        # (within the operation's time), not failed at once (9.8).
        pooling: dict[str, Any] = {
            "max_connections": max_connections,
            "timeout": None,
            "socket_timeout": None,
            "socket_connect_timeout": timeout,
        }
        self._sentinel: Sentinel | None = None
        self._redis: Redis  # its pool closed with it
        if sentinel is not None:
            sentinels, service, db, username, password = sentinel
            # A sentinel answers in a millisecond when well: one that does not is passed over
            # for the next within the store's time, not waited on past it.
            asked = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
            self._sentinel = Sentinel(sentinels, sentinel_kwargs=asked)
            self._redis = self._sentinel.master_for(
                service, connection_pool_class=_SentinelPool, db=db, username=username, password=password, **pooling
            )
        else:
            self._redis = Redis.from_pool(BlockingConnectionPool.from_url(url, **pooling))
        # Reads that block on a stream hold a connection for their whole wait: at most a quarter
        # of the pool does; past it, a read answers at once and its reader polls (9.8).
        self._blocking = asyncio.Semaphore(max(1, max_connections // 4))
        self._claim = self._redis.register_script(_CLAIM)
        self._renew = self._redis.register_script(_RENEW)
        self._take = self._redis.register_script(_TAKE)
        self._append = self._redis.register_script(_APPEND)
        self._put = self._redis.register_script(_PUT)
        self._chain = self._redis.register_script(_CHAIN)
        self._hold = self._redis.register_script(_HOLD)
        self._let_go = self._redis.register_script(_LET_GO)
        self._release = self._redis.register_script(_RELEASE)
        self._surplus = self._redis.register_script(_SURPLUS)
        self._prefix = prefix
        self._ttl = max(1, round(ttl))
        self._max = max_responses
        self._timeout = timeout

    def _response_key(self, id: str) -> str:
        return f"{self._prefix}response:{id}"

    def _item_key(self, owner: str, id: str) -> str:
        return f"{self._prefix}item:{owner}:{id}"

    @property
    def _index(self) -> str:
        return f"{self._prefix}responses"

    def _conversation_key(self, id: str) -> str:
        return f"{self._prefix}conversation:{id}"

    def _owned(self, owner: str) -> str:
        return f"{self._prefix}owned:{owner}"

    @property
    def _runs(self) -> str:
        return f"{self._prefix}runs"

    def _events_key(self, id: str) -> str:
        return f"{self._prefix}events:{id}"

    def _run_key(self, id: str) -> str:
        return f"{self._prefix}run:{id}"

    async def put(self, stored: StoredResponse, items: bool, fence: str | None) -> None:
        found = referable_items(stored) if items else []
        keys = [
            self._run_key(stored.id),
            self._response_key(stored.id),
            self._index,
            self._owned(stored.owner),
            *(self._item_key(stored.owner, item_id) for item_id, _ in found),
        ]
        entries = (_encode_entry(_ItemEntry(stored.id, msgspec.Raw(item))) for _, item in found)
        args: list[bytes | str | int] = [fence or "", encode_stored(stored), self._ttl, stored.created_at, stored.id]
        await _fenced(self._put(keys=keys, args=[*args, *entries]))

    async def sweep(self) -> None:
        """Redis expires keys itself: the oldest responses past the size bound go, with their
        items. The surplus is counted and taken out of the index in one step, so that sweeps
        that run together on several replicas trim it once, down to the bound and no further."""
        for id in cast("list[bytes]", await self._surplus(keys=[self._index], args=[self._max])):
            await self._remove(id.decode(), None)

    async def get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        found = await self._redis.mget([self._response_key(id) for id in ids])
        kept = [decode_stored(data) for data in found if data is not None]
        return {stored.id: stored for stored in kept if stored.owner == owner}

    async def chain(self, id: str, owner: str) -> tuple[list[StoredResponse], str | None]:
        stopped, *records = await self._chain(args=[id, owner, self._response_key("")])
        return [decode_stored(record) for record in reversed(records)], stopped.decode() or None

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        found = await self._redis.mget([self._item_key(owner, id) for id in ids])
        return {id: bytes(_decode_entry(data).item) for id, data in zip(ids, found, strict=True) if data is not None}

    async def recent(self, owner: str, after: str | None, limit: int) -> list[StoredResponse] | None:
        """Newest first, as a sorted set of equal scores orders them (by id, backwards); an id
        whose record expired is dropped from the owner's index as it is met."""
        owned = self._owned(owner)
        start = 0
        if after is not None:
            rank = cast("int | None", await self._redis.zrevrank(owned, after))
            if rank is None or not await self._redis.exists(self._response_key(after)):
                return None
            start = rank + 1
        found: list[StoredResponse] = []
        while len(found) < limit:
            newest = cast("list[bytes]", await self._redis.zrevrange(owned, start, start + limit - len(found) - 1))
            if not newest:
                break
            ids = [id.decode() for id in newest]
            records = await self._redis.mget([self._response_key(id) for id in ids])
            gone = [id for id, data in zip(ids, records, strict=True) if data is None]
            if gone:  # expired, or dropped past the size bound: the ranks after them move up
                await self._redis.zrem(owned, *gone)
            found += [decode_stored(data) for data in records if data is not None]
            start += len(ids) - len(gone)
        return found

    async def delete(self, id: str, owner: str) -> bool:
        return await self._remove(id, owner)

    async def _remove(self, id: str, owner: str | None) -> bool:
        """Delete a response (only `owner`'s, when given) and the items that still name it."""
        data = await self._redis.get(self._response_key(id))
        stored = None if data is None else decode_stored(data)
        if stored is None or (owner is not None and stored.owner != owner):
            return False
        keys = [self._item_key(stored.owner, item_id) for item_id, _ in referable_items(stored)]
        entries = await self._redis.mget(keys) if keys else []
        # An item id a later response repeated (a client's own input id) now names that one.
        mine = [
            key
            for key, entry in zip(keys, entries, strict=True)
            if entry is not None and _decode_entry(entry).response_id == id
        ]
        await self._redis.delete(self._response_key(id), self._events_key(id), *mine)
        await self._redis.zrem(self._index, id)
        await self._redis.zrem(self._owned(stored.owner), id)
        return True

    async def conversation(self, id: str, owner: str) -> StoredConversation | None:
        data = await self._redis.get(self._conversation_key(id))
        found = None if data is None else decode_conversation(data)
        return found if found is not None and found.owner == owner else None

    async def keep_conversation(self, conversation: StoredConversation) -> None:
        await self._redis.set(self._conversation_key(conversation.id), encode_conversation(conversation), ex=self._ttl)

    async def forget_conversation(self, id: str, owner: str) -> bool:
        if await self.conversation(id, owner) is None:
            return False
        await self._redis.delete(self._conversation_key(id), f"{self._conversation_key(id)}:hold")
        return True

    async def hold(self, id: str, owner: str, holder: str, seconds: float) -> bool:
        record = self._conversation_key(id)
        owned = b'{"id":%s,"owner":%s,' % (orjson.dumps(id), orjson.dumps(owner))
        taken = await self._hold(keys=[f"{record}:hold", record], args=[holder, max(1, round(seconds * 1000)), owned])
        return bool(taken)

    async def let_go(self, id: str, holder: str) -> None:
        await self._let_go(keys=[f"{self._conversation_key(id)}:hold"], args=[holder])

    async def append(self, id: str, events: list[Event], fence: str) -> None:
        args = [fence, self._ttl, *(part for seq, event in events for part in (seq, event))]
        await _fenced(self._append(keys=[self._run_key(id), self._events_key(id)], args=args))

    async def read(self, id: str, after: int, wait: float) -> list[Event]:
        key = self._events_key(id)
        if wait <= 0 or self._blocking.locked():
            entries = cast(_Entries, await self._redis.xrange(key, min=f"({_stream_id(after)}"))
        else:
            async with self._blocking:
                streams = cast(
                    "list[tuple[bytes, _Entries]]",
                    await self._redis.xread({key: _stream_id(after)}, block=max(1, round(wait * 1000))),
                )
            entries = streams[0][1] if streams else []
        return [(int(entry_id.decode().split("-")[1]) - 1, fields[b"e"]) for entry_id, fields in entries]

    async def claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> Claim:
        now = time.time()
        taken, total, mine = await self._claim(
            keys=[self._runs, self._run_key(id)],
            args=[id, now, now + lease, owner, holder, self._ttl, caps.total, caps.mine, self._run_key("")],
        )
        return Claim(taken=bool(taken), running=Runs(int(total), int(mine)))

    async def renew(self, id: str, holder: str, lease: float) -> Renewal:
        held, cancel = await self._renew(keys=[self._runs, self._run_key(id)], args=[id, holder, time.time() + lease])
        return Renewal(held=bool(held), cancel=bool(cancel))

    async def release(self, id: str, holder: str) -> None:
        await self._release(keys=[self._runs, self._run_key(id)], args=[id, holder])

    async def cancel(self, id: str) -> None:
        if await self._redis.exists(self._run_key(id)):  # a flag alone would make a stray run hash
            await self._redis.hset(self._run_key(id), "cancel", "1")

    async def take(self, id: str, holder: str, lease: float) -> bool:
        now = time.time()
        return bool(await self._take(keys=[self._runs, self._run_key(id)], args=[id, now, now + lease, holder]))

    async def expired(self) -> list[tuple[str, str]]:
        return await self._owners("-inf", f"({time.time()}")

    async def _owners(self, low: float | str, high: float | str) -> list[tuple[str, str]]:
        """The runs whose leases end between `low` and `high`, with their owners."""
        ids = [id.decode() for id in cast("list[bytes]", await self._redis.zrangebyscore(self._runs, low, high))]
        async with self._redis.pipeline(transaction=False) as pipe:
            for id in ids:
                pipe.hget(self._run_key(id), "owner")
            owners = await pipe.execute()
        return [(id, owner.decode()) for id, owner in zip(ids, owners, strict=True) if isinstance(owner, bytes)]

    async def close(self) -> None:
        await self._redis.aclose()
        if self._sentinel is not None:  # its clients are its own, not the pool's
            await self._sentinel.aclose()

    def affinity(self, upstream: str, ttl: float) -> RedisAffinity:
        """The session map of an upstream, shared by every gateway replica on this server."""
        wait = min(self._timeout, _ROUTING_WAIT)
        return RedisAffinity(self._redis, f"{self._prefix}session:{upstream}:", ttl, wait)


class _SentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The primary's address asked of the sentinels at each new connection, and a full pool waited
    for (9.8). `SentinelConnectionPool` overrides none of the waiting (`get_connection`,
    `release`) and `BlockingConnectionPool` none of the lookup, so the two combine as they are:
    after a failover a connection to the old primary fails its command (the store answers 503,
    9.1), is dropped, and the next one connects to the primary the sentinels name then."""


class RedisAffinity:
    """Session -> replica in Redis, each key living `ttl` seconds after its last use
    (`upstream.affinity.AffinityMap`). A routing decision waits on it for at most `timeout`;
    past that, or when Redis fails, the session is routed by its hash alone, and the map is not
    asked again for `_RETRY` seconds, so that an outage costs each call nothing (design.md 11.3)."""

    def __init__(self, redis: Redis, prefix: str, ttl: float, timeout: float) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl = max(1, round(ttl))
        self._timeout = timeout
        self._failing = False
        self._asleep_until = 0.0

    async def get(self, key: str) -> str | None:
        found = await self._guarded(lambda: self._redis.getex(self._prefix + key, ex=self._ttl))
        return found.decode() if isinstance(found, bytes) else None

    async def set(self, key: str, replica: str) -> None:
        await self._guarded(lambda: self._redis.set(self._prefix + key, replica, ex=self._ttl))

    async def _guarded(self, command: Callable[[], Awaitable[T]]) -> T | None:
        if time.monotonic() < self._asleep_until:
            return None
        try:
            async with asyncio.timeout(self._timeout):
                answer = await command()
        except Exception as exc:  # whatever broke, the session goes by its hash
            if not self._failing:
                log.warning("the session map in Redis is failing (%r): sessions are routed by their hash", exc)
            self._failing = True
            self._asleep_until = time.monotonic() + _RETRY
            return None
        if self._failing:
            log.warning("the session map in Redis works again")
        self._failing = False
        return answer


async def _fenced(write: Awaitable[object]) -> None:
    """A script's write, its refusal of a stale holder raised as `Fenced`."""
    try:
        await write
    except ResponseError as error:
        if str(error) == "FENCED":
            raise Fenced from None
        raise


def _stream_id(seq: int) -> str:
    """A Redis stream id for sequence number `seq`: "0-1" for 0, since "0-0" is not allowed."""
    return f"0-{seq + 1}"
