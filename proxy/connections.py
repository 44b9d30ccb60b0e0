"""Client connections held to time and number (design.md 5.11).

aiohttp closes a new connection whose first request never completes only after its keep-alive
time (75 s): a client that sends its headers a byte at a time holds a file descriptor that long,
and enough of them lock every other client out. Each connection is wrapped: its first request's
headers must be complete within `header_timeout`, and past `max` connections a new one is
closed at once (logged, a line a second at most). The open-file limit is raised to its hard
limit at startup, and `max` defaults to half of it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import cast

from aiohttp import web

from .config import Connections
from .logs import Throttle

log = logging.getLogger("proxy.connections")
_HEADERS_END = b"\r\n\r\n"


def raise_open_file_limit() -> int:
    """The soft limit on open files, raised to the hard one; what it is now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class ConnectionGuard:
    """A protocol factory around aiohttp's: counts connections, refuses past the limit."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], settings: Connections) -> None:
        self._factory = factory
        self.header_timeout = settings.header_timeout
        self.limit = settings.max or raise_open_file_limit() // 2
        self.open = 0
        self._refusals = Throttle()
        self._slow = Throttle()

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.limit:
            return _Refused(self)
        return _Guarded(self, self._factory())

    def refused(self, transport: asyncio.Transport) -> None:
        message = "refused a connection from %s: %d open, the limit (connections.max); %d more since"
        self._drop(transport, self._refusals, message, self.open)

    def too_slow(self, transport: asyncio.Transport) -> None:
        message = "closed a connection from %s: no request headers within %g s; %d more since"
        self._drop(transport, self._slow, message, self.header_timeout)

    def _drop(self, transport: asyncio.Transport, throttle: Throttle, message: str, detail: float) -> None:
        """Close a connection, logged at most once a second for each kind (design.md 5.11)."""
        held = throttle.allow()
        if held is not None:
            log.warning(message, transport.get_extra_info("peername"), detail, held)
        transport.abort()


class _Refused(asyncio.Protocol):
    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._guard.refused(cast(asyncio.Transport, transport))


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the count and the header timer around it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen, for a header end split across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._guard.open += 1
        self._timer = asyncio.get_running_loop().call_later(
            self._guard.header_timeout, self._guard.too_slow, cast(asyncio.Transport, transport)
        )
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if _HEADERS_END in seen:
                self._timer.cancel()
                self._timer = None
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.open -= 1
        if self._timer is not None:
            self._timer.cancel()
        self._inner.connection_lost(exc)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through a `ConnectionGuard`."""

    __slots__ = ("_host", "_port", "_reuse_port", "_settings", "guard")

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, settings: Connections, *, reuse_port: bool = False
    ) -> None:
        super().__init__(runner, backlog=1024)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self._settings = settings
        self.guard: ConnectionGuard | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self.guard = ConnectionGuard(server, self._settings)
        self._server = await asyncio.get_running_loop().create_server(
            self.guard,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
            reuse_port=self._reuse_port or None,
        )
