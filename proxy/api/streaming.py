"""Streaming to the client: an SSE response whose headers leave with its first events, one
timer on the client's side of a stream (keep-alives, a client that stops reading), and what a
failure can still do once a stream has begun (design.md 4.10-4.12, 5.9)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from aiohttp import web

from ..appkeys import REQUEST_ID
from ..errors import ProxyError

log = logging.getLogger("proxy")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients skip it, idle timers see bytes


@contextlib.contextmanager
def cut_short_on_failure(request: web.Request) -> Iterator[None]:
    """Around a stream whose headers are sent: a failure can only cut it short, the client
    seeing it end without its last chunk (design.md 5.9); a client that left needs nothing."""
    try:
        yield
    except ProxyError as error:
        log.warning(
            "%s %s: the stream is cut short: %s",
            request.method,
            request.path,
            error.message,
            extra={"request_id": request[REQUEST_ID]},
        )
        if request.transport is not None:
            request.transport.close()
    except ConnectionResetError:
        pass  # leaving the block closes what the stream read from


class EventStream(web.StreamResponse):
    """An SSE response whose headers wait for its first events, to leave in the same write
    (design.md 4.10): for a stream that has events to write as soon as it starts. aiohttp's
    `Response` buffers its headers the same way; should the attribute go, headers go first."""

    _send_headers_immediately = False

    def __init__(self) -> None:
        super().__init__(headers=SSE_HEADERS)


class ClientWatch:
    """One timer on the client's side of a stream. While the upstream is silent, an SSE comment
    every `keepalive` seconds (None: never, for bytes relayed as they came) keeps idle timers
    between the proxy and the client from cutting a long prefill (design.md 4.11). A client that
    takes nothing for `client_idle` seconds, or whose stream outlives the exchange's `total` with
    a write still pending, is let go: its connection closes, and with it the upstream request
    (design.md 4.12). A timer, not a timeout per write: writes come thousands of times a second."""

    __slots__ = (
        "_request",
        "_response",
        "_keepalive",
        "_client_idle",
        "_deadline",
        "_loop",
        "_last",
        "_writing_since",
        "_timer",
        "_beat",
    )

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        keepalive: float | None,
        client_idle: float,
        deadline: float | None,
    ) -> None:
        self._request = request
        self._response = response
        self._keepalive = keepalive
        self._client_idle = client_idle
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()  # the end of the last write
        self._writing_since: float | None = None
        self._beat: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(self._due(self._last), self._check)

    async def write(self, data: bytes, last: bool = False) -> None:
        self._writing_since = self._loop.time()
        try:
            await (self._response.write_eof(data) if last else self._response.write(data))
        finally:
            self._writing_since = None
            self._last = self._loop.time()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._beat is not None:
            self._beat.cancel()  # a beat still waiting to write must not follow the last event

    def _due(self, now: float) -> float:
        """When to look next: a write that began may not be seen for half of `client_idle`,
        since a write starts without touching the timer."""
        writing = self._writing_since
        if writing is not None:
            due = writing + self._client_idle
        else:
            due = now + self._client_idle / 2
            if self._keepalive is not None:
                due = min(due, self._last + self._keepalive)
        return due if self._deadline is None else min(due, self._deadline)

    def _check(self) -> None:
        now = self._loop.time()
        writing = self._writing_since
        if writing is not None and (
            now - writing >= self._client_idle or (self._deadline is not None and now >= self._deadline)
        ):
            self._timer = None
            if self._request.transport is not None:
                self._request.transport.abort()  # the pending write fails; the handler ends
            return
        if (
            writing is None
            and self._keepalive is not None
            and now - self._last >= self._keepalive
            and (self._beat is None or self._beat.done())
        ):
            # The relay is waiting on the upstream, so this write interleaves with none of its own.
            self._beat = asyncio.create_task(self._send_keepalive())
            self._last = now
        self._timer = self._loop.call_at(max(self._due(now), now + 0.01), self._check)

    async def _send_keepalive(self) -> None:
        if self._writing_since is not None:  # the relay began a write, maybe its last, meanwhile
            return
        with contextlib.suppress(ConnectionError):  # the client left: the relay finds out too
            await self.write(KEEPALIVE)
