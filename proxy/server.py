"""The aiohttp application: routes, middlewares, the runtime's lifecycle."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .api import (
    background,
    compact,
    conversations,
    endpoints,
    files,
    input_tokens,
    passthrough,
    responses,
    stored,
    ui,
    websocket,
)
from .api.common import json_response
from .appkeys import MODEL_PATTERN, OWNER, REQUEST_ID, RUNTIME
from .config import Config, Connections
from .connections import GuardedSite
from .errors import MethodNotAllowed, NotFound, ProxyError, Unauthorized
from .logs import Throttle
from .metrics import Metrics
from .runtime import Runtime
from .store import owner_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

access_log = logging.getLogger("proxy.access")
log = logging.getLogger("proxy")
http_log = logging.getLogger("proxy.http")  # aiohttp's own: requests it could not parse

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse as an error with a traceback that quotes the raw
    header line, an API key included, and a client can send thousands a second: such a request
    becomes one short warning line, naming only the exception, at most one a second."""

    def __init__(self) -> None:
        super().__init__()
        self._throttle = Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        held = self._throttle.allow()
        if held is None:
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg = "malformed request from %s: %s (%d more since the last such line)"
        record.args = (peer, type(error).__name__, held)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


http_log.addFilter(MalformedRequests())


def error_response(error: ProxyError) -> web.Response:
    response = json_response(error.envelope(), status=error.status)
    if error.retry is not None:
        response.headers["x-should-retry"] = "true" if error.retry else "false"
    return response


