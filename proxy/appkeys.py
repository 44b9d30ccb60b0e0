"""Typed application and request state shared by the app factory, middlewares and handlers."""

from aiohttp import web

from .runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
REQUEST_ID = web.RequestKey("request_id", str)
OWNER = web.RequestKey("owner", str)  # whose stored responses this request may see (design.md 9.5)
MODEL_PATTERN = web.RequestKey("model_pattern", str)  # the matched route's pattern, a metrics label
