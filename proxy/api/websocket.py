"""The Responses API over a WebSocket (design.md 8.9): `GET /v1/responses` upgraded, as Codex
(`supports_websockets`) and openai-agents (its websocket transport) use it. Each
`response.create` frame is one turn, answered by the same events as over SSE, each event's JSON
a text frame; one turn at a time on a connection; the responses made on it can be continued
with `previous_response_id` on it even when they are not stored."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from ..appkeys import REQUEST_ID, RUNTIME
from ..errors import InvalidRequest, ProxyError, UpgradeRequired
from ..relay import relay
from ..responses import compaction
from ..responses.lifecycle import new_id, response_object, usage_object
from ..responses.translate import ResponseTranslator
from ..store import StoredResponse
from .calls import Keep, Turn, plan_turn
from .compact import compacted_turn
from .responses import count_usage

# The responses of one connection kept for `previous_response_id`: an agent continues the last
# one; a few more cost little.
_KEPT = 16


async def responses_socket(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise web.HTTPMethodNotAllowed(request.method, ["POST"])
    config = request.app[RUNTIME].config
    if not config.connections.websockets:
        raise UpgradeRequired("The WebSocket transport is off on this proxy: POST /v1/responses instead.")
    socket = web.WebSocketResponse(max_msg_size=config.max_body_bytes)
    await socket.prepare(request)
    connection = _Connection(request, socket)
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + config.connections.websocket_lifetime
    while not socket.closed:
        try:
            message = await socket.receive(timeout=max(0.0, ends_at - loop.time()))
        except TimeoutError:  # its lifetime is over, between two turns
            break
        if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            await connection.turn(message.data)
        elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            break
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
            try:
                frame = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise InvalidRequest(f"The frame is not valid JSON: {exc}") from None
            if not isinstance(frame, dict) or frame.get("type") != "response.create":
                raise InvalidRequest("Send `response.create` frames.", param="type")
            body = {key: value for key, value in frame.items() if key not in ("type", "generate")}
            turn, _ = await plan_turn(request, {**body, "stream": True}, self._kept, self._keep_here)
            if turn.call.background:
                raise InvalidRequest("A background response is made over HTTP, not on a WebSocket.", param="background")
            if frame.get("generate") is False:
                await self._prepared(turn)
            elif compaction.triggered(turn.past.request):
                response, item = await compacted_turn(request, turn)
                await self.send_events(compaction.turn_events(response, item))
            else:
                await self._generated(turn)
        except ProxyError as error:
            shown = error.for_client(request[REQUEST_ID])
            await self._send({"type": "error", "status": shown.status, **shown.envelope()})

    async def _generated(self, turn: Turn) -> None:
        translator = turn.translator(self._request)
        sink = _SocketSink(self, translator, turn.keep)
        async with turn.post(self._request) as exchange:
            await sink.write(translator.start())
            if await relay(translator, exchange, sink):
                await exchange.drain()
        if translator.response is not None:
            count_usage(self._request, turn, translator.response)

    async def _prepared(self, turn: Turn) -> None:
        """`generate: false`: the request's state kept without output, for a later turn to
        continue with `previous_response_id` (a client prewarming its connection)."""
        now = int(time.time())
        response = response_object(new_id("resp"), now, "completed", [], turn.call.echo)
        response.update(completed_at=now, usage=usage_object(None))
        await turn.keep(response)
        await self.send_events(compaction.turn_events(response, None))

    async def send_events(self, sse: bytes) -> None:
        """SSE-framed events as the transport's frames: each event's JSON alone."""
        for event in sse.split(b"\n\n"):
            data = event.partition(b"data: ")[2]
            if data and data != b"[DONE]":
                await self._socket.send_str(data.decode())

    async def _send(self, event: dict[str, Any]) -> None:
        await self._socket.send_str(orjson.dumps(event).decode())


class _SocketSink:
    """The relay's sink on a WebSocket: the finished response kept before its terminal event
    leaves (design.md 9.2), each event a frame."""

    def __init__(self, connection: _Connection, translator: ResponseTranslator, keep: Keep) -> None:
        self._connection = connection
        self._translator = translator
        self._keep = keep

    async def write(self, events: bytes) -> None:
        if self._translator.response is not None:
            await self._keep(self._translator.response)
        await self._connection.send_events(events)
