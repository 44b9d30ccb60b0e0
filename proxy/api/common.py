"""What every proxied endpoint does first: read the JSON body, find the route."""

from __future__ import annotations

from aiohttp import web

from ..appkeys import REQUEST_ID, ROUTE, RUNTIME
from ..config import Route, served_models
from ..errors import InvalidRequest, NotFound, PayloadTooLarge
from ..upstream.client import UpstreamClient

_JSON_TYPES = {"application/json", "application/octet-stream"}  # the latter: no Content-Type sent


async def read_body(request: web.Request) -> bytes:
    """The JSON body, within the configured size (counted after decompression)."""
    if request.content_type not in _JSON_TYPES:
        raise InvalidRequest(
            f"Content-Type must be application/json, not {request.content_type}.", code="unsupported_media_type", status=415
        )
    limit = request.app[RUNTIME].config.max_body_bytes
    too_large = PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
    if (request.content_length or 0) > limit:
        raise too_large
    pieces, size = [], 0
    try:
        async for piece in request.content.iter_any():
            size += len(piece)
            if size > limit:
                raise too_large
            pieces.append(piece)
    except web.RequestPayloadError:  # a broken chunked or compressed body
        raise InvalidRequest("The request body could not be read: its transfer or content encoding is broken.") from None
    return b"".join(pieces)


def route(request: web.Request, model: str) -> tuple[Route, UpstreamClient]:
    runtime = request.app[RUNTIME]
    found = runtime.route(model)
    if found is None:
        served = ", ".join(served_models(runtime.config))
        raise NotFound(f"The model '{model}' is not served here. Served: {served}.", param="model", code="model_not_found")
    request[ROUTE] = found[0].pattern
    return found


def upstream_headers(request: web.Request) -> dict[str, str]:
    return {"X-Request-ID": request[REQUEST_ID]}
