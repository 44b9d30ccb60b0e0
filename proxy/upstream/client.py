"""The upstream side: one pooled HTTP client per configured upstream, over its replicas.

Failures become the proxy's error types here, in one place (`_Failures`): a connection that
could not be opened is `UpstreamNotReached`, one that broke `UpstreamUnreachable` (502), a
timeout `UpstreamTimeout` (504), an error status whatever the core's parser makes of the body
(design.md 6.6).

Balancing: a call with a session goes to its session's replica, within a bound on load
(`affinity.py`, design.md 11.2), a new session where its prompt's prefix was sent, within a bound
on the sessions each replica holds (`placement.py`, 11.5); one without, or an upstream set to
`least_outstanding`, to the replica with the fewest outstanding requests, ties taken in turn. A
replica that refuses a connection is skipped for `eject_seconds` (passive); with `health_check`
set, a probe takes failing replicas out and brings them back (active). A request moves to another replica only
when it never reached one: once a request was sent, a retry could run a generation twice.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import hdrs

from ..config import HealthCheck, Timeouts, Upstream
from ..errors import (
    ProxyError,
    UpstreamBusy,
    UpstreamNotReached,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from ..responses.chat import Usage, upstream_error
from .affinity import HIT, NEW, PREFIX, SPILL, AffinityMap, Session, choose, salt_of
from .placement import Computing, Prefix, SessionLoads, place, prefix_of, stale

_MAX_ERROR_BODY = 64 * 1024
_DRAIN_TIMEOUT = 1.0
# The connection could not be opened: the request never left.
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)

ErrorHook = Callable[[str, str], None]  # (upstream name, error kind)
RouteHook = Callable[[str, str], None]  # (upstream name, how a session's replica was found)
T = TypeVar("T")


class _Failures:
    """Turns what went wrong into the proxy's error for one upstream, and counts it."""

    __slots__ = ("_name", "_hook")

    def __init__(self, name: str, hook: ErrorHook) -> None:
        self._name = name
        self._hook = hook

    def connection(self, exc: aiohttp.ClientError) -> UpstreamUnreachable:
        self._hook(self._name, "connection")
        kind = UpstreamNotReached if isinstance(exc, _NOT_SENT) else UpstreamUnreachable
        return kind(f"upstream {self._name} connection failed: {exc}")

    def timeout(self, detail: str) -> UpstreamTimeout:
        self._hook(self._name, "timeout")
        return UpstreamTimeout(f"upstream {self._name} {detail}")

    def status(self, status: int, body: bytes) -> ProxyError:
        self._hook(self._name, f"status_{status}")
        error = upstream_error(body, status)
        error.upstream_status = status
        return error

    def too_large(self, limit: int) -> UpstreamProtocolError:
        self._hook(self._name, "too_large")
        return UpstreamProtocolError(f"upstream {self._name}: upstream answer too large (over {limit} bytes)")

    def encoded(self, encoding: str) -> UpstreamProtocolError:
        self._hook(self._name, "encoded")
        return UpstreamProtocolError(f"upstream {self._name} sent a {encoding} answer although asked for identity")

    def stale(self) -> None:
        self._hook(self._name, "stale_connection")

    def busy(self) -> None:
        self._hook(self._name, "pool_full")

    def redirect(self, status: int) -> UpstreamProtocolError:
        self._hook(self._name, "redirect")
        return UpstreamProtocolError(
            f"upstream {self._name} answered with a redirect ({status}), which the proxy does not follow"
        )

    async def guard(self, operation: Awaitable[T], timeout: float, deadline: float | None) -> T:
        """`operation` within `timeout` (and the exchange's `deadline`), its failures ours."""
        if deadline is not None:
            timeout = min(timeout, deadline - asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(timeout):
                return await operation
        except aiohttp.ClientError as exc:
            raise self.connection(exc) from exc
        except TimeoutError:
            raise self.timeout(f"sent nothing for {timeout:.3g} s") from None


class _PoolConnector(aiohttp.TCPConnector):
    """Says, in `reused`, whether the connection a request just got had served one before: a
    context variable, set within the request's own task (design.md 6.12)."""

    reused: ContextVar[bool] = ContextVar("reused", default=False)

    def __init__(self) -> None:
        super().__init__(limit=0, limit_per_host=0, keepalive_timeout=60)
        self._served: weakref.WeakSet[object] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        self.reused.set(protocol in self._served)
        self._served.add(protocol)
        return connection


class Replica:
    __slots__ = ("url", "salt", "outstanding", "ejected_until", "healthy")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.salt = salt_of(self.url)
        self.outstanding = 0
        self.ejected_until = 0.0
        self.healthy = True

    def available(self, now: float) -> bool:
        return self.healthy and self.ejected_until <= now


class Exchange:
    """One upstream request in flight, past its response headers.

    The idle and total timeouts of a stream are watched by one timer that re-arms itself,
    not by a timeout context per read: a stream makes thousands of reads a second.
    """

    __slots__ = (
        "response",
        "_content",
        "_loop",
        "_config",
        "_timeouts",
        "_failures",
        "_deadline",
        "_waiting_since",
        "_timer",
        "_began",
    )

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        config: Upstream,
        failures: _Failures,
        deadline: float | None,
        began: Callable[[], None] | None = None,
    ) -> None:
        """`began`: called once the body's first bytes came (a prefill done, 11.5)."""
        self.response = response
        self._content = response.content
        # Looked up once: on Python 3.11 every get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()
        self._config = config
        self._timeouts = config.timeouts
        self._failures = failures
        self._deadline = deadline
        self._waiting_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._began = began

    async def read_body(self) -> bytes:
        """A whole non-streaming body, within `max_answer_bytes` (design.md 6.11): generated
        before it is sent, so it gets `first_byte`."""
        return await self._failures.guard(
            _read_bounded(self.response, self._config.max_answer_bytes, self._failures),
            self._timeouts.first_byte,
            self._deadline,
        )

    async def read_chunk(self) -> bytes:
        """The next bytes of a streaming body (b"" at its end), within the idle timeout."""
        self._waiting_since = self._loop.time()
        if self._timer is None:
            self._arm(self._waiting_since)
        try:
            data = await self._content.readany()
        except aiohttp.ClientError as exc:
            raise self._failures.connection(exc) from exc
        finally:
            self._waiting_since = None
        if self._began is not None:
            self._began()
            self._began = None
        return data

    async def drain(self) -> None:
        """Read what follows the end of a stream (SGLang sends finish and usage chunks even
        after an error frame), so that the connection can go back to the pool."""
        if self.response.content.at_eof():
            return
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT):
                await self.response.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # release() then closes the connection instead of pooling it

    @property
    def timeouts(self) -> Timeouts:
        return self._timeouts

    @property
    def deadline(self) -> float | None:
        """When the whole exchange must be over (loop time), if `total` is set."""
        return self._deadline

    def end(self, error: ProxyError) -> None:
        """Fail the exchange from outside: its pending read, or its next one, raises `error`."""
        self.response.content.set_exception(error)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self, since: float) -> None:
        due = since + self._timeouts.idle
        if self._deadline is not None:
            due = min(due, self._deadline)
        self._timer = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        """Fail the pending read if it has waited too long; otherwise look again later. Time
        spent writing to a slow client is not upstream idleness, so only a pending read counts."""
        now = self._loop.time()
        waiting = self._waiting_since
        timeouts = self._timeouts
        if self._deadline is not None and now >= self._deadline:
            detail = f"did not finish within {timeouts.total:g} s"
        elif waiting is not None and now - waiting >= timeouts.idle:
            detail = f"sent nothing for {timeouts.idle:g} s"
        else:
            self._arm(now if waiting is None else waiting)
            return
        # The pending read, or the next one, raises it.
        self.response.content.set_exception(self._failures.timeout(detail))
        self._timer = None


