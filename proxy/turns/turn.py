"""A Responses call, whatever transport carries it (design.md 2.3): planned (parsed, routed, its
history read and its conversation held, its translation settings from the route, its session,
11.1, and how its Response is kept), then run whole, from its first round to its Response's end,
into the sink its transport hands it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from ..config import Target, served_models
from ..errors import InvalidRequest, NotFound, ProxyError, ServerShuttingDown
from ..metrics import GenAI, Metrics
from ..responses import compaction
from ..responses.plan import Call, TranslationSettings, plan_call
from ..responses.schema import CreateResponse, parse_request, unknown_fields
from ..responses.sealing import Sealer
from ..responses.session import response_session
from ..responses.translate import ResponseTranslator
from ..runtime import Runtime
from ..sink import Client, Sink, Steered
from ..tracing import Tracing
from ..upstream.affinity import Session
from ..upstream.client import Exchange, UpstreamClient
from . import rounds
from .conversations import Held, hold
from .files import read_files
from .history import History, read_history
from .keeping import Connection, Keeping, keeping_of
from .rounds import Asks
from .tools import ServerCalls, prepare

log = logging.getLogger("proxy")

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call, as much as the turn layer needs of its transport: whose key (its
    digest, design.md 9.5), the request's id, the session its headers name (11.1, their first
    configured one, read where the caller is built), when it came, and by what method and path
    (for the log)."""

    owner: str
    request_id: str
    session: str | None = None
    started: float = field(default_factory=time.monotonic)
    where: str = ""

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


