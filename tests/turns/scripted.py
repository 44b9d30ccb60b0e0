"""The turn layer's seam (design.md 2.1, 2.3): a turn planned as a transport plans it and run
through the one entry every transport takes (`Turn.run(sink)`), into an in-memory sink, its
upstream client's exchanges scripted as httpx's `MockTransport` scripts a client's: each call
takes the next reply, SGLang's chat chunks rendered by the fake upstream's `Generation`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.errors import ProxyError
from proxy.runtime import Runtime
from proxy.sink import Client
from proxy.turns.rounds import Asks
from proxy.turns.turn import Caller, Turn, plan_turn, routed
from tests.client import parse_sse
from tests.events import sse
from tests.fake_upstream import Generation

# The events that end a Response, as SSE: a cancelled one ends with `response.failed` (10.3).
TERMINAL = (b"event: response.completed\n", b"event: response.incomplete\n", b"event: response.failed\n")


@dataclass
class Streamed:
    """A streamed answer, in `pieces` reads (the SSE cut evenly); `broken`: raised by the read
    after the last piece, as the client raises a connection that broke."""

    generation: Generation
    pieces: int = 3
    broken: ProxyError | None = None


@dataclass
class Whole:
    """A whole (non-streaming) answer's body."""

    generation: Generation


@dataclass
class Refused:
    """The upstream's answer an error status, or no answer: raised where the call is entered."""

    error: ProxyError


@dataclass
class Silent:
    """An upstream that takes the call and sends nothing, not even its headers."""


Reply = Streamed | Whole | Refused | Silent


@dataclass
class Exchange:
    """One scripted upstream call past its headers: what the turn reads of it, and how it ended."""

    reads: deque[bytes | ProxyError]
    body: bytes = b""
    deadline: float = field(default_factory=lambda: asyncio.get_running_loop().time() + 600)
    drained: bool = False
    closed: bool = False

    async def read_chunk(self) -> bytes:
        await asyncio.sleep(0)  # a read yields, as a socket's does
        read = self.reads.popleft() if self.reads else b""
        if isinstance(read, ProxyError):
            raise read
        return read

    async def read_body(self) -> bytes:
        return self.body

    async def drain(self) -> None:
        self.drained = True


class Upstream:
    """An upstream client whose calls are scripted: each takes the next reply. It records every
    call's path and body, and every exchange."""

    keyed = False  # no session is worked out for it (11.1)

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.exchanges: list[Exchange] = []
        self.open_at_post: list[int] = []  # the exchanges still open when each call was made

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    @contextlib.asynccontextmanager
    async def post(
        self, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None, **_: Any
    ) -> AsyncIterator[Exchange]:
        assert isinstance(body, dict)
        self.requests.append((path, body))
        self.open_at_post.append(sum(not exchange.closed for exchange in self.exchanges))
        reply = self.replies.popleft()
        if isinstance(reply, Refused):
            raise reply.error
        if isinstance(reply, Silent):
            await asyncio.Event().wait()
        if isinstance(reply, Whole):
            exchange = Exchange(deque(), orjson.dumps(reply.generation.completion()))
        else:
            assert isinstance(reply, Streamed)
            data = sse(reply.generation.chunks())
            size = -(-len(data) // reply.pieces)
            reads: deque[bytes | ProxyError] = deque(data[at : at + size] for at in range(0, len(data), size))
            if reply.broken is not None:
                reads.append(reply.broken)
            exchange = Exchange(reads)
        self.exchanges.append(exchange)
        try:
            yield exchange
        finally:
            exchange.closed = True

    async def close(self) -> None:
        pass


class Sink:
    """A transport's sink in memory: when it was opened (the deadline it was told), every write,
    where its client stands; `at_end`, awaited as the write that ends the Response arrives (what
    the test reads of the store then); `fail_at`: the write after which it raises `raising` (a
    client gone, a steer)."""

    def __init__(
        self,
        client: Client = Client.GONE,
        at_end: Callable[[], Awaitable[Any]] | None = None,
        fail_at: int | None = None,
        raising: BaseException | None = None,
    ) -> None:
        self.client = client
        self.opened_with: list[float | None] = []
        self.writes: list[bytes] = []
        self.at_end = at_end
        self.seen_at_end: Any = None
        self._fail_at = fail_at
        self._raising = raising

    async def opened(self, deadline: float | None) -> None:
        self.opened_with.append(deadline)

    async def write(self, events: bytes) -> None:
        if self.at_end is not None and any(head in events for head in TERMINAL):
            self.seen_at_end = await self.at_end()
        self.writes.append(events)
        if self._fail_at is not None and len(self.writes) == self._fail_at + 1:
            assert self._raising is not None
            raise self._raising

    @property
    def events(self) -> list[dict[str, Any]]:
        data = b"".join(self.writes)
        return parse_sse(data if data.endswith(b"data: [DONE]\n\n") else data + b"data: [DONE]\n\n")


async def planned(runtime: Runtime, body: dict[str, Any], asks: Asks = Asks.RESPONSE) -> Turn:
    """A turn planned as a transport plans one: routed, then planned for its caller."""
    caller = Caller("", "req_turn", None, time.monotonic(), "POST /v1/responses")
    return await plan_turn(runtime, caller, routed(runtime, body), asks)
