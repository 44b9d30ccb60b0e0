"""Typed application state shared by the app factory and the handlers."""

from aiohttp import web

from .config import Config
from .upstream.client import UpstreamClient

CONFIG = web.AppKey("config", Config)
CLIENTS = web.AppKey("clients", dict[str, UpstreamClient])
