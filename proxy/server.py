"""The aiohttp application: routes, middlewares, the runtime's lifecycle."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
from aiohttp import web

from .api import endpoints, passthrough, responses, stored
from .appkeys import MODEL_PATTERN, OWNER, REQUEST_ID, RUNTIME
from .config import Config
from .errors import MethodNotAllowed, NotFound, ProxyError, Unauthorized
from .metrics import Metrics
from .runtime import Runtime
from .store import owner_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

access_log = logging.getLogger("proxy.access")

REQUEST_ID_HEADER = "X-Request-ID"


def error_response(error: ProxyError) -> web.Response:
    return web.Response(body=orjson.dumps(error.envelope()), status=error.status, content_type="application/json")


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id, access log line and request metrics: once per request, never per chunk."""
    request[REQUEST_ID] = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
    started = time.monotonic()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        status = 499  # the client went away before the answer was complete
        raise
    finally:
        elapsed = time.monotonic() - started
        info = request.match_info.route.resource
        endpoint = info.canonical if info is not None else "other"
        metrics = request.app[RUNTIME].metrics
        metrics.requests.labels(request.get(MODEL_PATTERN, ""), endpoint, str(status)).inc()
        metrics.latency.labels(endpoint).observe(elapsed)
        access_log.info(
            "%s %s %d %.1fms",
            request.method,
            request.path,
            status,
            elapsed * 1000,
            extra={"request_id": request[REQUEST_ID], "status": status, "duration_ms": round(elapsed * 1000, 1), "route": request.get(MODEL_PATTERN)},
        )


@web.middleware
async def render_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place where a `ProxyError` becomes an HTTP answer in the OpenAI envelope."""
    try:
        return await handler(request)
    except ProxyError as error:
        return error_response(error)
    except web.HTTPNotFound:
        return error_response(NotFound(f"No such endpoint: {request.method} {request.path}."))
    except web.HTTPMethodNotAllowed:
        return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}."))


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With API keys configured, a /v1 request must bring one; its digest owns the responses
    it stores (design.md 9.5)."""
    keys = request.app[RUNTIME].api_keys
    token = None
    if keys and request.path.startswith("/v1/"):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or token not in keys:
            raise Unauthorized("Missing or invalid API key: send `Authorization: Bearer <key>`.")
    request[OWNER] = owner_of(token)
    return await handler(request)


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]


def create_app(config: Config) -> web.Application:
    # The body limit is the runtime config's (it can change on reload): see api.common.read_body.
    app = web.Application(middlewares=[observe, render_errors, authenticate], client_max_size=2**63)

    async def runtime(app: web.Application) -> AsyncIterator[None]:
        app[RUNTIME] = Runtime(config, Metrics())
        yield
        await app[RUNTIME].close()

    app.cleanup_ctx.append(runtime)
    app.on_response_prepare.append(_add_request_id)
    app.router.add_post("/v1/responses", responses.create_response)
    app.router.add_get("/v1/responses/{id}", stored.retrieve)
    app.router.add_delete("/v1/responses/{id}", stored.delete)
    app.router.add_get("/v1/responses/{id}/input_items", stored.input_items)
    app.router.add_post("/v1/chat/completions", passthrough.forward)
    app.router.add_post("/v1/completions", passthrough.forward)
    app.router.add_get("/v1/models", endpoints.models)
    app.router.add_get("/health", endpoints.health)
    app.router.add_get("/ready", endpoints.ready)
    app.router.add_get("/metrics", endpoints.metrics)
    return app


async def serve(app: web.Application, host: str, port: int, *, reuse_port: bool = False, shutdown_grace: float = 30.0) -> web.AppRunner:
    """Start `app` on host:port. The handler of a client that hangs up is cancelled, which
    closes its upstream request, so the GPU stops generating for nobody. On cleanup the
    listening socket closes first and requests in flight get `shutdown_grace` seconds."""
    # aiohttp reads a shutdown_timeout of 0 as "wait for ever"; a grace of 0 means "cut now".
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=max(shutdown_grace, 0.001))
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024, reuse_address=True, reuse_port=reuse_port or None).start()
    return runner
