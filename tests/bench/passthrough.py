"""The baseline: a minimal aiohttp proxy that forwards the chat stream without translating.

`python -m tests.bench.passthrough --upstream URL --port P`. Same aiohttp settings as the proxy
(one shared ClientSession with a keep-alive pool of 1000 like the proxy's default, no decompression, handler cancellation,
no access log, uvloop); one client write per upstream read. GET /stats counts upstream reads
and bytes, so the bench can tell how many chunks one read carried.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
STATS = web.AppKey("stats", dict)


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    app = request.app
    stats = app[STATS]
    async with app[SESSION].post(app[UPSTREAM] + request.path, data=body, headers={"Content-Type": "application/json"}) as upstream:
        content_type = upstream.headers.get("Content-Type", "application/json")
        if not content_type.startswith("text/event-stream"):
            return web.Response(status=upstream.status, body=await upstream.read(), headers={"Content-Type": content_type})
        response = web.StreamResponse(status=upstream.status, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
        await response.prepare(request)
        async for data in upstream.content.iter_any():
            stats["reads"] += 1
            stats["bytes"] += len(data)
            await response.write(data)
        await response.write_eof()
        return response


async def health(_: web.Request) -> web.Response:
    return web.Response()


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS])


def create_app(upstream: str, max_connections: int = 1000) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app[STATS] = {"reads": 0, "bytes": 0}

    async def session(app: web.Application):
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


async def serve(upstream: str, host: str, port: int, max_connections: int) -> None:
    runner = web.AppRunner(create_app(upstream, max_connections), handler_cancellation=True, access_log=None, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024, reuse_address=True).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--max-connections", type=int, default=1000, help="upstream pool size (the proxy's default)")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    with contextlib.suppress(KeyboardInterrupt):
        (uvloop.run if uvloop else asyncio.run)(serve(args.upstream, args.host, args.port, args.max_connections))


if __name__ == "__main__":
    main()
