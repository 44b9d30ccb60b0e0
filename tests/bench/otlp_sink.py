"""`python -m tests.bench.otlp_sink --port N`: an OTLP/HTTP receiver that takes every export and
keeps nothing, for the traced proxy of measure 9 to send its spans to."""

from __future__ import annotations

import argparse

from aiohttp import web


async def export(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    app = web.Application()
    app.router.add_post("/v1/traces", export)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=parser.parse_args().port, print=None, access_log=None)


if __name__ == "__main__":
    main()
