"""The token-score viewer's page (design.md 13): static files from the package, served with a
strict Content-Security-Policy, where the config turns it on (`ui: true`). The page holds no
data: it reads the API with the key its user gives it."""

from __future__ import annotations

from importlib.resources import files

from aiohttp import web

from ..appkeys import RUNTIME
from ..errors import NotFound

_FILES = {
    "viewer.js": "text/javascript",
    "tokens.js": "text/javascript",
    "viewer.css": "text/css",
}
# Scripts, styles and requests from this origin only; no inline script or style, no plugins,
# no framing: the page shows what models wrote, and runs none of it.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_PACKAGE = files("proxy") / "ui"
# The paths that serve the page, which reads its path: the list, live, one response, two
# responses compared token by token.
PAGES = ("/ui", "/ui/", "/ui/live", "/ui/responses/{id}", "/ui/compare/{first}/{second}")


def _served(request: web.Request) -> None:
    if not request.app[RUNTIME].config.ui:
        raise NotFound("The viewer is off on this proxy (`ui: true` in its config turns it on).")


async def page(request: web.Request) -> web.Response:
    """Every path of PAGES: one page, which reads its path."""
    _served(request)
    body = (_PACKAGE / "index.html").read_bytes()
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers=_HEADERS)


async def static(request: web.Request) -> web.Response:
    _served(request)
    name = request.match_info["name"]
    kind = _FILES.get(name)
    if kind is None:
        raise NotFound(f"No such file: {name}.")
    return web.Response(body=(_PACKAGE / name).read_bytes(), content_type=kind, charset="utf-8", headers=_HEADERS)
