"""A Responses call planned, whatever transport carries it (design.md 2.3): parsed, routed, its
history read and its conversation held, its translation settings from the route, its session
(11.1) and how its response is kept; and what a turn does when it ends."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from ..background import AsStored
from ..config import Target, served_models
from ..errors import InvalidRequest, NotFound, ProxyError, ServerShuttingDown
from ..responses.plan import Call, TranslationSettings, plan_call
from ..responses.schema import CreateResponse, parse_request, unknown_fields
from ..responses.sealing import Sealer
from ..responses.session import from_headers, response_session
from ..responses.translate import ResponseTranslator
from ..runtime import Runtime
from ..store import StoredResponse
from ..upstream.affinity import Session
from ..upstream.client import Exchange, UpstreamClient
from .conversations import Held, hold
from .files import read_files
from .history import History, read_history, stored_form
from .tools import ServerCalls, prepare

log = logging.getLogger("proxy")

CHAT_PATH = "/v1/chat/completions"
# Keeps a finished response before its last event leaves, so that a client that chains at once
# never races the write (design.md 9.2).
Keep = Callable[[dict[str, Any]], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call, as much as the turn layer needs of its transport: whose key (its
    digest, design.md 9.5), the request's id, and its headers (a session header, 11.1)."""

    owner: str
    request_id: str
    headers: Mapping[str, str]

    def upstream_headers(self) -> dict[str, str]:
        return {"X-Request-ID": self.request_id}


def route(runtime: Runtime, model: str) -> tuple[Target, UpstreamClient]:
    """The route and upstream client for a model; a new generation while draining is a 503 for
    the client to retry on another replica (design.md 5.10)."""
    if runtime.draining:
        raise ServerShuttingDown("The proxy is shutting down; retry on another replica.")
    found = runtime.target(model)
    if found is None:
        served = ", ".join(served_models(runtime.config))
        raise NotFound(
            f"The model '{model}' is not served here. Served: {served}.", param="model", code="model_not_found"
        )
    return found


def call_session(runtime: Runtime, caller: Caller, past: History) -> Session:
    """The call's session (design.md 11.1), for an upstream where it changes where the call
    goes; a turn of the session of the response it continues is sent first to the replica that
    served that one."""
    previous = past.previous
    header = from_headers(caller.headers, runtime.config.requests.session_headers)
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
    """A Responses call planned, whatever carries it (HTTP, a WebSocket, a background run):
    what goes upstream, where, and how its response is kept."""

    runtime: Runtime
    caller: Caller
    past: History
    call: Call
    target: Target
    client: UpstreamClient
    session: Session | None
    keep: Keep  # before the terminal event leaves (design.md 9.2)
    # How the response is kept anywhere (the store, a connection, a conversation); None: nowhere.
    kept_as: AsStored | None
    servers: ServerCalls  # its MCP servers, as its calls reach them (14)
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

    def translator(self) -> ResponseTranslator:
        # A background run keeps its events even when its client asked for none (design.md 10.2).
        streaming = self.call.stream or self.call.background
        max_event = self.target.upstream.max_event_bytes
        request_id = self.caller.request_id
        return ResponseTranslator(self.call, streaming=streaming, request_id=request_id, max_event=max_event)

    @property
    def gen_ai(self) -> tuple[str, str, str]:
        """The labels of its GenAI metrics (design.md 12.2): operation, provider, model."""
        return self.runtime.metrics.gen_ai(self.target)

    def post(
        self, body: dict[str, Any] | None = None, path: str = CHAT_PATH, answer: ResponseTranslator | None = None
    ) -> AbstractAsyncContextManager[Exchange]:
        """The call's chat request (or another of the turn's: a summary's, a token count's),
        sent when entered; its client span, where tracing is on (design.md 12.1), and a chat
        call's duration (12.2: a token count is no GenAI operation); `answer`: the translator
        the call feeds, what they read of its answer."""
        headers = self.caller.upstream_headers()
        exchange = self.client.post(path, self.call.chat if body is None else body, headers, session=self.session)
        tracing = self.runtime.tracing
        if tracing is not None:
            exchange = tracing.upstream(exchange, headers, self.target.upstream, self.target.model, answer)
        return self.runtime.metrics.operation(exchange, self.gen_ai, answer) if path == CHAT_PATH else exchange

    def answered(self, output: dict[str, Any], started: float, first_chunk: float | None) -> None:
        """A finished call's tokens, from its upstream's usage (design.md 11.4), and the time per
        output token after the first (12.2); on its span, what it made (12.1)."""
        usage, target = output["usage"], self.target
        elapsed = time.monotonic() - started
        self.runtime.metrics.answered(target.pattern, target.upstream.name, self.gen_ai, usage, first_chunk, elapsed)
        if self.runtime.tracing is not None:
            self.runtime.tracing.answered(output, first_chunk)


