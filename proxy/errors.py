"""The proxy's errors: one class per failure kind, each knowing its HTTP status, its OpenAI
`type` and its `code` (design.md 5.5).

Every class, with its status, `type` and `code`, is listed in the documentation's errors reference,
generated from this module (docs/hooks.py).

Raised anywhere (request parsing, routing, the upstream client, the translator) and rendered
in one place: the server's error middleware for plain answers, the translator once a stream
has begun. An upstream's own 4xx keeps its status (`rejected_by_upstream`). What an upstream
failure says (a traceback, a host name, a URL with a password) is for the log: a client sees
`for_client`'s generic words with the request id (design.md 5.7).
"""

from __future__ import annotations

import copy
from typing import Any


class ClientLeft(Exception):
    """A call cut short from the client's side: it went away, or asked its turn to stop (a
    steer, design.md 8.14). No failure of the upstream's: its call is neither an error (12.1,
    12.2) nor an answer."""


# What a call's client leaving raises through it: the proxy's own, and a write to a socket the
# client closed.
CLIENT_LEFT = (ClientLeft, ConnectionResetError)


class ProxyError(Exception):
    """A failure the proxy did not foresee, answered in the envelope with the request id that
    finds it in the log (design.md 5.9)."""

    status = 500
    type = "server_error"
    code: str | None = "server_error"
    # Whether a streaming request gets this error as a stream that ends in `response.failed`
    # (a 200) rather than as an HTTP status: for the errors clients act on from the event.
    in_stream = False
    # Whether the message may carry what the client must not see (an upstream's own words).
    internal = False
    # Whether the client should try again, as the `x-should-retry` header the openai SDKs
    # honour says (they retry every 5xx otherwise); None: their own rule.
    retry: bool | None = None
    # The upstream's own HTTP status, where the error is its answer: its call's `error.type`
    # (design.md 12.1), which the proxy's status (a 502 for any 5xx) would not tell.
    upstream_status: int | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    @property
    def response_code(self) -> str:
        """The code on a failed Response's `error`, which takes only the API's own values
        (design.md 5.6)."""
        return "invalid_prompt" if self.status < 500 else "server_error"

    def for_client(self, request_id: str) -> ProxyError:
        """This error as a client may see it."""
        if not self.internal:
            return self
        shown = copy.copy(self)
        shown.message, shown.param = f"upstream error ({self.code}); request id {request_id}", None
        return shown

    def envelope(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(ProxyError):
    """The client's request is at fault: the message and `param` name what to change."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    """The upstream refused a prompt longer than its context: Codex compacts its history and
    goes on when it reads this code on `response.failed`, and gives up on an HTTP 400
    (design.md 8.7)."""

    code = "context_length_exceeded"
    in_stream = True

    @property
    def response_code(self) -> str:
        return "context_length_exceeded"


class Unauthorized(InvalidRequest):
    """No API key, or one this proxy does not know (`auth.api_keys`)."""

    status = 401
    code = "invalid_api_key"


class NotFound(InvalidRequest):
    """An unknown model, endpoint, stored response, conversation or item; an upstream's own 404 too."""

    status = 404
    code = "not_found"


class MethodNotAllowed(InvalidRequest):
    """A method the endpoint does not take; the `Allow` header names those it does."""

    status = 405
    code = "method_not_allowed"


class RequestTimeout(InvalidRequest):
    """The request's body came too slowly (design.md 5.8); an upstream's own 408 too."""

    status = 408
    code = "request_timeout"


class PayloadTooLarge(InvalidRequest):
    """A body past `max_body_bytes` (or decompressed past it), a file past its limit."""

    status = 413
    code = "request_too_large"


class UnsupportedMediaType(InvalidRequest):
    """A body that is not JSON, or in an encoding the proxy does not read (design.md 5.8)."""

    status = 415
    code = "unsupported_media_type"


class Conflict(InvalidRequest):
    """A conversation another response or request is writing to (design.md 9.7)."""

    status = 409
    code = "conversation_locked"


class UnprocessableEntity(InvalidRequest):
    """An upstream's own 422, its status kept."""

    status = 422


class McpUnavailable(InvalidRequest):
    """A request's MCP server could not list its tools: OpenAI's answer for it (design.md 14.3)."""

    status = 424
    type = "external_connector_error"
    code = "http_error"


class UpgradeRequired(InvalidRequest):
    """The WebSocket transport is turned off here: a client that asked for it goes on over
    HTTP (Codex does, on a 426; design.md 8.9)."""

    status = 426
    code = "upgrade_required"


class TooManyRequests(InvalidRequest):
    """Past a limit of the key's or the process's (background runs, followers, MCP calls); an
    upstream's own 429."""

    status = 429
    code = "rate_limit_exceeded"


class NotImplementedHere(ProxyError):
    """A call this proxy serves only with what its upstream lacks (design.md 8.12)."""

    status = 501
    code = "not_implemented"
    retry = False  # the upstream lacks it: asked again, it lacks it still


class StoreUnavailable(ProxyError):
    """The response store failed a read or a write within `store.timeout`: retry (design.md 9.1)."""

    status = 503
    code = "store_unavailable"


class ServerShuttingDown(ProxyError):
    """The proxy is draining after SIGTERM: retry on another replica (design.md 5.10)."""

    status = 503
    code = "server_shutting_down"


class UpstreamBusy(ProxyError):
    """The proxy's own pool to the upstream is full: not the upstream's failure (design.md 4.12)."""

    status = 503
    code = "upstream_busy"


class UpstreamError(ProxyError):
    """The upstream failed: a 5xx, an aborted generation, or one of the kinds below."""

    status = 502
    internal = True


class UpstreamUnreachable(UpstreamError):
    """The connection to the upstream broke, or could not be made."""

    code = "upstream_unreachable"


class UpstreamNotReached(UpstreamUnreachable):
    """The request never reached the replica (connection refused, connect timeout): the one
    failure after which another replica may be tried without running a generation twice."""


class UpstreamProtocolError(UpstreamError):
    """The upstream sent something that is not a chat completion (or chunk) we can read."""

    code = "upstream_protocol_error"


class UpstreamTimeout(UpstreamError):
    """The upstream took longer than its `timeouts` allow (first byte, idle, total)."""

    status = 504
    code = "upstream_timeout"


# An upstream's own client errors, by status; any other 4xx is reported as a 400.
_REJECTIONS: dict[int, type[InvalidRequest]] = {
    cls.status: cls
    for cls in (InvalidRequest, NotFound, RequestTimeout, PayloadTooLarge, UnprocessableEntity, TooManyRequests)
}


def rejected_by_upstream(status: int, message: str, param: str | None) -> ProxyError:
    """The error for an upstream's answer with an error `status`. A 4xx was the request's fault
    and keeps its status and message; 401 and 403 mean the proxy's own upstream credentials are
    wrong, which is no fault of the client's; everything else is the upstream's failure."""
    if 400 <= status < 500 and status not in (401, 403):
        return _REJECTIONS.get(status, InvalidRequest)(message, param=param)
    return UpstreamError(message, param=param)
