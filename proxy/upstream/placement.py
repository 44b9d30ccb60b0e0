"""A new session's replica (design.md 11.5): where the longest leading part of its prompt was
last sent, among the replicas within a bound on the sessions they hold; else the one holding
fewest, ties broken by the prompt (never the session), so that gateway replicas that share
nothing agree. Pure: the client hands in what the index knows, the loads and the clock."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .affinity import R, in_flight_cap, ranked

# The leading part is digested every BLOCK bytes and at the end of each of its parts, at most
# DIGESTS times (128 KiB): a prefix that two prompts share up to any of those points matches.
BLOCK = 4096
DIGESTS = 32
_LEADING_ROLES = ("system", "developer")
# A replica may always hold one session more than the mean: at a few sessions a replica the factor
# alone sends a product's second session to another replica (a bound of 1.25 over a mean of 1),
# a copy of its prefix for a balance that costs nothing yet; from 4 a replica the factor is the
# looser.
SLACK = 1
# A session this process routes is reported to a shared count of sessions at least this many
# times a window, so that it counts there while it is active.
REPORTS = 4


@dataclass(frozen=True, slots=True)
class Prefix:
    """The leading part of a chat request as the upstream renders it: `digests`, each of all the
    bytes before `ends[i]`, shortest first; `tie`, what orders the replicas when loads tie (the
    first digest: every prompt that shares any prefix with another shares it); and the
    request's `size` in bytes, against which its usage weighs a match."""

    digests: tuple[str, ...]
    ends: tuple[int, ...]
    tie: str
    size: int

    def past(self, matched: int) -> list[str]:
        """The digests of more than its first `matched` bytes: what a replica holding those
        computes."""
        return [digest for digest, end in zip(self.digests, self.ends, strict=True) if end > matched]


def prefix_of(chat: Mapping[str, Any], size: int) -> Prefix:
    """The digests of a chat request's leading part: its first system message, its tools (which
    chat templates render in the system turn, after its text), then the other system and
    developer messages before the first of another role. Its `cache_salt` and model begin every
    digest: two tenants, or two models, never match (11.6)."""
    digest = hashlib.blake2b(orjson.dumps([chat.get("cache_salt"), chat.get("model")]), digest_size=16)
    tie = digest.hexdigest()
    digests: list[str] = []
    ends: list[int] = []
    read = 0
    for part in _leading(chat):
        for start in range(0, len(part), BLOCK):
            piece = part[start : start + BLOCK]
            digest.update(piece)
            read += len(piece)
            digests.append(digest.hexdigest())
            ends.append(read)
            if len(digests) == DIGESTS:
                return Prefix(tuple(digests), tuple(ends), digests[0], size)
    return Prefix(tuple(digests), tuple(ends), digests[0] if digests else tie, size)


def _leading(chat: Mapping[str, Any]) -> Iterator[bytes]:
    messages = chat.get("messages")
    tools = orjson.dumps(chat["tools"]) if chat.get("tools") else b""
    for message in messages if isinstance(messages, list) else ():
        if not (isinstance(message, dict) and message.get("role") in _LEADING_ROLES):
            break
        yield orjson.dumps([message.get("role"), message.get("content")])
        yield tools
        tools = b""
    yield tools


