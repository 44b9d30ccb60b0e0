"""The aiohttp application: routes, the error middleware, upstream client lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from .api import passthrough, responses
from .appkeys import CLIENTS, CONFIG
from .config import Config
from .errors import InvalidRequest, NotFound, PayloadTooLarge, ProxyError
from .upstream.client import UpstreamClient


def error_response(error: ProxyError) -> web.Response:
    return web.json_response(error.envelope(), status=error.status)


@web.middleware
async def render_errors(request: web.Request, handler) -> web.StreamResponse:
    """The one place where a `ProxyError` becomes an HTTP answer in the OpenAI envelope."""
    try:
        return await handler(request)
    except ProxyError as error:
        return error_response(error)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(PayloadTooLarge(exc.text or "request body too large"))
    except web.HTTPNotFound:
        return error_response(NotFound(f"no such endpoint: {request.method} {request.path}", code="not_found"))
    except web.HTTPMethodNotAllowed:
        return error_response(InvalidRequest(f"{request.method} is not allowed on {request.path}", code="method_not_allowed", status=405))


async def _upstream_clients(app: web.Application) -> AsyncIterator[None]:
    app[CLIENTS] = {upstream.name: UpstreamClient(upstream) for upstream in app[CONFIG].upstreams}
    yield
    for client in app[CLIENTS].values():
        await client.close()


def create_app(config: Config) -> web.Application:
    app = web.Application(middlewares=[render_errors], client_max_size=32 * 1024 * 1024)
    app[CONFIG] = config
    app.cleanup_ctx.append(_upstream_clients)
    app.router.add_post("/v1/responses", responses.create_response)
    app.router.add_get("/v1/models", passthrough.models)
    app.router.add_get("/health", passthrough.health)
    return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start `app` on host:port. The handler of a client that hangs up is cancelled, which
    closes its upstream request, so the GPU stops generating for nobody."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024, reuse_address=True).start()
    return runner
