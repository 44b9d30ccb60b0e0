"""The shared backend: Redis (one server, a Sentinel-watched primary, or a cluster), so that a
response created on one replica is readable and chainable on every other. Records are keys that
expire on their own; a sorted set of response ids by age bounds how many are kept.

On a cluster every script touches one slot (design.md 9.9): a response's record, events and
fence share its chain's tag, the runs' leases share one tag of their own, and what spans slots
(an item's pointer, the indexes) is written before the record that makes it visible."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import ClusterError, RedisError, ResponseError

from .backend import (
    Claim,
    Event,
    Fenced,
    Renewal,
    Runs,
    StoredConversation,
    StoredFile,
    StoredResponse,
    decode_conversation,
    decode_file,
    decode_stored,
    encode_conversation,
    encode_file,
    encode_stored,
    referable_items,
)

log = logging.getLogger("proxy.store")
T = TypeVar("T")
# The sentinels' addresses, the service they watch, its database, its user and password.
Sentinels = tuple[list[tuple[str, int]], str, int, str | None, str | None]
# A cluster's nodes to begin from, its user and password, whether over TLS.
ClusterNodes = tuple[list[tuple[str, int]], str | None, str | None, bool]
# How many of a response id's first characters tag its keys on a cluster: `resp_` and the 8 hex
# digits a chain's responses share (`responses.lifecycle.response_id`, design.md 9.9).
_CHAIN_TAG = 13
# The longest a call's routing waits on the session map: a Redis answers in a millisecond when
# well, and a call is routed by its hash alone when not.
_ROUTING_WAIT = 0.25
_RETRY = 5.0  # seconds a failing session map is left alone
_MIGRATING = 0.05  # seconds between the tries of a command its slot's migration refused

# A run's lease lives in a sorted set (score: when it ends) and its owner, holder and cancel flag
# in a hash; claiming within the caps, renewing and taking over read and write them in one step.
# The claim reads every running run's hash by its name: on a cluster they share the sorted set's
# tag, `{runs}`, so the caps stay exact (design.md 9.9).
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
# A write of a background run goes only while its lease is held by the fencing token ARGV[1],
# checked in the script that writes (design.md 10.4); '' for a write of no run. KEYS[1] is the
# run's hash (one server), or on a cluster the copy of its holder kept beside its response.
# Every fenced script begins with it, its own keys and arguments after those two.
_FENCE = """
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then
  return redis.error_reply('FENCED')
end
"""
# The pointers a response wrote (the set `written` holds their keys) go with it, but those a later
# response's item of the same id took, which name that one (design.md 9.1): the set is on its
# owner's slot, as they are (9.9).
_UNPOINT = """
local function unpoint(written, id)
  for _, key in ipairs(redis.call('SMEMBERS', written)) do
    local pointer = redis.call('GET', key)
    if pointer and cjson.decode(pointer)['response_id'] == id then
      redis.call('DEL', key)
    end
  end
  redis.call('DEL', written)
end
"""
# What a response adds to its owner's: its items' pointers (KEYS[first...], `pointer`) and the set
# of their keys (`written` .. its id), and its id by age (`at`) in the owner's index (`index`),
# whose ids made longer ago than records live (`ttl`) go, and which lives as long as its newest;
# then the owner's oldest past the bound `most` (by age, then id, as its list orders them, but
# `id` the newest of its second: one just made stays), at most 100 a put (a bound lowered is
# reached over later puts): their pointers go, then they are taken out of the index (a script cut
# short between, sent again, finds them there still) and returned, for their records to go. On a
# cluster an owner's share a slot (9.9).
_OWN = (
    _UNPOINT
    + """