@web.middleware
async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What every request goes through, in one middleware (a layer costs a coroutine a
    request, design.md 7.1): its id, its API key, its errors in the envelope, its metrics and
    access log line; once per request, never per chunk."""
    sent = request.headers.get(REQUEST_ID_HEADER, "")
    # A client's id goes into logs and upstream headers: bounded, or replaced by our own.
    request[REQUEST_ID] = sent if sent and _REQUEST_ID.fullmatch(sent) else os.urandom(16).hex()
    started = time.monotonic()
    status = 500
    runtime = request.app[RUNTIME]
    tracing = runtime.tracing
    info = request.match_info.route.resource
    endpoint = info.canonical if info is not None else "other"
    # The request's span, where tracing is on (design.md 12.1): what ends it.
    end_span = (
        tracing.server(request.method, endpoint, request.path, request.scheme, request.headers)
        if tracing and endpoint.startswith("/v1/")
        else None
    )
    try:
        try:
            request[OWNER] = _owner(request)
            response = await handler(request)
        except ProxyError as error:
            response = _rendered(request, error)
        except web.HTTPNotFound:
            response = _rendered(request, NotFound(f"No such endpoint: {request.method} {request.path}."))
        except web.HTTPMethodNotAllowed as refused:
            response = _rendered(request, MethodNotAllowed(f"{request.method} is not allowed on {request.path}."))
            response.headers["Allow"] = ",".join(sorted(refused.allowed_methods))  # a 405 must say (RFC 9110)
        except (web.HTTPException, asyncio.CancelledError):
            raise
        except Exception:  # a failure not foreseen: logged whole, answered in the envelope (design.md 5.9)
            log.exception("%s %s failed", request.method, request.path, extra={"request_id": request[REQUEST_ID]})
            if request.writer.output_size:
                raise  # a stream has begun: cutting the connection is all that is left
            response = error_response(ProxyError(f"internal error; request id {request[REQUEST_ID]}"))
        status = response.status
        return response
    except asyncio.CancelledError:
        status = 499  # the client went away before the answer was complete
        raise
    finally:
        elapsed = time.monotonic() - started
        if end_span is not None:
            end_span(status)
        metrics = runtime.metrics
        metrics.requests.labels(request.get(MODEL_PATTERN, ""), endpoint, status).inc()
        metrics.latency.labels(endpoint).observe(elapsed)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "%s %s %d %.1fms",
                request.method,
                request.path,
                status,
                elapsed * 1000,
                extra={
                    "request_id": request[REQUEST_ID],
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 1),
                    "route": request.get(MODEL_PATTERN),
                },
            )


def _owner(request: web.Request) -> str:
    """With API keys configured, a /v1 request must bring one; its digest owns the responses
    it stores (design.md 9.5)."""
    keys = request.app[RUNTIME].api_keys
    token = None
    if keys and request.path.startswith("/v1/"):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or token not in keys:
            raise Unauthorized("Missing or invalid API key: send `Authorization: Bearer <key>`.")
    return owner_of(token)


def _rendered(request: web.Request, error: ProxyError) -> web.Response:
    """The one place where an error becomes an HTTP answer in the OpenAI envelope."""
    if error.internal:
        log.warning("%s %s: %s", request.method, request.path, error.message, extra={"request_id": request[REQUEST_ID]})
    return error_response(error.for_client(request[REQUEST_ID]))


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]


def create_app(config: Config) -> web.Application:
    # The body limit is the runtime config's (it can change on reload): see api.common.read_body.
    app = web.Application(middlewares=[front], client_max_size=2**63)

    async def runtime(app: web.Application) -> AsyncIterator[None]:
        app[RUNTIME] = Runtime(config, Metrics())
        yield
        await app[RUNTIME].close()

    app.cleanup_ctx.append(runtime)
    app.on_response_prepare.append(_add_request_id)
    app.router.add_post("/v1/responses", responses.create_response)
    app.router.add_post("/v1/responses/compact", compact.compact)
    app.router.add_post("/v1/responses/input_tokens", input_tokens.count)
    app.router.add_get("/v1/responses", websocket.responses_socket)
    app.router.add_get("/v1/responses/{id}", stored.retrieve)
    app.router.add_delete("/v1/responses/{id}", stored.delete)
    app.router.add_get("/v1/responses/{id}/input_items", stored.input_items)
    app.router.add_post("/v1/responses/{id}/cancel", background.cancel)
    app.router.add_post("/v1/conversations", conversations.create)
    app.router.add_get("/v1/conversations/{id}", conversations.retrieve)
    app.router.add_post("/v1/conversations/{id}", conversations.update)
    app.router.add_delete("/v1/conversations/{id}", conversations.delete)
    app.router.add_get("/v1/conversations/{id}/items", conversations.list_items)
    app.router.add_post("/v1/conversations/{id}/items", conversations.add_items)
    app.router.add_get("/v1/conversations/{id}/items/{item_id}", conversations.retrieve_item)
    app.router.add_delete("/v1/conversations/{id}/items/{item_id}", conversations.delete_item)
    app.router.add_post("/v1/files", files.upload)
    app.router.add_get("/v1/files", files.list_files)
    app.router.add_get("/v1/files/{id}", files.retrieve)
    app.router.add_get("/v1/files/{id}/content", files.content)
    app.router.add_delete("/v1/files/{id}", files.delete)
    app.router.add_post("/v1/chat/completions", passthrough.forward)
    app.router.add_post("/v1/completions", passthrough.forward)
    app.router.add_get("/v1/models", endpoints.models)
    for path in ui.PAGES:
        app.router.add_get(path, ui.page)
    app.router.add_get("/ui/static/{name}", ui.static)
    app.router.add_get("/health", endpoints.health)
    app.router.add_get("/ready", endpoints.ready)
    app.router.add_get("/metrics", endpoints.metrics)
    return app


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    connections: Connections,
    reuse_port: bool = False,
    linger: float = 1.0,
) -> web.AppRunner:
    """Start `app` on host:port. The handler of a client that hangs up is cancelled, which
    closes its upstream request, so the GPU stops generating for nobody. Connections are held
    to time and number (design.md 5.11). On cleanup (after `shut_down`'s drain) the listening
    socket closes and handlers still running get `linger` seconds before they are cancelled."""
    # auto_decompress off: read_body decompresses, strictly (design.md 5.8).
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        # aiohttp waits this twice (for a handler, then for it after cancelling its request)
        # before it cancels the handler: half, so that what lingers is gone within `linger`.
        shutdown_timeout=linger / 2,
        logger=http_log,
        auto_decompress=False,
        keepalive_timeout=connections.keepalive,
    )
    await runner.setup()
    await GuardedSite(runner, host, port, connections, reuse_port=reuse_port).start()
    return runner


async def shut_down(app: web.Application, runner: web.AppRunner, grace: float) -> None:
    """SIGTERM (design.md 5.10): keep listening, so that probes see `/ready` answer 503 and new
    work a 503 to retry elsewhere, while what is in flight gets `grace` seconds; then every
    stream still open ends with `response.failed` and `[DONE]`, and the process exits within
    about a second more."""
    runtime = app[RUNTIME]
    runtime.draining = True
    log.info("draining: streams in flight get %g s", grace)
    if not await runtime.drain(grace):
        log.warning("ending what outlived the grace of %g s", grace)
        runtime.end_exchanges()
    if runtime.background is not None:
        await runtime.background.stop(linger=1.0)
    await runner.cleanup()