def place(
    prefix: Prefix, held: Sequence[Collection[str]], loads: Mapping[str, int], usable: Sequence[R], factor: float
) -> tuple[list[R], int]:
    """The replicas to try for a new session, best first, and the bytes of its leading part the
    first was sent last (0: none). `held[i]`: the replicas that last received `digests[i]`.

    The bound: a replica takes the session while, with it, it holds at most `factor` times the
    mean of the sessions held, or SLACK more than the mean where that is more (design.md
    11.5), and carries fewer requests in flight than a known session would spill at (11.2).
    The longest prefix held by a replica within it wins, the least loaded of its holders
    first; else the least loaded replica, those over the bound on sessions last and, before
    them, those over the bound in flight: a replica busy for a moment may take a session where
    one past its share of sessions would keep it. Ties go by the prefix's own order of the
    replicas (rendezvous hashing of `tie`)."""
    cap = in_flight_cap(usable, factor)
    mean = (sum(loads.get(replica.url, 0) for replica in usable) + 1) / len(usable)
    bound = max(factor * mean, mean + SLACK)

    def standing(replica: R) -> tuple[bool, bool, int]:
        load = loads.get(replica.url, 0)
        return load + 1 > bound, replica.outstanding >= cap, load

    order = sorted(ranked(prefix.tie, usable), key=standing)
    within = [replica for replica in order if not any(standing(replica)[:2])]
    for index in reversed(range(min(len(held), len(prefix.digests)))):
        holder = next((replica for replica in within if replica.url in held[index]), None)
        if holder is not None:
            return [holder, *(replica for replica in order if replica is not holder)], prefix.ends[index]
    return order, 0


def stale(prefix: Prefix, matched: int, prompt: int, cached: int) -> list[str]:
    """The digests a replica no longer holds, by the usage of a session placed there for
    `matched` bytes: none when its cache covered at least half of them (as the request's bytes
    weigh its prompt tokens), else those past what it covered (design.md 11.5)."""
    covered = cached * prefix.size // prompt if prompt > 0 else matched
    return [] if 2 * covered >= matched else prefix.past(covered)


class SessionLoads:
    """The sessions each replica holds, as this process routes them: those whose last call it
    served within `window` seconds, at most `size` of them (the least recently active first
    out); and when it last reported each to a shared count (design.md 11.5)."""

    def __init__(self, window: float, size: int = 100_000) -> None:
        self._window = window
        self._size = size
        self._last: OrderedDict[str, tuple[str, float, float]] = OrderedDict()
        self._held: Counter[str] = Counter()

    def touch(self, session: str, replica: str, now: float) -> bool:
        """A call of `session` served by `replica` at `now`; whether a shared count should hear
        of it: a session new to this process, moved, or last reported a REPORTS-th of the
        window ago (its count there would soon lapse)."""
        before = self.drop(session)
        report = before is None or before[0] != replica or before[2] <= now - self._window / REPORTS
        self._last[session] = (replica, now, now if report or before is None else before[2])
        self._held[replica] += 1
        if len(self._last) > self._size:
            self._drop()
        return report

    def drop(self, session: str) -> tuple[str, float, float] | None:
        """The session holds no replica (one placed and never sent); what was known of it: its
        replica, its last call, its last report."""
        before = self._last.pop(session, None)
        if before is not None:
            self._held[before[0]] -= 1
        return before

    def held(self, now: float) -> Mapping[str, int]:
        """Sessions by replica, as of `now`."""
        while self._last and next(iter(self._last.values()))[1] <= now - self._window:
            self._drop()
        return self._held

    def _drop(self) -> None:
        _, (replica, _, _) = self._last.popitem(last=False)
        self._held[replica] -= 1


class Computing:
    """The prefixes being computed (design.md 11.5), where the engine shares a prefix once
    prefilled: the digests a new session's replica computes for it (past what the index said it
    held), until the first bytes of its answer's body; another new session of the prompt placed
    there waits for them rather than computing them beside it."""

    def __init__(self) -> None:
        self._events: dict[str, dict[str, asyncio.Event]] = {}

    def begin(self, digests: Sequence[str], replica: str) -> asyncio.Event:
        done = asyncio.Event()
        for digest in digests:
            self._events.setdefault(digest, {}).setdefault(replica, done)
        return done

    def end(self, digests: Sequence[str], replica: str, done: asyncio.Event) -> None:
        done.set()
        for digest in digests:
            computing = self._events.get(digest)
            if computing is not None and computing.get(replica) is done:
                del computing[replica]
                if not computing:
                    del self._events[digest]

    async def wait(self, digest: str, replica: str, timeout: float) -> None:
        """Until `replica` has computed `digest` (its answer's first bytes came), at most
        `timeout` seconds."""
        done = self._events.get(digest, {}).get(replica)
        if done is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await done.wait()
