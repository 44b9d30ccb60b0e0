"""What every proxied endpoint does first: read the JSON body, find the upstream for its model."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import hdrs, web

from ..appkeys import MODEL_PATTERN, OWNER, REQUEST_ID, RUNTIME
from ..config import Target, served_models
from ..errors import InvalidRequest, NotFound, PayloadTooLarge, ProxyError, RequestTimeout, ServerShuttingDown, UnsupportedMediaType
from ..store import ResponseStore, StoredResponse
from ..upstream.client import UpstreamClient

log = logging.getLogger("proxy")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients skip it, idle timers see bytes
_JSON_TYPES = {"application/json", "application/octet-stream"}  # the latter: no Content-Type sent
# zlib's window bits for each Content-Encoding: gzip with its header and trailer checked;
# deflate as the zlib stream HTTP means by it (or gzip: zlib tells them apart).
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 47}


async def read_body(request: web.Request) -> bytes:
    """The JSON body, decompressed, within the configured size (counted decompressed). The
    proxy decompresses itself, strictly: a gzip body must end with its checksum and size, and
    an encoding it does not know is refused, not read as plain bytes (design.md 5.8)."""
    if request.content_type not in _JSON_TYPES:
        raise UnsupportedMediaType(f"Content-Type must be application/json, not {request.content_type}.")
    config = request.app[RUNTIME].config
    limit = config.max_body_bytes
    decompressor = _decompressor(request.headers.get(hdrs.CONTENT_ENCODING, ""))
    content = request.content
    if decompressor is None and content.is_eof():
        # Most bodies: plain, and whole with the headers. Nothing to time or to build.
        body = content.read_nowait()
        if len(body) > limit:
            raise _too_large(limit)
        return body
    if decompressor is None and (request.content_length or 0) > limit:
        raise _too_large(limit)
    pieces: list[bytes] = []
    size = 0

    def take(piece: bytes) -> None:
        nonlocal size
        for data in _decompressed(decompressor, piece, limit - size + 1):
            size += len(data)
            if size > limit:
                raise _too_large(limit)
            pieces.append(data)
        if decompressor is not None and decompressor.unused_data:
            raise _cut()  # at once: what follows the compressed stream is neither read nor kept

    timeout = config.connections.body_timeout
    try:
        if content.is_eof():  # a compressed body that came whole: no timer either
            take(content.read_nowait())
        else:
            async with asyncio.timeout(timeout):  # a body trickled in holds a connection (design.md 5.11)
                async for piece in content.iter_any():
                    take(piece)
    except web.RequestPayloadError:  # a broken chunked transfer
        raise InvalidRequest("The request body could not be read: its transfer encoding is broken.") from None
    except zlib.error:
        raise InvalidRequest("The request body could not be decompressed: it is corrupt.") from None
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {timeout:g} s.") from None
    if decompressor is not None and not decompressor.eof:
        raise _cut()
    return b"".join(pieces)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")


def _cut() -> InvalidRequest:
    return InvalidRequest("The compressed request body is cut short or followed by other data.")


def _decompressor(encoding: str) -> Any:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in _WBITS:
        return zlib.decompressobj(wbits=_WBITS[encoding])
    raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or none.", param="Content-Encoding")


def _decompressed(decompressor: Any, data: bytes, room: int) -> Iterator[bytes]:
    """`data` through the decompressor, in pieces of at most `room` bytes: a bomb is caught
    before it is inflated."""
    if decompressor is None:
        yield data
        return
    while data:
        yield decompressor.decompress(data, room)
        data = decompressor.unconsumed_tail


def load_json(body: bytes, max_depth: int) -> Any:
    """A request body as JSON, for every endpoint that takes one, nested at most `max_depth`
    levels (design.md 5.8)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    # Nesting needs an opening bracket a level: a body with fewer is not walked.
    too_deep = _too_deep(data, max_depth) if body.count(b"{") + body.count(b"[") > max_depth else None
    if too_deep is not None:
        raise InvalidRequest(f"'{too_deep}' is nested more than {max_depth} levels deep.", param=too_deep)
    return data


