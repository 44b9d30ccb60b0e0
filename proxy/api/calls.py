"""What every handler that makes a Responses call works out alike: the call planned (parsed,
routed, its history read, its translation settings from the route, its session, design.md
11.1), whatever transport then carries it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
from aiohttp import web

from ..appkeys import REQUEST_ID, RUNTIME
from ..background import AsStored
from ..config import Target
from ..errors import InvalidRequest, NotFound, ProxyError
from ..responses.plan import Call, TranslationSettings, plan_call
from ..responses.schema import parse_request, unknown_fields
from ..responses.sealing import Sealer
from ..responses.session import from_headers, response_session
from ..responses.translate import ResponseTranslator
from ..store import StoredResponse
from ..upstream.affinity import Session
from ..upstream.client import Exchange, UpstreamClient
from .common import find_target, upstream_headers
from .conversations import Held, hold
from .stored import History, read_history, stored_form

log = logging.getLogger("proxy")

CHAT_PATH = "/v1/chat/completions"
# Keeps a finished response before its last event leaves, so that a client that chains at once
# never races the write (design.md 9.2).
Keep = Callable[[dict[str, Any]], Awaitable[object]]


def call_session(request: web.Request, past: History) -> Session:
    """The call's session (design.md 11.1), for an upstream where it changes where the call
    goes; a turn of the session of the response it continues is sent first to the replica that
    served that one."""
    previous = past.previous
    header = from_headers(request.headers, request.app[RUNTIME].config.requests.session_headers)
    # A conversation is a session of its own; a chain goes on in the session it began in.
    chained = past.request.conversation_id or (previous.session if previous else None)
    key = response_session(past.request, header, chained)
    return Session(key, previous.replica if previous is not None and previous.session == key else None)


def translation_settings(target: Target, sealer: Sealer) -> TranslationSettings:
    upstream, wire = target.upstream, target.upstream.wire()
    return TranslationSettings(
        model=target.model,
        max_top_logprobs=upstream.max_top_logprobs,
        min_top_logprobs=wire.min_top_logprobs,
        logprobs=upstream.logprobs,
        reasoning_field=wire.reasoning_field,
        defaults=upstream.defaults,
        hosted_tools=upstream.hosted_tools,
        late_system_role=upstream.late_system_messages,
        reasoning_summary=upstream.reasoning_summary,
        context_window=upstream.context_window,
        sealer=sealer,
    )


@dataclass(frozen=True, slots=True)
class Turn:
    """A Responses call planned, whatever carries it (HTTP, a WebSocket): what goes upstream,
    where, and how its response is kept."""

    past: History
    call: Call
    target: Target
    client: UpstreamClient
    session: Session | None
    keep: Keep  # before the terminal event leaves (design.md 9.2)
    # How the response is kept anywhere (the store, a connection, a conversation); None: nowhere.
    kept_as: AsStored | None
    conversation: Held | None = None  # the conversation it writes to, held until it ends (9.7)

    @property
    def stored_as(self) -> AsStored | None:
        """How the store keeps the response; None: it does not."""
        return self.kept_as if self.call.echo["store"] else None

    async def release(self) -> None:
        """The turn is over, however it ended: its conversation is let go."""
        if self.conversation is not None:
            await self.conversation.release()

    async def end(self, response: dict[str, Any] | None) -> None:
        """A background run's end (design.md 10): its response, if it ended, added to its
        conversation, which is let go."""
        try:
            if response is not None:
                await self.add_to_conversation(response)
        finally:
            await self.release()

    async def add_to_conversation(self, response: dict[str, Any]) -> None:
        """The turn's input and output added to its conversation (design.md 9.7)."""
        if self.conversation is not None and self.kept_as is not None:
            own = orjson.loads(bytes(self.kept_as(response).input_items))
            await self.conversation.append([*own, *response["output"]])

    def translator(self, request: web.Request) -> ResponseTranslator:
        # A background run keeps its events even when its client asked for none (design.md 10.2).
        streaming = self.call.stream or self.call.background
        max_event = self.target.upstream.max_event_bytes
        return ResponseTranslator(self.call, streaming=streaming, request_id=request[REQUEST_ID], max_event=max_event)

    def post(
        self, request: web.Request, body: dict[str, Any] | None = None, path: str = CHAT_PATH
    ) -> AbstractAsyncContextManager[Exchange]:
        """The call's chat request (or another of the turn's: a summary's, a token count's),
        sent when entered; its client span, where tracing is on (design.md 12)."""
        headers = upstream_headers(request)
        exchange = self.client.post(path, self.call.chat if body is None else body, headers, session=self.session)
        tracing = request.app[RUNTIME].tracing
        return (
            exchange
            if tracing is None
            else tracing.upstream(exchange, headers, self.target.upstream, self.target.model)
        )


