"""Session affinity with bounded load (design.md 11.2): every turn of a session goes to the
replica that served the last one, which holds its prefix cache, while that replica is up and
carries no more than `load_factor` times its share of the requests in flight; else to the next
replica in the session's own order (rendezvous hashing), which keeps it from then on.

Two gateway replicas agree on a session's replica without talking: its order depends only on
its key and the replica list. Where they share a Redis store they share the map as well, so a
session that spilled on one is found where it went on the other; and the index of where each
prompt prefix was last sent, by which a new session is placed (`placement.py`, 11.5)."""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio

    from .placement import Prefix

# How a session's replica was found, for the metrics: the map's, a new session's by its prefix
# (11.5) or by load alone, another than the map's.
HIT, PREFIX, NEW, SPILL = "hit", "prefix", "new", "spill"
# What a new session is placed by: the replicas each of its prefixes was sent to, with the
# seconds since, and the sessions each replica holds where the map keeps that count.
View = tuple[list[Mapping[str, float]], Mapping[str, int] | None]


class Session:
    """A call's session as the upstream client routes it: its key, the replica its previous
    response came from (a hint from the stored chain), and, once sent, the replica it went to;
    `placed`: a new session's prefix, the bytes of it the replica it was placed on was sent
    last, and that replica, until its usage says whether it still held them; `computing`: the
    digests of its prefix a replica computes for it, until that replica's answer's first bytes
    (11.5)."""

    __slots__ = ("key", "previous", "served_by", "placed", "computing")

    def __init__(self, key: str, previous: str | None = None) -> None:
        self.key = key
        self.previous = previous
        self.served_by: str | None = None
        self.placed: tuple[Prefix, int, str] | None = None
        self.computing: tuple[Sequence[str], str, asyncio.Event] | None = None


class AffinityMap(Protocol):
    """Session key -> the replica URL that serves it, kept `ttl` seconds after its last use;
    a prefix's digest -> the replicas it was sent to within `ttl`; and, where it is shared,
    the sessions each replica holds (11.5). A map that fails answers as one that knows
    nothing: routing never waits on it for long, and never fails a request."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, replica: str, prefixes: Sequence[str] = (), moved_from: str | None = None) -> None:
        """The session's replica, which holds it (`moved_from` no longer does); and, for a
        session being placed, that its replica is sent its prefixes: one write."""

    async def view(self, prefixes: Sequence[str], replicas: Sequence[str]) -> View:
        """The replicas each prefix was sent to within `ttl`, each with the seconds since, and
        the sessions each of `replicas` holds (None where the map keeps no count: the process's
        own is the count): one read."""

    async def forget(self, prefixes: Sequence[str], replica: str, session: str | None = None) -> None:
        """The replica no longer holds the prefixes; nor the session, where named (placed there,
        it was never sent: out of the map and the count)."""


class LocalAffinity:
    """This process's map and index: the least recently used sessions and prefixes go past
    `size` each."""

    def __init__(self, ttl: float, size: int = 100_000) -> None:
        self._ttl = ttl
        self._size = size
        self._replicas: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._prefixes: OrderedDict[str, dict[str, float]] = OrderedDict()

    async def get(self, key: str) -> str | None:
        found = self._replicas.get(key)
        now = time.monotonic()
        if found is None or found[1] < now:
            return None
        self._replicas[key] = (found[0], now + self._ttl)
        self._replicas.move_to_end(key)
        return found[0]

    async def set(self, key: str, replica: str, prefixes: Sequence[str] = (), moved_from: str | None = None) -> None:
        until = time.monotonic() + self._ttl
        self._replicas[key] = (replica, until)
        self._replicas.move_to_end(key)
        if len(self._replicas) > self._size:
            self._replicas.popitem(last=False)
        for prefix in prefixes:
            self._prefixes.setdefault(prefix, {})[replica] = until
            self._prefixes.move_to_end(prefix)
        while len(self._prefixes) > self._size:
            self._prefixes.popitem(last=False)

    async def view(self, prefixes: Sequence[str], replicas: Sequence[str]) -> View:
        now = time.monotonic()
        sent: dict[str, dict[str, float]] = {prefix: self._prefixes.get(prefix, {}) for prefix in prefixes}
        ages: list[Mapping[str, float]] = [
            {replica: self._ttl - (until - now) for replica, until in sent[prefix].items() if until > now}
            for prefix in prefixes
        ]
        return ages, None

    async def forget(self, prefixes: Sequence[str], replica: str, session: str | None = None) -> None:
        for prefix in prefixes:
            self._prefixes.get(prefix, {}).pop(replica, None)
        if session is not None and self._replicas.get(session, ("",))[0] == replica:
            del self._replicas[session]


class Weighted(Protocol):
    url: str
    salt: bytes
    outstanding: int


R = TypeVar("R", bound=Weighted)


def ranked(key: str, replicas: Sequence[R]) -> list[R]:
    """The session's own order of the replicas: highest random weight first. Replicas that come
    or go move only the sessions whose first choice they were."""
    data = key.encode()

    def weight(replica: R) -> bytes:
        return hashlib.blake2b(data, digest_size=8, salt=replica.salt).digest()

    return sorted(replicas, key=weight, reverse=True)


def salt_of(url: str) -> bytes:
    """A replica's salt in the rendezvous hash: its URL's, the same in every process."""
    return hashlib.blake2b(url.encode(), digest_size=16).digest()


def in_flight_cap(usable: Sequence[Weighted], load_factor: float) -> int:
    """The requests in flight a replica must carry fewer of to take one more: `load_factor`
    times the mean with this request counted, rounded up (consistent hashing with bounded
    loads, 11.2), or one more than the mean rounded up where that is more: at a few requests
    in flight the factor alone spills a session from a replica carrying 2 beside one carrying
    none, its history prefilled again elsewhere to save a wait for one request."""
    mean = (sum(replica.outstanding for replica in usable) + 1) / len(usable)
    return max(math.ceil(load_factor * mean), math.ceil(mean) + 1)


def choose(key: str, pinned: str | None, usable: Sequence[R], load_factor: float) -> list[R]:
    """The replicas to try, in order: the pinned one if it is usable and under the bound, else
    the first in the session's order that is; then the others under the bound, in that order;
    then the rest, fewest in flight first."""
    cap = in_flight_cap(usable, load_factor)
    order = ranked(key, usable)
    under = [replica for replica in order if replica.outstanding < cap]
    first = next((replica for replica in under if replica.url == pinned), None)
    if first is not None:
        under.remove(first)
        under.insert(0, first)
    over = sorted((replica for replica in order if replica.outstanding >= cap), key=lambda replica: replica.outstanding)
    return under + over