local function own(index, at, id, ttl, pointer, first, most, written)
  for i = first, #KEYS do
    redis.call('SET', KEYS[i], pointer, 'EX', ttl)
    redis.call('SADD', written .. id, KEYS[i])
  end
  redis.call('EXPIRE', written .. id, ttl)
  redis.call('ZADD', index, at, id)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. (tonumber(at) - tonumber(ttl)))
  redis.call('EXPIRE', index, ttl)
  local surplus = math.min(redis.call('ZCARD', index) - tonumber(most), 100)
  local past = {}
  if surplus > 0 then
    local oldest = redis.call('ZRANGE', index, 0, surplus, 'WITHSCORES')
    local staying, its_age = oldest[#oldest - 1], oldest[#oldest]
    for i = 1, #oldest - 2, 2 do
      past[#past + 1] = (oldest[i] == id and oldest[i + 1] == its_age) and staying or oldest[i]
      unpoint(written .. past[#past], past[#past])
    end
    redis.call('ZREM', index, unpack(past))
  end
  return past
end
"""
)
# A record (KEYS[2], ARGV[2], its time to live ARGV[3]): what makes a response visible, unless
# it was dropped a moment ago (KEYS[3], `_DROP`). On a cluster it is written last, alone (design.md
# 9.9); on one server this step adds it to its owner's too (`own`: the owner's index KEYS[4], the
# items' pointers KEYS[5...]; its id ARGV[4], by age ARGV[5], the pointer ARGV[6], the bound
# ARGV[7], the sets of pointers ARGV[8]), and answers the ids past the bound.
_PUT = (
    _FENCE
    + _OWN
    + """
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {}
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if #KEYS > 3 then
  return own(KEYS[4], ARGV[5], ARGV[4], ARGV[3], ARGV[6], 5, ARGV[7], ARGV[8])
end
return {}
"""
)
# A response dropped (past its owner's bound, or deleted): its record (KEYS[1]) and events
# (KEYS[2]) go, and a mark (KEYS[3]) stays ARGV[1] ms, so that a write of it still in flight (on a
# cluster its owner's step may have run, and been dropped by another put, before its record's)
# keeps nothing.
_DROP = """
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
"""
# On a cluster, what a response adds to its owner's (KEYS[1], KEYS[2...]) in a step of its own,
# its arguments `_PUT`'s from the time to live on.
_OWNED = _OWN + "return own(KEYS[1], ARGV[3], ARGV[2], ARGV[1], ARGV[4], 2, ARGV[5], ARGV[6])"
# A response deleted leaves its owner's (KEYS[1]: the index; ARGV[1]: its id; ARGV[2]: the sets of
# pointers).
_DISOWN = (
    _UNPOINT
    + """
unpoint(ARGV[2] .. ARGV[1], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
"""
)
# A chain read in one step (design.md 9.4): from the response ARGV[1] back along each record's
# link, while each is kept, its owner is ARGV[2] and (on a cluster) its id begins with the tag
# ARGV[4]; the records (keys ARGV[3] .. id), newest first, after the id of the link where the
# walk stopped ('' when it reached the chain's first response) and whether it stopped at a link of
# another tag, on another slot ('1'), to be walked on from there. The owner and the link are read
# where `encode_stored` writes them, first in the record: a link costs the one GET of the record
# the walk returns anyway, where a key of its own would be a second read a link, and a second key
# to write, expire and delete with each record. The links' keys are named here, not passed: a
# chain's share its first key's slot (its tag).
_CHAIN = """
local found = {'', ''}
local id = ARGV[1]
while id do
  if string.sub(id, 1, #ARGV[4]) ~= ARGV[4] then
    found[1], found[2] = id, '1'
    return found
  end
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
# A cluster's copy of a run's holder (KEYS[1]): the token ARGV[1], for the time to live ARGV[2].
_COPY = """
redis.call('HSET', KEYS[1], 'holder', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
"""
# A cluster's copy of a run's holder (KEYS[1]) goes with its lease, if the token ARGV[1] holds it.
_UNFENCE = (
    _FENCE
    + """
redis.call('DEL', KEYS[1])
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
# A file (design.md 8.16): its record ARGV[2] under its id ARGV[1] in its owner's hash (KEYS[1]),
# its bytes ARGV[6] at KEYS[2] (on the owner's slot), unless the owner's files would be more than
# ARGV[3] or hold more than ARGV[4] bytes with its ARGV[5]: then the bound it would pass.
_PUT_FILE = """
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 'files'
end
local used = tonumber(ARGV[5])
for _, record in ipairs(redis.call('HVALS', KEYS[1])) do
  used = used + cjson.decode(record)['bytes']
end
if used > tonumber(ARGV[4]) then
  return 'bytes'
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[6])
return false
"""
_FORGET_FILE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('DEL', KEYS[2])
return 1
"""


class _ItemEntry(msgspec.Struct):
    """An item's pointer: the response whose record holds it. (One kept before pointers holds
    the item too, unread: the record is what answers.)"""

    response_id: str


_Entries = list[tuple[bytes, dict[bytes, bytes]]]  # a stream's entries: (id, fields)
_encode_entry = msgspec.json.Encoder().encode
_decode_entry = msgspec.json.Decoder(_ItemEntry).decode


class RedisBackend:
    """Records, event log and leases (`backend.Backend`) on Redis. A read of events blocks on the
    stream, so an append on any replica wakes it."""

    def __init__(
        self,
        url: str,
        prefix: str,
        ttl: float,
        max_responses: int,
        timeout: float,
        max_connections: int,
        sentinel: Sentinels | None = None,
        cluster: ClusterNodes | None = None,
    ) -> None:
        """`sentinel`: the Sentinels that name the primary, its database and credentials, as the
        config reads a `redis+sentinel://` URL (9.1); `cluster`: a cluster's nodes (9.9); else
        `url` is the one server's."""
        # No socket timeout: every operation is bounded by the store's own (design.md 9.1), a
        # blocking read of a background response's events by its wait as well, and redis-py
        # drops a connection whose command was cancelled. A socket timeout would cut those
        # reads, and wraps every command's send in a task of its own. A full pool is waited for
        # (within the operation's time), not failed at once (9.8).
        pooling: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": timeout}
        self._sentinel: Sentinel | None = None
        self._redis: Redis | RedisCluster  # its pool closed with it
        if cluster is not None:
            nodes, username, password, tls = cluster
            seeds = [ClusterNode(host, port) for host, port in nodes]
            self._redis = _Cluster(
                max_connections, startup_nodes=seeds, username=username, password=password, ssl=tls, **pooling
            )
        elif sentinel is not None:
            sentinels, service, db, username, password = sentinel
            # A sentinel answers in a millisecond when well: one that does not is passed over
            # for the next within the store's time, not waited on past it.
            asked = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
            self._sentinel = Sentinel(sentinels, sentinel_kwargs=asked)
            self._redis = self._sentinel.master_for(
                service,
                connection_pool_class=_SentinelPool,
                db=db,
                username=username,
                password=password,
                max_connections=max_connections,
                timeout=None,
                **pooling,
            )
        else:
            pool = BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=None, **pooling)
            self._redis = Redis.from_pool(pool)
        # Keys read together in one command where they share a slot; on a cluster, a command a node.
        self._mget = self._redis.mget_nonatomic if isinstance(self._redis, RedisCluster) else self._redis.mget
        # On a cluster a key's `{...}` names its slot (9.9): a response's keys are tagged by its
        # chain, the runs' leases all by one tag. On one server the keys are as they always were.
        self._tagged = cluster is not None
        self._leases = f"{prefix}{{runs}}" if self._tagged else prefix
        # Reads that block on a stream hold a connection for their whole wait: at most a quarter
        # of the pool does; past it, a read answers at once and its reader polls (9.8).
        self._blocking = asyncio.Semaphore(max(1, max_connections // 4))
        self._claim = self._redis.register_script(_CLAIM)
        self._renew = self._redis.register_script(_RENEW)
        self._take = self._redis.register_script(_TAKE)
        self._append = self._redis.register_script(_APPEND)
        self._put = self._redis.register_script(_PUT)
        self._own = self._redis.register_script(_OWNED)
        self._disown = self._redis.register_script(_DISOWN)
        self._drop = self._redis.register_script(_DROP)
        self._chain = self._redis.register_script(_CHAIN)
        self._hold = self._redis.register_script(_HOLD)
        self._let_go = self._redis.register_script(_LET_GO)
        self._release = self._redis.register_script(_RELEASE)
        self._unfence = self._redis.register_script(_UNFENCE)
        self._copy = self._redis.register_script(_COPY)
        self._put_file = self._redis.register_script(_PUT_FILE)
        self._forget_file = self._redis.register_script(_FORGET_FILE)
        self._prefix = prefix
        self._ttl = max(1, round(ttl))
        self._max = max_responses
        self._timeout = timeout
        # How long a dropped response's mark stays: past any write of it still in flight.
        self._gone_for = round(max(60.0, 10 * timeout) * 1000)

    def _tag(self, id: str) -> str:
        """The `{...}` that puts the keys of a response (its chain's) or a conversation on one slot."""
        return f"{{{id[:_CHAIN_TAG]}}}" if self._tagged else ""

    def _response_key(self, id: str) -> str:
        return f"{self._prefix}response:{self._tag(id)}{id}"

    def _events_key(self, id: str) -> str:
        return f"{self._prefix}events:{self._tag(id)}{id}"

    def _gone_key(self, id: str) -> str:
        return f"{self._prefix}gone:{self._tag(id)}{id}"

    def _dropping(self, id: str) -> list[str]:
        """`_DROP`'s keys for a response: one slot."""
        return [self._response_key(id), self._events_key(id), self._gone_key(id)]

    def _fence_key(self, id: str) -> str:
        """What a run's writes are checked against: its lease's hash on one server; on a cluster,
        a copy of its holder beside its response, set by each claim and takeover (10.4, 9.9)."""
        return f"{self._prefix}run:{self._tag(id)}{id}"

    def _run_key(self, id: str) -> str:
        return f"{self._leases}run:{id}"

    @property
    def _runs(self) -> str:
        return f"{self._leases}runs"

    def _owner_tag(self, owner: str) -> str:
        """The `{...}` that puts an owner's index and its items' pointers on one slot."""
        return f"{{owned:{owner}}}" if self._tagged else ""

    def _item_key(self, owner: str, id: str) -> str:
        return f"{self._prefix}item:{owner}:{self._owner_tag(owner)}{id}"

    def _written(self, owner: str) -> str:
        """Before a response's id: the set of its items' pointers, on its owner's slot."""
        return f"{self._prefix}pointers:{owner}:{self._owner_tag(owner)}"

    def _owned(self, owner: str) -> str:
        return f"{self._prefix}owned:{owner}{self._owner_tag(owner)}"

    def _conversation_key(self, id: str) -> str:
        return f"{self._prefix}conversation:{self._tag(id)}{id}"

    async def put(self, stored: StoredResponse, items: bool, fence: str | None) -> None:
        """One server: one step. A cluster: what it adds to its owner's first, its record last,
        so that a reader meets the response whole or not at all (an index entry or a pointer
        whose record is missing answers nothing, 9.9). Then the records of the owner's responses
        past the bound go."""
        pointers = [self._item_key(stored.owner, item_id) for item_id, _ in referable_items(stored)] if items else []
        keys = [self._fence_key(stored.id), self._response_key(stored.id), self._gone_key(stored.id)]
        args: list[bytes | str | int] = [fence or "", encode_stored(stored), self._ttl]
        owned = [self._owned(stored.owner), *pointers]
        owning: list[bytes | str | int] = [
            stored.id,
            stored.created_at,
            _encode_entry(_ItemEntry(stored.id)),
            self._max,
            self._written(stored.owner),
        ]
        past: list[bytes] = []
        try:
            if self._tagged:
                past = await self._own(keys=owned, args=[self._ttl, *owning])
                await _fenced(self._put(keys=keys, args=args))
            else:
                past = await _fenced(self._put(keys=keys + owned, args=args + owning))
        finally:  # what left the owner's index goes, whether this record was kept or not
            await self._dropped(past)

    async def _dropped(self, ids: list[bytes]) -> None:
        """Responses past their owner's bound go, within the store's time (a put that failed
        may be past its own); one that cannot now stays until it expires, out of its owner's
        index: the put is kept all the same."""
        try:
            async with asyncio.timeout(self._timeout):
                for id in map(bytes.decode, ids):
                    await self._drop(keys=self._dropping(id), args=[self._gone_for])
        except (RedisError, TimeoutError) as error:
            log.warning("responses past their key's bound were not all dropped (%r): they expire", error)

    async def sweep(self) -> None:
        """Nothing: Redis expires keys itself, and each owner's responses past the bound go
        at its puts."""

    async def get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        found = await self._mget([self._response_key(id) for id in ids])
        kept = [decode_stored(data) for data in found if data is not None]
        return {stored.id: stored for stored in kept if stored.owner == owner}

    async def chain(self, id: str, owner: str) -> tuple[list[StoredResponse], str | None]:
        """One script a slot the chain's links are on: one, unless the chain changed its tag. On
        a cluster, a walk that stopped at a link the owner's record of which is there all the same
        met a slot half migrated (the script ran on the node the slot moves to, where the links
        not moved yet read as missing): it walks on from there once the migration moved on."""
        newest_first: list[bytes] = []
        while True:
            tag = id[:_CHAIN_TAG] if self._tagged else ""
            args = [id, owner, f"{self._prefix}response:{self._tag(id)}", tag]
            stopped, elsewhere, *records = await self._chain(keys=[self._response_key(id)], args=args)
            newest_first += records
            if elsewhere != b"1":
                if not (self._tagged and stopped and await self._kept(stopped.decode(), owner)):
                    break
                await asyncio.sleep(_MIGRATING)
            id = stopped.decode()
        return [decode_stored(record) for record in reversed(newest_first)], stopped.decode() or None

    async def _kept(self, id: str, owner: str) -> bool:
        data = await self._redis.get(self._response_key(id))  # one key: redis-py follows ASK for it
        return data is not None and decode_stored(data).owner == owner

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        """Each item as the record its pointer names holds it: an item is answered only while
        that record is kept, with the bytes it keeps."""
        pointers = await self._mget([self._item_key(owner, id) for id in ids])
        named = {id: _decode_entry(data).response_id for id, data in zip(ids, pointers, strict=True) if data}
        records = await self.get(list(set(named.values())), owner) if named else {}
        held = {response_id: dict(referable_items(stored)) for response_id, stored in records.items()}
        return {id: held[response_id][id] for id, response_id in named.items() if id in held.get(response_id, {})}

    async def recent(self, owner: str, after: str | None, limit: int) -> list[StoredResponse] | None:
        """Newest first, as a sorted set of equal scores orders them (by id, backwards); an id
        whose record is not there (expired, dropped past the size bound, or its write not yet
        ended) is passed over."""
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
            records = await self._mget([self._response_key(id.decode()) for id in newest])
            found += [decode_stored(data) for data in records if data is not None]
            start += len(newest)
        return found

    async def delete(self, id: str, owner: str) -> bool:
        """The owner's response and its events go, then its items' pointers (those no later
        response took) with its entry in its owner's index."""
        data = await self._redis.get(self._response_key(id))
        if data is None or decode_stored(data).owner != owner:
            return False
        await self._drop(keys=self._dropping(id), args=[self._gone_for])
        await self._disown(keys=[self._owned(owner)], args=[id, self._written(owner)])
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

    def _files_key(self, owner: str) -> str:
        """An owner's files: a hash of their records by id, on its owner's slot."""
        return f"{self._prefix}files:{owner}{self._owner_tag(owner)}"

    def _file_key(self, owner: str, id: str) -> str:
        return f"{self._prefix}file:{owner}:{self._owner_tag(owner)}{id}"

    async def put_file(self, file: StoredFile, content: bytes, max_files: int, max_bytes: int) -> str | None:
        keys = [self._files_key(file.owner), self._file_key(file.owner, file.id)]
        args: list[str | bytes | int] = [file.id, encode_file(file), max_files, max_bytes, file.bytes, content]
        passed = await self._put_file(keys=keys, args=args)
        return None if passed is None else bytes(passed).decode()

    async def file(self, id: str, owner: str) -> StoredFile | None:
        data = await self._redis.hget(self._files_key(owner), id)
        return None if data is None else decode_file(data)

    async def file_content(self, id: str, owner: str) -> bytes | None:
        return cast("bytes | None", await self._redis.get(self._file_key(owner, id)))

    async def files(self, owner: str) -> list[StoredFile]:
        records = await self._redis.hvals(self._files_key(owner))
        return [decode_file(data) for data in records]

    async def forget_file(self, id: str, owner: str) -> bool:
        keys = [self._files_key(owner), self._file_key(owner, id)]
        return bool(await self._forget_file(keys=keys, args=[id]))

    async def append(self, id: str, events: list[Event], fence: str) -> None:
        args = [fence, self._ttl, *(part for seq, event in events for part in (seq, event))]
        await _fenced(self._append(keys=[self._fence_key(id), self._events_key(id)], args=args))

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
        if taken:
            await self._fence(id, holder)
        return Claim(taken=bool(taken), running=Runs(int(total), int(mine)))

    async def renew(self, id: str, holder: str, lease: float) -> Renewal:
        held, cancel = await self._renew(keys=[self._runs, self._run_key(id)], args=[id, holder, time.time() + lease])
        return Renewal(held=bool(held), cancel=bool(cancel))

    async def release(self, id: str, holder: str) -> None:
        """The lease goes, and on a cluster the copy of its holder, so that a run that ended
        takes no more writes (10.4)."""
        await self._release(keys=[self._runs, self._run_key(id)], args=[id, holder])
        if self._fence_key(id) != self._run_key(id):
            with contextlib.suppress(Fenced):  # another holder's: it stays
                await _fenced(self._unfence(keys=[self._fence_key(id)], args=[holder]))

    async def cancel(self, id: str) -> None:
        if await self._redis.exists(self._run_key(id)):  # a flag alone would make a stray run hash
            await self._redis.hset(self._run_key(id), "cancel", "1")

    async def take(self, id: str, holder: str, lease: float) -> bool:
        now = time.time()
        taken = bool(await self._take(keys=[self._runs, self._run_key(id)], args=[id, now, now + lease, holder]))
        if taken:
            await self._fence(id, holder)
        return taken

    async def _fence(self, id: str, holder: str) -> None:
        """On a cluster, the lease just won is copied beside the response, where its writes are
        checked: from then on, and before the winner writes, the holder it replaced is refused
        (10.4). On one server the lease's own hash is what they are checked against; a release
        takes the copy back."""
        if self._fence_key(id) != self._run_key(id):
            await self._copy(keys=[self._fence_key(id)], args=[holder, self._ttl])

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

    def affinity(self, upstream: str, ttl: float, window: float) -> RedisAffinity:
        """The session map, prefix index and sessions held of an upstream, shared by every
        gateway replica on this server. On a cluster the index's keys and the sessions held
        share a tag, so that a new session's read of them is one node's round trip (design.md
        11.5)."""
        wait = min(self._timeout, _ROUTING_WAIT)
        tag = f"{{prefix:{upstream}}}" if self._tagged else upstream
        keys = (f"{self._prefix}session:{upstream}:", f"{self._prefix}prefix:{tag}:", f"{self._prefix}held:{tag}:")
        return RedisAffinity(self._redis, keys, ttl, window, wait)


# Whether this task (and the tasks it made) already holds one of a cluster client's places in
# flight: a pipeline's commands that a redirection sends again go through the client's own
# `execute_command`, and must not wait for a second place while holding the first.
_HOLDING: ContextVar[bool] = ContextVar("holding a cluster place", default=False)


class _Cluster(RedisCluster):
    """A cluster client whose commands wait for a connection when `max_connections` are in use,
    as a full pool is waited for on one server (9.8), where redis-py's cluster client raises
    `MaxConnectionsError`: the commands of this process in flight at once are bounded, and so
    each node's connections, since a command (a pipeline) holds at most one a node."""

    def __init__(self, max_connections: int, **settings: Any) -> None:
        super().__init__(max_connections=max_connections, **settings)
        self._in_flight = asyncio.Semaphore(max_connections)

    async def placed(self, send: Callable[[], Awaitable[T]]) -> T:
        """`send()` within a place in flight: this task's own, if it holds one already."""
        if _HOLDING.get():
            return await send()
        async with self._in_flight:
            holding = _HOLDING.set(True)
            try:
                return await send()
            finally:
                _HOLDING.reset(holding)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """A command refused while its slot migrates is sent again until it runs, its place given
        back while it waits: a script whose keys are split between the two nodes (TRYAGAIN, which
        redis-py gives up on within a few tries), or that reads a key already moved away (its
        links, the runs' hashes: refused before any write). The store's time limit bounds the
        wait (9.9)."""
        send = partial(super().execute_command, *args, **kwargs)
        while True:
            try:
                return await self.placed(send)
            except ClusterError:  # TRYAGAIN past redis-py's tries ("TTL exhausted")
                pass
            except ResponseError as error:
                if "non local key" not in str(error):
                    raise
            await asyncio.sleep(_MIGRATING)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not for a cluster")
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py makes its own


class _ClusterPipeline(ClusterPipeline):
    cluster_client: _Cluster

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        return await self.cluster_client.placed(partial(super().execute, raise_on_error, allow_redirections))


class _SentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The primary's address asked of the sentinels at each new connection, and a full pool waited
    for (9.8). `SentinelConnectionPool` overrides none of the waiting (`get_connection`,
    `release`) and `BlockingConnectionPool` none of the lookup, so the two combine as they are:
    after a failover a connection to the old primary fails its command (the store answers 503,
    9.1), is dropped, and the next one connects to the primary the sentinels name then."""


class RedisAffinity:
    """Session -> replica in Redis, each key living `ttl` seconds after its last use; a prefix's
    digest -> a hash of the replicas it was sent to, each with when, the key living `ttl`
    seconds after the last; a replica -> the sessions reported there within `window` seconds
    (`upstream.affinity.AffinityMap`). A routing decision waits on it for at most `timeout`;
    past that, or when Redis fails, the session is routed without it, and it is not asked
    again for `_RETRY` seconds, so that an outage costs each call nothing (design.md 11.3,
    11.5)."""

    def __init__(
        self, redis: Redis | RedisCluster, keys: tuple[str, str, str], ttl: float, window: float, timeout: float
    ) -> None:
        self._redis = redis
        # Each a key's beginning: a session's (its replica), a digest's (a hash of the replicas
        # it was sent to, and when), a replica's (a sorted set of its sessions, by when each was
        # last reported there).
        self._session, self._prefixes, self._held = keys
        self._ttl = max(1, round(ttl))
        self._window = window
        self._timeout = timeout
        self._failing = False
        self._asleep_until = 0.0

    async def get(self, key: str) -> str | None:
        found = await self._guarded(lambda: self._redis.getex(self._session + key, ex=self._ttl))
        return found.decode() if isinstance(found, bytes) else None

    async def set(self, key: str, replica: str, prefixes: Sequence[str] = (), moved_from: str | None = None) -> None:
        async def write() -> None:
            now = time.time()
            held = self._held + replica
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(self._session + key, replica, ex=self._ttl)
                for prefix in prefixes:
                    pipe.hset(self._prefixes + prefix, replica, now)
                    pipe.expire(self._prefixes + prefix, self._ttl)
                pipe.zadd(held, {key: now})
                pipe.zremrangebyscore(held, "-inf", now - self._window)
                pipe.expire(held, max(1, math.ceil(self._window)))
                if moved_from is not None and moved_from != replica:
                    pipe.zrem(self._held + moved_from, key)
                await pipe.execute()

        await self._guarded(write)

    async def view(
        self, prefixes: Sequence[str], replicas: Sequence[str]
    ) -> tuple[list[Mapping[str, float]], Mapping[str, int] | None]:
        async def read() -> list[Any]:
            since = time.time() - self._window
            async with self._redis.pipeline(transaction=False) as pipe:
                for prefix in prefixes:
                    pipe.hgetall(self._prefixes + prefix)
                for replica in replicas:
                    pipe.zcount(self._held + replica, since, "+inf")
                return await pipe.execute()

        found = await self._guarded(read)
        if found is None:
            return [], None
        now = time.time()
        sent: list[dict[bytes, bytes]] = found[: len(prefixes)]
        ages: list[Mapping[str, float]] = [
            {url.decode(): now - float(at) for url, at in to.items() if float(at) > now - self._ttl} for to in sent
        ]
        return ages, dict(zip(replicas, found[len(prefixes) :], strict=True))

    async def forget(self, prefixes: Sequence[str], replica: str, session: str | None = None) -> None:
        async def delete() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                for prefix in prefixes:
                    pipe.hdel(self._prefixes + prefix, replica)
                if session is not None:
                    pipe.delete(self._session + session)
                    pipe.zrem(self._held + replica, session)
                await pipe.execute()

        await self._guarded(delete)

    async def _guarded(self, command: Callable[[], Awaitable[T]]) -> T | None:
        if time.monotonic() < self._asleep_until:
            return None
        try:
            async with asyncio.timeout(self._timeout):
                answer = await command()
        except Exception as exc:  # whatever broke, the session is routed without the map
            if not self._failing:
                log.warning("the session map in Redis is failing (%r): sessions are routed without it", exc)
            self._failing = True
            self._asleep_until = time.monotonic() + _RETRY
            return None
        if self._failing:
            log.warning("the session map in Redis works again")
        self._failing = False
        return answer


async def _fenced(write: Awaitable[T]) -> T:
    """A script's answer, its refusal of a stale holder raised as `Fenced`."""
    try:
        return await write
    except ResponseError as error:
        if str(error) == "FENCED":
            raise Fenced from None
        raise


def _stream_id(seq: int) -> str:
    """A Redis stream id for sequence number `seq`: "0-1" for 0, since "0-0" is not allowed."""
    return f"0-{seq + 1}"
