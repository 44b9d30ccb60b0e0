"""What every handler that makes a Responses call works out alike: its translation settings
from the route, and its session (design.md 11.1)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..appkeys import RUNTIME
from ..config import Target
from ..responses.plan import TranslationSettings
from ..responses.sealing import Sealer
from ..responses.session import from_headers, response_session
from ..upstream.affinity import Session
from .stored import History

CHAT_PATH = "/v1/chat/completions"
# Keeps a finished response before its last event leaves, so that a client that chains at once
# never races the write (design.md 9.2).
Keep = Callable[[dict[str, Any]], Awaitable[object]]


def call_session(request: web.Request, past: History) -> Session:
    """The call's session (design.md 11.1), for an upstream where it changes where the call
    goes; a turn of the session of the response it continues is sent first to the replica that
    served that one."""
    previous = past.previous
    header = from_headers(request.headers, request.app[RUNTIME].config.requests.session_headers)
    key = response_session(past.request, header, previous.session if previous else None)
    return Session(key, previous.replica if previous is not None and previous.session == key else None)


def translation_settings(target: Target, sealer: Sealer) -> TranslationSettings:
    upstream, wire = target.upstream, target.upstream.wire()
    return TranslationSettings(
        model=target.model,
        max_top_logprobs=upstream.max_top_logprobs,
        min_top_logprobs=wire.min_top_logprobs,
        logprobs=upstream.logprobs,
        reasoning_field=wire.reasoning_field,
        defaults=upstream.defaults,
        hosted_tools=upstream.hosted_tools,
        late_system_role=upstream.late_system_messages,
        reasoning_summary=upstream.reasoning_summary,
        sealer=sealer,
    )