def call_session(caller: Caller, past: History) -> Session:
    """The call's session (design.md 11.1); a turn of the session of the response it continues
    is sent first to the replica that served that one."""
    previous = past.previous
    # A conversation is a session of its own; a chain goes on in the session it began in.
    chained = past.request.conversation_id or (previous.session if previous else None)
    key = response_session(past.request, caller.session, chained)
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
    what it asks, what goes upstream and where, how its Response is kept, and the one
    translator that makes that Response over all its rounds; with the collaborators it uses."""

    caller: Caller
    asks: Asks
    past: History
    call: Call
    settings: TranslationSettings
    target: Target
    upstream: UpstreamClient
    session: Session | None  # where it changes where the call goes (11.1)
    keeping: Keeping
    tools: ServerCalls  # its MCP servers, as its calls reach them, and its budget of calls (14)
    translator: ResponseTranslator
    metrics: Metrics
    tracing: Tracing | None

    @property
    def gen_ai(self) -> GenAI:
        """The labels of its GenAI metrics (design.md 12.2): operation, provider, model."""
        return self.metrics.gen_ai(self.target)

    @property
    def client_idle(self) -> float:
        """How long its client may take nothing before it is let go (design.md 4.12)."""
        return self.target.upstream.timeouts.client_idle

    def post(
        self, body: dict[str, Any], path: str = CHAT_PATH, feeds: ResponseTranslator | None = None
    ) -> AbstractAsyncContextManager[Exchange]:
        """One of the turn's upstream calls (a round's, a summary's, a token count's), sent when
        entered; its client span, where tracing is on (design.md 12.1), and a chat call's
        duration (12.2: a token count is no GenAI operation); `feeds`: the translator its reply
        goes through, what they read of it."""
        headers = self.caller.upstream_headers()
        exchange = self.upstream.post(path, body, headers, session=self.session)
        if self.tracing is not None:
            exchange = self.tracing.upstream(exchange, headers, self.target.upstream, self.target.model, feeds)
        return self.metrics.operation(exchange, self.gen_ai, feeds) if path == CHAT_PATH else exchange

    async def run(self, sink: Sink) -> dict[str, Any] | None:
        """The Response, from its first round to its terminal event, into `sink`: the one way
        every transport runs a turn (design.md 2.3). A failure before its events began is the
        transport's to send (raised), unless its client reads it from the events (8.7), in a
        stream of its own; after, the Response fails. A cancel ends it as the sink's client
        takes one; a steer stops it `incomplete` (8.14). The finished Response is kept before
        its terminal event leaves (9.2), and counted (11.4, 12.2); the turn's conversation is let
        go, however it ended. Returns the Response (a compaction's output, for a turn that makes
        none); None where it ended in none."""
        translator = self.translator
        foreground = not self.call.background  # a background run's usage is its client's alone (11.4)
        out = rounds.Output(translator, sink, self.keeping, self.caller.started, self._first if foreground else None)
        try:
            try:
                if self.call.background:  # its log shows it queued before the upstream replies (10.1)
                    await out.begin()
                await rounds.run(self, out)
            except Steered:
                await out.write(translator.cancel(steered=True))
            except ProxyError as error:
                if out.began:
                    await out.write(translator.fail(error))
                elif error.in_stream and translator.streaming:  # a stream of its own (8.7)
                    await out.open(None)
                    await out.write(translator.fail(error))
                else:
                    raise
            except asyncio.CancelledError:
                client = sink.client
                if client is Client.GONE:
                    if translator.summary_due:  # kept, its compaction item empty (8.10); an unfinished one is not
                        with contextlib.suppress(Exception):  # the client is gone: only the keeping counts
                            await out.write(translator.end())
                    raise
                stopped = ServerShuttingDown("The proxy stopped before the response ended.")
                await out.write(translator.fail(stopped) if client is Client.STOPPING else translator.cancel())
        finally:
            await self.release()
        log_failure(translator.error, self.caller.where, self.caller.request_id)
        response = translator.response
        if response is not None and self.asks is not Asks.NOTHING:  # no upstream call, no tokens
            if self.session is not None:  # what its replica had cached places the next sessions (11.5)
                self.upstream.answered(self.session, translator.first_usage)
            if foreground:
                self._count(response, out.first_chunk)
        return out.made if self.asks is Asks.COMPACTION else response

    async def release(self) -> None:
        """The turn is over, however it ended: its conversation is let go."""
        if self.keeping.conversation is not None:
            await self.keeping.conversation.release()

    def _first(self, seconds: float) -> None:
        self.metrics.first_chunk(self.target.pattern, self.gen_ai, seconds)

    def _count(self, response: dict[str, Any], first_chunk: float | None) -> None:
        """A finished Response's tokens, from its upstream's usage (design.md 11.4), and, streamed,
        the time per output token after the first (12.2); on its span, what it made (12.1)."""
        usage, target = response["usage"], self.target
        elapsed = time.monotonic() - self.caller.started
        self.metrics.answered(target.pattern, target.upstream.name, self.gen_ai, usage, first_chunk, elapsed)
        if self.tracing is not None:
            self.tracing.answered(response, first_chunk)


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
    asks: Asks = Asks.RESPONSE,
    connection: Connection | None = None,
) -> Turn:
    """Read the history and plan a routed call, for what it `asks` (a `compaction_trigger` turn
    asks for its summary, 8.8). `connection`: a WebSocket connection's Responses, read as history
    and added to (8.9). A turn that ends a turn holds its conversation until it is released
    (9.7); one that generates runs the MCP calls its request approves (14.5), and one that does
    not shows no listing."""
    data, parsed, fields, target, client = request.data, request.parsed, request.unknown, request.target, request.client
    store = runtime.store
    # Held before it is read, so that a turn ending meanwhile is in what this one reads (9.7).
    held = await _hold(runtime, caller, parsed.conversation_id) if asks.ends_a_turn and parsed.conversation_id else None
    try:
        past = await read_history(store, caller.owner, parsed, connection.responses if connection else None)
        past = await read_files(runtime, caller.owner, past, len(parsed.items()), target)  # design.md 8.16
        if asks is Asks.RESPONSE and compaction.triggered(past.request):
            asks = Asks.SUMMARY
        stored = store is not None and parsed.store is not False
        if parsed.background:
            _runs_in_the_background(runtime, asks, stored)
        generates = asks is Asks.RESPONSE
        servers, tools = await prepare(runtime.mcp, runtime.sealer, caller.owner, past.request, runs=generates)
        settings = translation_settings(target, runtime.sealer)
        tenant = target.upstream.tenant(caller.owner)
        call = plan_call(past.request, settings, stored=stored, servers=servers, tenant=tenant)
        if not generates:
            call = dataclasses.replace(call, prelude=())
        _note_ignored(runtime, [*(f"field:{name}" for name in fields), *call.ignored])
        tracing = runtime.tracing
        session = call_session(caller, past) if client.keyed or tracing is not None else None
        if tracing is not None and session is not None:  # gen_ai.conversation.id
            tracing.turn(parsed.model, call.chat, call.stream, session.key, target.upstream.dialect)
        routing = session if client.keyed else None
        keeping = (
            keeping_of(
                caller.owner,
                data,
                past,
                routing,
                store=store if stored else None,
                background=call.background,
                connection=connection,
                conversation=held,
            )
            if asks.ends_a_turn
            else Keeping()
        )
        # It streams as its upstream call does, decided where its chat request is (a background
        # run's always does, 10.2).
        translator = ResponseTranslator(
            call, streaming=call.chat["stream"], request_id=caller.request_id, max_event=target.upstream.max_event_bytes
        )
        return Turn(
            caller,
            asks,
            past,
            call,
            settings,
            target,
            client,
            routing,
            keeping,
            tools,
            translator,
            runtime.metrics,
            tracing,
        )
    except BaseException:
        if held is not None:
            await held.release()
        raise


def _runs_in_the_background(runtime: Runtime, asks: Asks, stored: bool) -> None:
    """A background request's 400s (design.md 10.1, 8.8): it needs a store, keeps its response
    there, and generates."""
    if asks is Asks.SUMMARY:
        raise InvalidRequest(
            "A compaction_trigger turn is answered at once, never in the background.", param="background"
        )
    if runtime.background is None:
        raise InvalidRequest(
            "A background response needs a store, and this proxy keeps none (store: none).", param="background"
        )
    if not stored:
        raise InvalidRequest("A background response is stored: it cannot have store: false.", param="store")


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