@dataclass(frozen=True, slots=True)
class Routed:
    """A request parsed and routed, nothing read yet: what a transport labels its metrics by."""

    data: Any  # the body as it came
    parsed: CreateResponse
    unknown: list[str]  # the top-level fields the schema does not know (design.md 8.1)
    target: Target
    client: UpstreamClient


def routed(runtime: Runtime, data: Any) -> Routed:
    parsed = parse_request(data)
    unknown = unknown_fields(data, reject=runtime.config.requests.unknown_fields == "reject")
    return Routed(data, parsed, unknown, *route(runtime, parsed.model))


async def plan_turn(
    runtime: Runtime,
    caller: Caller,
    request: Routed,
    kept: Mapping[str, StoredResponse] | None = None,
    keep_here: Callable[[StoredResponse], None] | None = None,
    *,
    writes: bool = True,
    runs: bool = True,
) -> Turn:
    """Read the history and plan a routed call. `kept` and `keep_here`: the responses of a
    WebSocket connection, read as history and added to (design.md 8.9). A call that `writes`
    (its response ends a turn) holds its conversation until `Turn.release`; one that `runs`
    (it generates) runs the MCP calls its request approves (14.5)."""
    data, parsed, fields, target, client = request.data, request.parsed, request.unknown, request.target, request.client
    store = runtime.store
    # Held before it is read, so that a turn ending meanwhile is in what this one reads (9.7).
    held = await _hold(runtime, caller, parsed.conversation_id) if writes and parsed.conversation_id else None
    try:
        past = await read_history(store, caller.owner, parsed, kept)
        past = await read_files(runtime, caller.owner, past, len(parsed.items()), target)  # design.md 8.16
        stored = store is not None and parsed.store is not False
        servers, calls = await prepare(runtime.mcp, runtime.sealer, caller.owner, past.request, runs=runs and writes)
        settings = translation_settings(target, runtime.sealer)
        call = plan_call(past.request, settings, stored=stored, servers=servers)
        _note_ignored(runtime, [*(f"field:{name}" for name in fields), *call.ignored])
        session = call_session(runtime, caller, past) if client.keyed else None
        kept_anywhere = stored or keep_here is not None or held is not None
        as_stored = stored_form(caller.owner, data, past, session) if kept_anywhere else None
        if runtime.tracing is not None:
            conversation = (session or call_session(runtime, caller, past)).key  # gen_ai.conversation.id
            runtime.tracing.turn(parsed.model, call.chat, call.stream, conversation, target.upstream.dialect)

        async def keep(response: dict[str, Any]) -> None:
            if as_stored is None:
                return
            kept_form = as_stored(response)
            if store is not None and stored:
                await store.save(kept_form)  # read from the store again, which a delete reaches
            elif keep_here is not None and held is None:
                # Kept whole, its chain's items with its own: a connection keeps a few responses,
                # and a chain of any length continues from the last (design.md 8.9).
                own = orjson.loads(bytes(kept_form.input_items))
                whole = msgspec.Raw(orjson.dumps([*past.chain, *own]))
                keep_here(msgspec.structs.replace(kept_form, input_items=whole, previous=None))
            await turn.add_to_conversation(response)

        turn = Turn(runtime, caller, past, call, target, client, session, keep, as_stored, calls, held)
        return turn
    except BaseException:
        if held is not None:
            await held.release()
        raise


def log_failure(error: ProxyError | None, where: str, request_id: str) -> None:
    """An upstream failure's own words, which the client saw only as a request id (design.md
    5.7); `where`: the method and path it came by."""
    if error is not None and error.internal:
        log.warning("%s: %s", where, error.message, extra={"request_id": request_id})


async def _hold(runtime: Runtime, caller: Caller, id: str) -> Held | None:
    """The conversation a response writes to, held; an unknown one is a 400 naming
    `conversation` (a 404 is the Conversations API's). Without a store, none: the history's read
    says so."""
    if runtime.store is None:
        return None
    try:
        return await hold(runtime.store, id, caller.owner, runtime.config.store.conversation_lease)
    except NotFound:
        raise InvalidRequest(f"Conversation with id '{id}' not found.", param="conversation") from None


def _note_ignored(runtime: Runtime, ignored: Iterable[str]) -> None:
    """Count what the request named that the upstream is not sent; log each kind once per
    process, since the same client sends the same thing on every turn (design.md 8.1)."""
    for what in ignored:
        if runtime.metrics.ignored(what):
            log.info("ignored in requests from now on, and counted in proxy_ignored_total: %s", what)
