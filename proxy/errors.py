"""One exception type per failure kind; each knows its HTTP status and OpenAI envelope.

Raised anywhere (request parsing, routing, the upstream client) and rendered in one place:
the server's error middleware for plain responses, the stream translator once streaming.
"""

from __future__ import annotations


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code: str | None = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    @property
    def response_code(self) -> str:
        """The code on a failed Response's `error`, which takes only the API's own values."""
        return "invalid_prompt" if self.status < 500 else "server_error"

    def envelope(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request_error"


class Unauthorized(InvalidRequest):
    status = 401
    code = "invalid_api_key"


class NotFound(InvalidRequest):
    status = 404
    code = "not_found"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class UpstreamError(ProxyError):
    """The upstream reported an error: a 4xx keeps its status (the request was at fault),
    anything else is the gateway's 502."""

    status = 502

    def __init__(self, status: int, message: str, *, param: str | None = None):
        client_fault = 400 <= status < 500
        super().__init__(message, param=param, status=status if client_fault else None)
        if client_fault:
            self.type = self.code = "invalid_request_error"


class UpstreamUnreachable(ProxyError):
    status = 502
    code = "upstream_unreachable"


class UpstreamProtocolError(ProxyError):
    """The upstream sent something that is not a chat completion (or chunk) we can read."""

    status = 502
    code = "upstream_protocol_error"


class UpstreamTimeout(ProxyError):
    status = 504
    code = "upstream_timeout"
