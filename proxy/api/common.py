"""What every proxied endpoint does first: read the JSON body, find the upstream for its model."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..appkeys import MODEL_PATTERN, REQUEST_ID, RUNTIME
from ..config import Target, served_models
from ..errors import InvalidRequest, NotFound, PayloadTooLarge, UnsupportedMediaType
from ..upstream.client import UpstreamClient

_JSON_TYPES = {"application/json", "application/octet-stream"}  # the latter: no Content-Type sent


async def read_body(request: web.Request) -> bytes:
    """The JSON body, within the configured size (counted after decompression)."""
    if request.content_type not in _JSON_TYPES:
        raise UnsupportedMediaType(f"Content-Type must be application/json, not {request.content_type}.")
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


def load_json(body: bytes) -> Any:
    """A request body as JSON, for every endpoint that takes one."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None


def find_target(request: web.Request, model: str) -> tuple[Target, UpstreamClient]:
    runtime = request.app[RUNTIME]
    found = runtime.target(model)
    if found is None:
        served = ", ".join(served_models(runtime.config))
        raise NotFound(f"The model '{model}' is not served here. Served: {served}.", param="model", code="model_not_found")
    request[MODEL_PATTERN] = found[0].pattern
    return found


def upstream_headers(request: web.Request) -> dict[str, str]:
    return {"X-Request-ID": request[REQUEST_ID]}