def _too_deep(data: Any, limit: int) -> str | None:
    """The field under which `data` nests deeper than `limit` (its path told down to the third
    level), or None."""
    stack = [(data, 1, "")] if isinstance(data, dict | list) else []
    while stack:
        node, depth, path = stack.pop()
        for key, child in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(child, dict | list):
                if depth <= 3:
                    at = f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
                    child_path = path + at
                else:
                    child_path = path
                if depth >= limit:
                    return child_path
                stack.append((child, depth + 1, child_path))
    return None


def find_target(request: web.Request, model: str) -> tuple[Target, UpstreamClient]:
    runtime = request.app[RUNTIME]
    if runtime.draining:  # new generations go to a replica that stays (design.md 5.10)
        raise ServerShuttingDown("The proxy is shutting down; retry on another replica.")
    found = runtime.target(model)
    if found is None:
        served = ", ".join(served_models(runtime.config))
        raise NotFound(f"The model '{model}' is not served here. Served: {served}.", param="model", code="model_not_found")
    request[MODEL_PATTERN] = found[0].pattern
    return found


def upstream_headers(request: web.Request) -> dict[str, str]:
    return {"X-Request-ID": request[REQUEST_ID]}


def store_of(request: web.Request) -> ResponseStore:
    store = request.app[RUNTIME].store
    if store is None:
        raise NotFound("This proxy keeps no responses (its config says store: none).")
    return store


async def find_stored(request: web.Request, id: str) -> StoredResponse:
    """A stored response of the request's key; anyone else's is as unknown (design.md 9.5)."""
    stored = await store_of(request).get(id, request[OWNER])
    if stored is None:
        raise NotFound(f"No response with id '{id}'.", param="response_id")
    return stored


def json_response(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


@contextlib.contextmanager
def cut_short_on_failure(request: web.Request) -> Iterator[None]:
    """Around a stream whose headers are sent: a failure can only cut it short, the client
    seeing it end without its last chunk (design.md 5.9); a client that left needs nothing."""
    try:
        yield
    except ProxyError as error:
        log.warning("%s %s: the stream is cut short: %s", request.method, request.path, error.message, extra={"request_id": request[REQUEST_ID]})
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
    between the proxy and the client from cutting a long prefill (design.md 4.11). A client that takes nothing for `client_idle` seconds, or
    whose stream outlives the exchange's `total` with a write still pending, is let go: its
    connection closes, and with it the upstream request (design.md 4.12). A timer, not a
    timeout per write: writes come thousands of times a second."""

    __slots__ = ("_request", "_response", "_keepalive", "_client_idle", "_deadline", "_loop", "_last", "_writing_since", "_timer", "_beat")

    def __init__(self, request: web.Request, response: web.StreamResponse, keepalive: float | None, client_idle: float, deadline: float | None) -> None:
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
        if writing is not None and (now - writing >= self._client_idle or (self._deadline is not None and now >= self._deadline)):
            self._timer = None
            if self._request.transport is not None:
                self._request.transport.abort()  # the pending write fails; the handler ends
            return
        if writing is None and self._keepalive is not None and now - self._last >= self._keepalive and (self._beat is None or self._beat.done()):
            # The relay is waiting on the upstream, so this write interleaves with none of its own.
            self._beat = asyncio.create_task(self._send_keepalive())
            self._last = now
        self._timer = self._loop.call_at(max(self._due(now), now + 0.01), self._check)

    async def _send_keepalive(self) -> None:
        if self._writing_since is not None:  # the relay began a write, maybe its last, meanwhile
            return
        with contextlib.suppress(ConnectionError):  # the client left: the relay finds out too
            await self.write(KEEPALIVE)