async def plan_turn(
    request: web.Request,
    data: Any,
    kept: Mapping[str, StoredResponse] | None = None,
    keep_here: Callable[[StoredResponse], None] | None = None,
    *,
    writes: bool = True,
) -> Turn:
    """Parse, route, read the history and plan a call. `kept` and `keep_here`: the responses of
    a WebSocket connection, read as history and added to (design.md 8.9). A call that `writes`
    (its response ends a turn) holds its conversation until `Turn.release`."""
    runtime = request.app[RUNTIME]
    parsed = parse_request(data)
    fields = unknown_fields(data, reject=runtime.config.requests.unknown_fields == "reject")
    target, client = find_target(request, parsed.model)
    # Held before it is read, so that a turn ending meanwhile is in what this one reads (9.7).
    held = await _hold(request, parsed.conversation_id) if writes and parsed.conversation_id else None
    try:
        past = await read_history(request, parsed, kept)
        store = runtime.store
        stored = store is not None and parsed.store is not False
        call = plan_call(past.request, translation_settings(target, runtime.sealer), stored=stored)
        _note_ignored(request, [*(f"field:{name}" for name in fields), *call.ignored])
        session = call_session(request, past) if client.keyed else None
        kept_anywhere = stored or keep_here is not None or held is not None
        as_stored = stored_form(request, data, past, session) if kept_anywhere else None
        if runtime.tracing is not None:
            conversation = (session or call_session(request, past)).key  # gen_ai.conversation.id: the session
            runtime.tracing.turn(parsed.model, call.chat, call.stream, conversation)

        async def keep(response: dict[str, Any]) -> None:
            if as_stored is None:
                return
            kept_form = as_stored(response)
            if store is not None and stored:
                await store.save(kept_form)  # read from the store again, which a delete reaches
            elif keep_here is not None and held is None:
                # Kept whole, its chain's items with its own and no link: a connection keeps a few
                # responses, and a chain of any length continues from the last (design.md 8.9).
                own = orjson.loads(bytes(kept_form.input_items))
                whole = msgspec.Raw(orjson.dumps([*past.chain, *own]))
                keep_here(msgspec.structs.replace(kept_form, input_items=whole, previous=None))
            await turn.add_to_conversation(response)

        turn = Turn(past, call, target, client, session, keep, as_stored, held)
        return turn
    except BaseException:
        if held is not None:
            await held.release()
        raise


async def _hold(request: web.Request, id: str) -> Held | None:
    """The conversation a response writes to, held; an unknown one is a 400 naming
    `conversation` (a 404 is the Conversations API's). Without a store, none: the history's read
    says so."""
    if request.app[RUNTIME].store is None:
        return None
    try:
        return await hold(request, id)
    except NotFound:
        raise InvalidRequest(f"Conversation with id '{id}' not found.", param="conversation") from None


def log_failure(request: web.Request, error: ProxyError | None) -> None:
    """An upstream failure's own words, which the client saw only as a request id (design.md 5.7)."""
    if error is not None and error.internal:
        log.warning("%s %s: %s", request.method, request.path, error.message, extra={"request_id": request[REQUEST_ID]})


def _note_ignored(request: web.Request, ignored: Iterable[str]) -> None:
    """Count what the request named that the upstream is not sent; log each kind once per
    process, since the same client sends the same thing on every turn (design.md 8.1)."""
    metrics = request.app[RUNTIME].metrics
    for what in ignored:
        if metrics.ignored(what):
            log.info("ignored in requests from now on, and counted in proxy_ignored_total: %s", what)