class UpstreamClient:
    def __init__(
        self,
        config: Upstream,
        on_error: ErrorHook | None = None,
        affinity: AffinityMap | None = None,
        on_route: RouteHook | None = None,
    ) -> None:
        self.config = config
        self.replicas = [Replica(url) for url in config.urls]
        # Sessions are pinned only where there is a choice to make, and the upstream asks for it.
        several = len(self.replicas) > 1 and config.balance == "session"
        self._affinity = affinity if several else None
        self._on_route = on_route or (lambda upstream, outcome: None)
        self._loads = SessionLoads(config.session_window)
        self._computing = Computing()
        self._shares_prefill = config.wire().shares_prefill
        self._forgetting: set[asyncio.Task[None]] = set()
        # Whether a call's session changes where it goes: else it is not worked out at all.
        self.keyed = self._affinity is not None or bool(config.session_header)
        self._turn = itertools.count()
        self._failures = _Failures(config.name, on_error or (lambda upstream, kind: None))
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._exchanges: set[Exchange] = set()
        # Requests still waiting for their answer's headers, and why those that are ended were.
        self._sending: set[asyncio.Task[Any]] = set()
        self._ended: dict[asyncio.Task[Any], ProxyError] = {}
        self._ending: ProxyError | None = None  # set once every request is to end: none is sent
        # The pool's bound, ours rather than the connector's, so that a full pool says so
        # instead of passing for an upstream that does not answer (design.md 4.12).
        self._slots = asyncio.Semaphore(config.max_connections)
        # Identity: answers are read chunk by chunk as they come, never decompressed (design.md 6.10).
        self._headers = {"Content-Type": "application/json", **config.headers, "Accept-Encoding": "identity"}
        key = config.key()
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._session = self._new_session(_PoolConnector())
        self._unpooled: aiohttp.ClientSession | None = None  # for a retry on a fresh connection
        self._probe = asyncio.create_task(self._probe_forever(config.health_check)) if config.health_check else None

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        await self._session.close()
        if self._unpooled is not None:
            await self._unpooled.close()

    async def close_when_idle(self) -> None:
        """For a client a reload replaced: requests that started on it finish first."""
        await self.idle()
        await self.close()

    async def idle(self) -> None:
        """Until no request is in flight."""
        await self._idle.wait()

    def end_exchanges(self, error: ProxyError) -> None:
        """End every request in flight with `error` (SIGTERM past its grace, design.md 5.10):
        those reading an answer, and those still waiting for its headers (a long queue or
        prefill), whose wait is cancelled."""
        self._ending = error
        for exchange in self._exchanges:
            exchange.end(error)
        for task in self._sending:
            self._ended[task] = error
            task.cancel()

    def ready(self) -> bool:
        now = time.monotonic()
        return any(replica.available(now) for replica in self.replicas)

    @asynccontextmanager
    async def post(
        self,
        path: str,
        body: dict[str, Any] | bytes,
        headers: dict[str, str] | None = None,
        *,
        relayed: bool = False,
        session: Session | None = None,
    ) -> AsyncIterator[Exchange]:
        """POST and yield the exchange once response headers arrived with a success status.
        An answer the proxy reads must not be compressed; one it only `relayed` may be. A call
        of a `session` goes to its replica, and names its key to an upstream that routes
        sessions itself (`session_header`, design.md 11.4).

        Leaving the block before the body's end (a client gone, an error) closes the
        connection, which is how SGLang and vLLM learn to stop generating; a body read to
        its end returns the connection to the pool.
        """
        # aiohttp holds the body until the answer ends, and orjson's output keeps 4 kB of room
        # whatever its length: held as an exact copy (design.md 7.1).
        data = body if isinstance(body, bytes) else bytes(memoryview(orjson.dumps(body)))
        if session is not None and self.config.session_header:
            headers = {**(headers or {}), self.config.session_header: session.key}
        total = self.config.timeouts.total
        deadline = asyncio.get_running_loop().time() + total if total else None
        await self._take_slot()
        self._in_flight += 1
        self._idle.clear()
        try:
            response, replica = await self._answered(path, body, data, headers, deadline, session)
            try:
                if response.status >= 400:
                    raise self._failures.status(response.status, await _error_body(response))
                if response.status >= 300:
                    # Following would send the prompt wherever `Location` says (design.md 6.9).
                    raise self._failures.redirect(response.status)
                encoding = response.headers.get(hdrs.CONTENT_ENCODING, "identity")
                if not relayed and encoding.lower() != "identity":
                    raise self._failures.encoded(encoding)
                began = None if session is None or session.computing is None else partial(self._computed, session)
                exchange = Exchange(response, self.config, self._failures, deadline, began)
                self._exchanges.add(exchange)
                try:
                    yield exchange
                finally:
                    exchange.stop_timer()
                    self._exchanges.discard(exchange)
            finally:
                response.release()
                replica.outstanding -= 1
        finally:
            if session is not None:
                self._computed(session)
            self._slots.release()
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _answered(
        self,
        path: str,
        body: dict[str, Any] | bytes,
        data: bytes,
        headers: dict[str, str] | None,
        deadline: float | None,
        session: Session | None,
    ) -> tuple[aiohttp.ClientResponse, Replica]:
        """`_send`, unless `end_exchanges` ends the wait first: then with its error; after it
        (a request that waited for a place in the pool meanwhile), nothing is sent."""
        if self._ending is not None:
            raise self._ending
        task = asyncio.current_task()
        assert task is not None
        self._sending.add(task)
        try:
            return await self._send(path, body, data, headers, deadline, session)
        except asyncio.CancelledError:
            error = self._ended.pop(task, None)
            if error is None:
                raise  # the client went away
            task.uncancel()
            raise error from None
        finally:
            self._sending.discard(task)

    async def _take_slot(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # at once: no timer for the common case
            return
        try:
            async with asyncio.timeout(self.config.timeouts.connect):
                await self._slots.acquire()
        except TimeoutError:
            self._failures.busy()
            raise UpstreamBusy(
                f"All {self.config.max_connections} connections to upstream {self.config.name} are in use; try again."
            ) from None

    async def get(self, path: str) -> tuple[int, bytes]:
        async def fetch() -> tuple[int, bytes]:
            async with self._session.get(self._candidates()[0].url + path, allow_redirects=False) as response:
                return response.status, await _read_bounded(response, self.config.max_answer_bytes, self._failures)

        return await self._failures.guard(fetch(), self.config.timeouts.connect + self.config.timeouts.idle, None)

    def _candidates(self) -> list[Replica]:
        """Available replicas, fewest outstanding requests first, ties taken in turn."""
        if len(self.replicas) == 1:
            return self.replicas
        usable = self._usable()
        turn = next(self._turn) % len(usable)
        return sorted(usable[turn:] + usable[:turn], key=lambda replica: replica.outstanding)

    def _usable(self) -> list[Replica]:
        """The available replicas; all of them when none is, rather than none."""
        now = time.monotonic()
        return [replica for replica in self.replicas if replica.available(now)] or self.replicas

    async def _send(
        self,
        path: str,
        body: dict[str, Any] | bytes,
        data: bytes,
        headers: dict[str, str] | None,
        deadline: float | None,
        session: Session | None,
    ) -> tuple[aiohttp.ClientResponse, Replica]:
        affinity = self._affinity if session is not None else None
        prefix, matched, claimed, settled = None, 0, None, False
        if affinity is None or session is None:
            pinned, candidates = None, self._candidates()
        else:
            # The map first (a read renews it, and it knows a spill another pod made), then the
            # replica of the response a chained turn continues; else the session is new.
            pinned = await affinity.get(session.key) or session.previous
            if pinned is None:
                prefix = prefix_of(body if isinstance(body, dict) else _chat(data), len(data))
                candidates, matched, settled = await self._place(session, prefix, affinity)
                claimed = candidates[0].url
            else:
                candidates = choose(session.key, pinned, self._usable(), self.config.load_factor)
        refused: list[str] = []
        for replica in candidates:
            report = False
            if session is not None and affinity is not None:
                report = self._loads.touch(session.key, replica.url, time.monotonic())
                if prefix is not None and replica is not candidates[0]:  # it computes all of it
                    self._compute(session, prefix.digests, replica.url)
            replica.outstanding += 1
            try:
                response = await self._failures.guard(
                    self._post(replica.url + path, data, headers), self.config.timeouts.first_byte, deadline
                )
            except UpstreamNotReached as error:
                replica.outstanding -= 1
                replica.ejected_until = time.monotonic() + self.config.eject_seconds
                refused.append(f"{replica.url}: {error.__cause__}")
            except BaseException:
                replica.outstanding -= 1
                raise
            else:
                if session is not None:
                    session.served_by = replica.url
                if affinity is not None and session is not None:
                    # Once a replica answered: a request that reached none moves no session; one that
                    # reached another than its placement moves it and its prefix (11.5).
                    holder = claimed or pinned
                    moved = replica.url != holder
                    if moved or report:
                        try:
                            digests = prefix.digests if prefix and moved else ()
                            await affinity.set(session.key, replica.url, digests, holder)
                        except BaseException:  # cancelled: the answer is nobody's
                            replica.outstanding -= 1
                            response.close()
                            raise
                    if prefix is not None and claimed is not None and moved:  # never sent what it claimed there
                        self._forget(prefix.past(matched), claimed)
                    outcome = HIT if replica.url == pinned else NEW if pinned is None else SPILL
                    if prefix is not None and matched and not moved:
                        outcome = PREFIX
                        session.placed = (prefix, matched, replica.url) if settled else None
                    self._on_route(self.config.name, outcome)
                return response, replica
        raise UpstreamNotReached(f"upstream {self.config.name} unreachable: {'; '.join(refused)}")

    async def _place(self, session: Session, prefix: Prefix, affinity: AffinityMap) -> tuple[list[Replica], int, bool]:
        """A new session's replicas, best first; the bytes of its prefix the first was sent; and
        whether a miss on them will say the replica lacks them: on an engine that shares a
        prefix once prefilled, not for one sent within `timeouts.first_byte`, which may still be
        being prefilled for another (design.md 11.5). The session is in the map, the index and
        the count from now, before it waits or is sent: the sessions placed meanwhile, by this
        process or another, see it there."""
        usable = self._usable()
        sent, shared = await affinity.view(prefix.digests, [replica.url for replica in usable])
        now = time.monotonic()
        loads = self._loads.held(now) if shared is None else shared
        candidates, matched = place(prefix, sent, loads, usable, self.config.load_factor)
        first = candidates[0].url
        self._loads.touch(session.key, first, now)
        # What it computes there, registered before the write yields: a session of this process
        # placed meanwhile waits for it.
        self._compute(session, prefix.past(matched), first)
        await affinity.set(session.key, first, prefix.digests)
        if not matched:
            return candidates, 0, False
        match = prefix.ends.index(matched)
        if not self._shares_prefill:
            return candidates, matched, True
        try:
            await self._computing.wait(prefix.digests[match], first, self.config.timeouts.first_byte)
        except asyncio.CancelledError:  # its client left: it holds nothing there, and claims nothing
            self._loads.drop(session.key)
            self._forget(prefix.past(matched), first, session.key)
            raise
        return candidates, matched, sent[match][first] >= self.config.timeouts.first_byte

    def _compute(self, session: Session, digests: Sequence[str], replica: str) -> None:
        """`replica` computes these digests of the session's prefix until its answer's first
        bytes, where a session waits for them (11.5); a replica tried before never received them."""
        if not (self._shares_prefill and digests) or (session.computing and session.computing[1] == replica):
            return
        self._computed(session)
        session.computing = (digests, replica, self._computing.begin(digests, replica))

    def _computed(self, session: Session) -> None:
        """The replica a new session was sent to has computed its prefix (design.md 11.5): its
        answer's first bytes came (SGLang and vLLM send the headers before the prefill, the
        first token after it), or the call ended without them."""
        if session.computing is not None:
            self._computing.end(*session.computing)
            session.computing = None

    def answered(self, session: Session, usage: Usage | None) -> None:
        """The usage of a session's first call (design.md 11.5): the replica a new session was
        placed on for its prefix, found holding far less of it, no longer holds it in the index.
        An upstream that counts no cached tokens (vLLM without `--enable-prompt-tokens-details`,
        SGLang without `--enable-cache-report`) teaches nothing."""
        placed, session.placed = session.placed, None
        details = usage.prompt_tokens_details if usage is not None else None
        cached = details.cached_tokens if details is not None else None
        if placed is None or self._affinity is None or usage is None or cached is None:
            return
        prefix, matched, replica = placed
        self._forget(stale(prefix, matched, usage.prompt_tokens or 0, cached), replica)

    def _forget(self, digests: list[str], replica: str, session: str | None = None) -> None:
        """The index told, not delaying the call, that `replica` lacks these (and the session)."""
        if (digests or session) and self._affinity is not None:
            task = asyncio.create_task(self._affinity.forget(digests, replica, session))
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)

    async def _post(self, url: str, data: bytes, headers: dict[str, str] | None) -> aiohttp.ClientResponse:
        """POST on a pooled connection. One the upstream closed while it idled in the pool
        (llama.cpp closes after every stream, though it says keep-alive) fails before any byte
        of an answer: such a request never reached the model, and goes once more on a fresh
        connection (design.md 6.12)."""
        _PoolConnector.reused.set(False)
        try:
            return await self._session.post(url, data=data, headers=headers, allow_redirects=False)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            answered = isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(exc.message, str)
            if not _PoolConnector.reused.get() or answered or isinstance(exc, aiohttp.ClientConnectorError):
                raise
        self._failures.stale()
        if self._unpooled is None:
            self._unpooled = self._new_session(aiohttp.TCPConnector(force_close=True, limit=0))
        return await self._unpooled.post(url, data=data, headers=headers, allow_redirects=False)

    async def _probe_forever(self, check: HealthCheck) -> None:
        while True:
            await asyncio.gather(*(self._probe_one(replica, check.path) for replica in self.replicas))
            await asyncio.sleep(check.interval)

    async def _probe_one(self, replica: Replica, path: str) -> None:
        try:
            async with asyncio.timeout(self.config.timeouts.connect):
                async with self._session.get(replica.url + path, allow_redirects=False) as response:
                    replica.healthy = response.status < 400
        except Exception:  # whatever the failure, the replica is down and the probe goes on
            replica.healthy = False
        if replica.healthy:
            replica.ejected_until = 0.0


def _chat(data: bytes) -> dict[str, Any]:
    """A relayed chat request as placement reads it: what does not parse has no prefix."""
    try:
        chat = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return chat if isinstance(chat, dict) else {}


async def _read_bounded(response: aiohttp.ClientResponse, limit: int, failures: _Failures) -> bytes:
    """A whole body, within `limit` bytes (design.md 6.11)."""
    if (response.content_length or 0) > limit:
        raise failures.too_large(limit)
    pieces, size = [], 0
    async for piece in response.content.iter_any():
        size += len(piece)
        if size > limit:
            raise failures.too_large(limit)
        pieces.append(piece)
    return b"".join(pieces)


async def _error_body(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.content.read(_MAX_ERROR_BODY)
    except aiohttp.ClientError:
        return b""
