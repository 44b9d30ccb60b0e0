"""The Responses API over a WebSocket (design.md 8.9): `GET /v1/responses` upgraded, as Codex
(`supports_websockets`) and openai-agents (its websocket transport) use it. Each
`response.create` frame is one turn, answered by the same events as over SSE, each event's JSON
a text frame; one turn at a time on a connection; the responses made on it can be continued
with `previous_response_id` on it even when they are not stored."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import OrderedDict, deque

import orjson
from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from ..appkeys import REQUEST_ID, RUNTIME
from ..errors import InvalidRequest, ProxyError, TooManyRequests, UpgradeRequired
from ..responses import compaction
from ..responses.body import load_json
from ..responses.lifecycle import completed, new_id, usage_object, whole_stream
from ..responses.translate import ResponseTranslator
from ..store import StoredResponse
from ..turns import rounds
from ..turns.compaction import compacted_turn
from ..turns.turn import Turn, log_failure
from . import stored
from .common import plan

log = logging.getLogger("proxy")
# The responses of one connection kept for `previous_response_id`: an agent continues the last
# one; a few more cost little.
_KEPT = 16


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the WebSocket transport when the request asks for the upgrade, else
    the list of stored responses (design.md 9.3)."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return await stored.listed(request)
    config = request.app[RUNTIME].config
    if not config.connections.websockets:
        raise UpgradeRequired("The WebSocket transport is off on this proxy: POST /v1/responses instead.")
    socket = web.WebSocketResponse(max_msg_size=config.max_body_bytes)
    await socket.prepare(request)
    connection = _Connection(request, socket)
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + config.connections.websocket_lifetime
    # The socket is read while a turn runs, so that a client's close stops its generation at
    # once (design.md 4.10); frames that come meanwhile wait their turn, within a bound (8.9).
    waiting: deque[str | bytes] = deque()
    # The bytes the frames waiting hold in memory: a text frame's str takes up to 4 a character
    # (one emoji makes a whole str so), more than its length says.
    queued = 0
    receiving: asyncio.Task[WSMessage] | None = None
    turn: asyncio.Task[None] | None = None
    try:
        while True:
            if turn is None and waiting:
                queued -= sys.getsizeof(waiting[0])
                turn = asyncio.create_task(connection.turn(waiting.popleft()))
            if receiving is None and loop.time() < ends_at:
                receiving = asyncio.create_task(socket.receive(timeout=max(0.0, ends_at - loop.time())))
            running = {task for task in (receiving, turn) if task is not None}
            if not running:
                break  # its lifetime is over, between two turns
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            if turn in done:
                turn = None
            if receiving in done:
                try:
                    message = receiving.result()
                except TimeoutError:  # its lifetime is over: the turn running ends first
                    message = None
                receiving = None
                if message is not None and message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    queued += sys.getsizeof(message.data)
                    if len(waiting) >= config.connections.websocket_queue or (
                        queued > config.connections.websocket_queue_bytes and waiting
                    ):
                        await connection.overflowed()
                        break  # the turn running stops, and what waits goes
                    waiting.append(message.data)
                elif message is not None:
                    break  # closed: a turn still running stops, and its upstream request with it
    finally:
        for task in (receiving, turn):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(task for task in (receiving, turn) if task is not None), return_exceptions=True)
    await socket.close()
    return socket


class _Connection:
    def __init__(self, request: web.Request, socket: web.WebSocketResponse) -> None:
        self._request = request
        self._socket = socket
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def _keep_here(self, stored: StoredResponse) -> None:
        self._kept[stored.id] = stored
        self._kept.move_to_end(stored.id)
        while len(self._kept) > _KEPT:
            self._kept.popitem(last=False)

    async def turn(self, raw: str | bytes) -> None:
        """One `response.create` frame: its events, or an `error` frame (the connection stays)."""
        request = self._request
        try:
            data = raw.encode() if isinstance(raw, str) else raw
            frame = load_json(data, request.app[RUNTIME].config.requests.max_depth)
            if not isinstance(frame, dict) or frame.get("type") != "response.create":
                raise InvalidRequest("Send `response.create` frames.", param="type")
            body = {key: value for key, value in frame.items() if key not in ("type", "generate")}
            if body.get("background"):
                raise InvalidRequest("A background response is made over HTTP, not on a WebSocket.", param="background")
            turn = await plan(request, {**body, "stream": True}, self._kept, self._keep_here)
            try:
                if frame.get("generate") is False:
                    await self._prepared(turn)
                elif compaction.triggered(turn.past.request):
                    await self.send_events(whole_stream(await compacted_turn(turn)), turn)
                else:
                    await self._generated(turn)
            finally:
                await turn.release()
        except ProxyError as error:
            log_failure(error, f"{request.method} {request.path}", request[REQUEST_ID])
            await self._send_error(error.for_client(request[REQUEST_ID]))
        except ClientGone:
            if request.transport is not None:
                request.transport.abort()  # the reader sees the socket closed, and the loop ends
        except Exception:  # not foreseen: logged whole, answered in the envelope (design.md 5.9)
            log.exception("a WebSocket turn failed", extra={"request_id": request[REQUEST_ID]})
            await self._send_error(ProxyError(f"internal error; request id {request[REQUEST_ID]}"))

    async def _generated(self, turn: Turn) -> None:
        started = time.monotonic()
        translator = turn.translator()
        sink = _SocketSink(self, translator, turn)
        try:
            async with turn.post() as exchange:
                await sink.write(translator.start())
                await rounds.answer(translator, exchange, sink)
            await rounds.go_on(turn, translator, sink)
        except ProxyError as error:
            if not error.in_stream:
                raise
            # An error clients act on from the event (design.md 8.7): a stream of its own.
            await sink.write(translator.start() + translator.fail(error))
        log_failure(translator.error, f"{self._request.method} {self._request.path}", self._request[REQUEST_ID])
        if translator.response is not None:
            turn.answered(translator.response, started, None)

    async def _prepared(self, turn: Turn) -> None:
        """`generate: false`: the request's state kept without output, for a later turn to
        continue with `previous_response_id` (a client prewarming its connection)."""
        response = completed(new_id("resp"), int(time.time()), [], turn.call.echo, usage_object(None))
        await turn.keep(response)
        await self.send_events(whole_stream(response), turn)

    async def send_events(self, sse: bytes, turn: Turn) -> None:
        """SSE-framed events as the transport's frames, each event's JSON alone. A client that
        takes nothing for its upstream's `client_idle` is let go, its turn and upstream request
        with it (4.12)."""
        try:
            async with asyncio.timeout(turn.target.upstream.timeouts.client_idle):
                for event in sse.split(b"\n\n"):
                    data = event.partition(b"data: ")[2]
                    if data and data != b"[DONE]":
                        await self._socket.send_str(data.decode())
        except TimeoutError:
            raise ClientGone("the client took nothing for client_idle") from None

    async def overflowed(self) -> None:
        """More frames came while a turn ran than the connection may queue (design.md 8.9):
        said in an error frame, then the connection closes (1008)."""
        limits = self._request.app[RUNTIME].config.connections
        await self._send_error(
            TooManyRequests(
                f"More than {limits.websocket_queue} frames or {limits.websocket_queue_bytes} bytes waited for the "
                "turn running on this connection; send the next when it ends.",
                param="type",
            )
        )
        await self._socket.close(code=WSCloseCode.POLICY_VIOLATION, message=b"too many frames queued")

    async def _send_error(self, error: ProxyError) -> None:
        """The transport's error frame: the error's envelope, with its status."""
        await self._socket.send_str(
            orjson.dumps({"type": "error", "status": error.status, **error.envelope()}).decode()
        )


class ClientGone(Exception):
    """The client stopped reading: the connection ends (its handler cancels the turn)."""


class _SocketSink:
    """The relay's sink on a WebSocket: the finished response kept before its terminal event
    leaves (design.md 9.2), each event a frame."""

    def __init__(self, connection: _Connection, translator: ResponseTranslator, turn: Turn) -> None:
        self._connection = connection
        self._translator = translator
        self._turn = turn

    async def write(self, events: bytes) -> None:
        if self._translator.response is not None:
            await self._turn.keep(self._translator.response)
        await self._connection.send_events(events, self._turn)
