"""Typed application state shared by the app factory and the handlers."""

from aiohttp import web

from .runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
