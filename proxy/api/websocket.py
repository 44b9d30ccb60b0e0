"""The Responses API over a WebSocket (design.md 8.9, 8.14): `GET /v1/responses` upgraded, as
Codex (`supports_websockets`), openai-agents (its websocket transport) and the openai SDK's
WebSocket session use it. Each `response.create` frame is one turn, answered by the same events as
over SSE, each event's JSON a text frame; the turns of one lane (`stream_id`) run one at a time,
in order, those of different lanes at once, each event echoing its lane; a `response.steer` frame
queues user input for a running turn, which stops for it and is followed by a successor that
takes it. The responses made on a connection can be continued with `previous_response_id` on it
even when they are not stored."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections import OrderedDict, deque
from typing import Any, NamedTuple

import orjson
from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from ..appkeys import REQUEST_ID, RUNTIME
from ..errors import ClientLeft, InvalidRequest, ProxyError, TooManyRequests, UpgradeRequired
from ..responses import steering
from ..responses.body import load_json
from ..responses.lifecycle import new_id
from ..responses.steering import SteerRefused
from ..sink import Client, Steered
from ..turns.keeping import Connection
from ..turns.rounds import Asks
from ..turns.turn import Turn, log_failure
from . import stored
from .common import plan

log = logging.getLogger("proxy")
# The responses that ended on a connection, and the steers waiting for their continuation,
# remembered: the last few.
_KEPT = 16
# The SDK's rule for a lane's name.
_LANE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# Steers one response may hold before it takes them.
_MAX_STEERS = 16


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
    await _Connection(request, socket).serve()
    await socket.close()
    return socket


# A frame waiting for its turn: its lane (`stream_id`; None: frames that name none), the frame as
# it came (its JSON read again when its turn comes: parsed, a frame takes many times its size,
# 8.9) or why it is none, and its size.
class _Waiting(NamedTuple):
    lane: str | None
    frame: bytes | ProxyError
    size: int


class _Running:
    """A response running on the connection, which a steer may name (design.md 8.14): its lane,
    the create frame it came from (what a successor inherits), and the steers it holds."""

    __slots__ = ("lane", "body", "steerable", "steers")

    def __init__(self, lane: str | None, body: dict[str, Any], steerable: bool) -> None:
        self.lane, self.body, self.steerable = lane, body, steerable
        self.steers: list[Steer] = []


# A steer held, until a successor takes it or it is returned.
class Steer(NamedTuple):
    id: str
    messages: list[dict[str, Any]]  # the user messages it adds
    sent: Any  # its input as the client sent it, to return it so
    size: int  # of its frame, against the bound on held steers


class _Connection:
    def __init__(self, request: web.Request, socket: web.WebSocketResponse) -> None:
        self._request = request
        self._socket = socket
        self._responses = Connection()  # kept for `previous_response_id` on it (8.9)
        self._lanes: dict[str | None, asyncio.Task[None]] = {}  # each lane's turn running
        self._frames: deque[_Waiting] = deque()  # in the order they came, over all lanes
        self._running: dict[str, _Running] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()  # responses that ended here, the last few
        # The steers of responses that stopped for their client, the last few (8.14).
        self._waiting_for_client: OrderedDict[str, list[Steer]] = OrderedDict()
        self._steer_events = 0  # the sequence numbers of the connection's own events (steering's)

    async def serve(self) -> None:
        """Read frames until the client closes, or the connection's lifetime is over between two
        turns. The socket is read while turns run, so that a client's close stops their
        generations at once (design.md 4.10) and a steer reaches its turn; frames that come
        meanwhile wait their lane's turn, within a bound over all lanes (8.9)."""
        config = self._request.app[RUNTIME].config
        limits = config.connections
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + limits.websocket_lifetime
        # The bytes the frames waiting hold in memory: a text frame's str takes up to 4 a
        # character (one emoji makes a whole str so), more than its length says.
        self._queued = 0
        receiving: asyncio.Task[WSMessage] | None = None
        try:
            while True:
                self._start_turns(limits.websocket_lanes)
                if receiving is None and loop.time() < ends_at:
                    receiving = asyncio.create_task(self._socket.receive(timeout=max(0.0, ends_at - loop.time())))
                running: set[asyncio.Task[Any]] = set(self._lanes.values())
                if receiving is not None:
                    running.add(receiving)
                if not running:
                    break  # its lifetime is over, between two turns
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                self._lanes = {lane: task for lane, task in self._lanes.items() if task not in done}
                if receiving in done:
                    try:
                        message = receiving.result()
                    except TimeoutError:  # its lifetime is over: the turns running end first
                        message = None
                    receiving = None
                    if message is not None and message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                        if not await self._take(message.data, limits.websocket_queue, limits.websocket_queue_bytes):
                            break  # overflowed: the turns running stop, and what waits goes
                    elif message is not None:
                        break  # closed: the turns still running stop, and their upstream requests with them
        finally:
            tasks = [task for task in (receiving, *self._lanes.values()) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _take(self, raw: str | bytes, most: int, most_bytes: int) -> bool:
        """A frame read: a steer taken at once (its turn is running), any other queued on its
        lane; False where the frames waiting are past the bound (design.md 8.9)."""
        size = sys.getsizeof(raw)
        data = raw.encode() if isinstance(raw, str) else raw
        queued: bytes | ProxyError = data
        try:
            frame = load_json(data, self._config().requests.max_depth)
        except ProxyError as error:
            frame = queued = error  # answered in its turn, on the lane of frames that name none
        lane = frame.get("stream_id") if isinstance(frame, dict) else None
        if isinstance(frame, dict) and frame.get("type") == "response.steer":
            await self.steer(frame, size, most_bytes)
            return True
        if lane is not None and not (isinstance(lane, str) and _LANE.fullmatch(lane)):
            queued, lane = (
                InvalidRequest("'stream_id' is 1 to 256 letters, digits, '_', '-' or '.'.", param="stream_id"),
                None,
            )
        self._frames.append(_Waiting(lane, queued, size))
        self._queued += size
        if len(self._frames) > most or (self._queued > most_bytes and len(self._frames) > 1):
            await self.overflowed()
            return False
        return True

    def _start_turns(self, most: int) -> None:
        """The frames waiting, in the order they came, each started once its lane is free, while
        fewer than `most` lanes run (design.md 8.14): a frame whose lane is busy is passed by
        the later frames of other lanes, never by its own lane's."""
        waiting: deque[_Waiting] = deque()
        for frame in self._frames:
            if frame.lane in self._lanes or len(self._lanes) >= most:
                waiting.append(frame)
                continue
            self._queued -= frame.size
            self._lanes[frame.lane] = asyncio.create_task(self.turn(frame.frame, frame.lane))
        self._frames = waiting

    def _config(self) -> Any:
        return self._request.app[RUNTIME].config

    async def turn(self, raw: bytes | ProxyError, lane: str | None) -> None:
        """One `response.create` frame: its events (and its successors', where it was steered),
        or an `error` frame (the connection stays). A client that stopped reading, met while
        sending its events or telling a failure, ends the connection."""
        request = self._request
        try:
            await self._create(raw, lane)
        except ClientGone:
            if request.transport is not None:
                request.transport.abort()  # the reader sees the socket closed, and the loop ends

    async def _create(self, raw: bytes | ProxyError, lane: str | None) -> None:
        request = self._request
        steers: list[Steer] = []
        body: dict[str, Any] = {}
        try:
            if isinstance(raw, ProxyError):
                raise raw
            frame = load_json(raw, self._config().requests.max_depth)
            if not isinstance(frame, dict) or frame.get("type") != "response.create":
                raise InvalidRequest("Send `response.create` frames (or `response.steer`).", param="type")
            body = {key: value for key, value in frame.items() if key not in ("type", "generate", "stream_id")}
            if body.get("background"):
                raise InvalidRequest("A background response is made over HTTP, not on a WebSocket.", param="background")
            previous = body.get("previous_response_id")
            steers = self._waiting_for_client.pop(previous, []) if isinstance(previous, str) else []
            own = body.get("input") or []
            if steers and isinstance(own, str | list):  # queued while it ran: after the outputs it waited for (8.14)
                own = [{"type": "message", "role": "user", "content": own}] if isinstance(own, str) else own
                body["input"] = [*own, *(message for steer in steers for message in steer.messages)]
            following: tuple[dict[str, Any], list[Steer]] | None = (body, steers)
            generate = frame.get("generate")
            while following is not None:
                body, steers = following
                following = await self._respond(body, generate, lane)
                generate = None
        except ProxyError as error:
            log_failure(error, f"{request.method} {request.path}", request[REQUEST_ID])
            # The steers this turn carried were never committed: returned (8.14).
            refused = SteerRefused("successor_creation_failed", "The response that takes the input was not made.")
            previous = body.get("previous_response_id")
            await self._return(steers, refused, previous if isinstance(previous, str) else "", lane)
            await self._send_error(error.for_client(request[REQUEST_ID]), lane)
        except ClientGone:
            raise
        except Exception:  # not foreseen: logged whole, answered in the envelope (design.md 5.9)
            log.exception("a WebSocket turn failed", extra={"request_id": request[REQUEST_ID]})
            await self._send_error(ProxyError(f"internal error; request id {request[REQUEST_ID]}"), lane)

    async def _respond(
        self, body: dict[str, Any], generate: Any, lane: str | None
    ) -> tuple[dict[str, Any], list[Steer]] | None:
        """One turn planned and run (a `generate: false` one asks for nothing, 8.9); its
        successor's body and the steers it takes, where steers wait for one."""
        asks = Asks.NOTHING if generate is False else Asks.RESPONSE
        turn = await plan(self._request, {**body, "stream": True}, asks, self._responses)
        id = turn.translator.progress()["id"]
        # Not a conversation's turn, nor one that compacts: OpenAI's steering takes neither (8.14).
        steerable = turn.asks is Asks.RESPONSE and turn.past.request.conversation_id is None
        running = self._running[id] = _Running(lane, body, steerable and turn.call.compact_at is None)
        try:
            response = await turn.run(_SocketSink(self, turn, running))
        finally:  # a turn cancelled (its connection going) forgets its steers with it
            del self._running[id]
            self._ended[id] = None
            while len(self._ended) > _KEPT * 4:
                self._ended.popitem(last=False)
        if running.steers and response is None:  # it ended in no response
            refused = SteerRefused("response_not_active", "The response ended before it took the input.")
            await self._return(running.steers, refused, id, lane)
            running.steers.clear()
        return await self._successor(response, running, id) if running.steers and response is not None else None

    async def _return(self, steers: list[Steer], refused: SteerRefused, target: str, lane: str | None) -> None:
        """Steers never committed, given back to their client as it sent them (8.14)."""
        for steer in steers:
            await self._send(steering.failed(refused, target, steer.sent, steer.id), lane)

    async def _successor(
        self, response: dict[str, Any], running: _Running, id: str
    ) -> tuple[dict[str, Any], list[Steer]] | None:
        """What follows a response that took steers (design.md 8.14): a successor that
        continues it with their input, inheriting its settings; where it stopped for its client's
        tool output or approval, nothing yet: the steers wait for the client's next create on it
        (`response.steer.pending`); where it failed, they are returned."""
        owed = steering.required_input(response["output"]) if response["status"] == "completed" else []
        if owed:
            self._waiting_for_client[id] = running.steers
            while len(self._waiting_for_client) > _KEPT:  # the oldest are returned
                gone, steers = self._waiting_for_client.popitem(last=False)
                refused = SteerRefused("response_not_active", "The response waited too long for its continuation.")
                await self._return(steers, refused, gone, None)
            for steer in running.steers:
                await self._send(steering.pending(steer.id, id, owed), running.lane)
            return None
        if response["status"] == "failed":
            refused = SteerRefused("successor_creation_failed", "The response failed: its successor was not made.")
            await self._return(running.steers, refused, id, running.lane)
            return None
        messages = [message for _, queued, _, _ in running.steers for message in queued]
        return {**running.body, "previous_response_id": id, "input": messages}, running.steers

    async def steer(self, frame: dict[str, Any], size: int, most_bytes: int) -> None:
        """A `response.steer` frame: its input queued on the response it names, running on this
        connection, and `response.steer.accepted`; or `response.steer.failed` with the input
        returned (design.md 8.14). The steers a connection holds take at most `most_bytes`."""
        target, sent = frame.get("previous_response_id"), frame.get("input")
        running = self._running.get(target) if isinstance(target, str) else None
        try:
            extra = set(frame) - {"type", "previous_response_id", "input"}
            if extra:
                raise SteerRefused(
                    "invalid_input", f"A steer takes type, previous_response_id and input; not {sorted(extra)}."
                )
            messages = steering.steer_input(sent)
            if running is None:
                ended = isinstance(target, str) and (target in self._ended or target in self._waiting_for_client)
                code = "response_already_completed" if ended else "response_not_found"
                raise SteerRefused(code, f"No response '{target}' is running on this connection.")
            if not running.steerable:
                raise SteerRefused(
                    "steering_not_supported", "A conversation's or a compacting response is not steered."
                )
            held = sum(steer.size for steers in self._held() for steer in steers)
            if len(running.steers) >= _MAX_STEERS or held + size > most_bytes:
                raise SteerRefused("too_many_pending_steers", "This response, or this connection, holds all it may.")
        except SteerRefused as refused:
            await self._send(steering.failed(refused, str(target), sent), running.lane if running else None)
            return
        steer_id = new_id("steer")
        running.steers.append(Steer(steer_id, messages, sent, size))
        await self._send(steering.accepted(steer_id, target), running.lane)  # type: ignore[arg-type]

    def _held(self) -> list[list[Steer]]:
        return [running.steers for running in self._running.values()] + list(self._waiting_for_client.values())

    async def send_events(self, events: list[tuple[int, bytes]], tail: bytes | None, idle: float) -> None:
        """A Response's events, as the translator hands them out, as the transport's frames: each
        event's JSON alone, with its lane's `stream_id` (`tail`, put in before its closing brace).
        A client that takes nothing for its upstream's `client_idle` is let go, its turns and their
        upstream requests with them (4.12)."""
        try:
            async with asyncio.timeout(idle):
                for _, event in events:
                    data = event.partition(b"\ndata: ")[2]
                    await self._socket.send_str((data if tail is None else data[:-1] + tail).decode())
        except TimeoutError:
            raise ClientGone("the client took nothing for client_idle") from None

    async def _send(self, event: dict[str, Any], lane: str | None) -> None:
        """One of the connection's own events (steering's), numbered in their own sequence."""
        event["sequence_number"] = self._steer_events
        self._steer_events += 1
        if lane is not None:
            event["stream_id"] = lane
        await self._frame(orjson.dumps(event).decode())

    async def _frame(self, text: str) -> None:
        """A frame of the connection's own, let go as a stream's are where the client takes
        nothing (4.12)."""
        idle = max(upstream.timeouts.client_idle for upstream in self._config().upstreams)
        try:
            async with asyncio.timeout(idle):
                await self._socket.send_str(text)
        except TimeoutError:
            raise ClientGone("the client took nothing for client_idle") from None

    async def overflowed(self) -> None:
        """More frames came while turns ran than the connection may queue (design.md 8.9):
        said in an error frame, then the connection closes (1008)."""
        limits = self._config().connections
        await self._send_error(
            TooManyRequests(
                f"More than {limits.websocket_queue} frames or {limits.websocket_queue_bytes} bytes waited for the "
                "turns running on this connection; send the next when one ends.",
                param="type",
            ),
            None,
        )
        await self._socket.close(code=WSCloseCode.POLICY_VIOLATION, message=b"too many frames queued")

    async def _send_error(self, error: ProxyError, lane: str | None) -> None:
        """The transport's error frame: the error's envelope, with its status (and its lane)."""
        frame = {"type": "error", "status": error.status, **error.envelope()}
        if lane is not None:
            frame["stream_id"] = lane
        await self._frame(orjson.dumps(frame).decode())


class ClientGone(ClientLeft):
    """The client stopped reading: the connection ends (its handler cancels the turn)."""


class _SocketSink:
    """A turn's sink on a WebSocket: each event a frame on its lane; a steer taken stops the
    Response after the events of this write (8.14). A cancel is its connection gone."""

    __slots__ = ("_connection", "_translator", "_running", "_tail", "_idle")
    client = Client.GONE

    def __init__(self, connection: _Connection, turn: Turn, running: _Running) -> None:
        self._connection = connection
        self._translator = turn.translator
        self._running = running
        lane = running.lane
        # A lane's name goes in before each event's closing brace; no lane, the event as it is.
        self._tail = None if lane is None else b',"stream_id":' + orjson.dumps(lane) + b"}"
        self._idle = turn.client_idle

    async def opened(self, deadline: float | None) -> None:
        pass

    async def write(self, events: bytes) -> None:
        translator = self._translator
        await self._connection.send_events(translator.flushed(), self._tail, self._idle)
        # Not between rounds: the round's calls have run, and their results go to the next one.
        if (
            self._running.steers
            and translator.response is None
            and not translator.calling
            and not translator.round_over
        ):
            raise Steered
