"""The two logprob decisions: how many alternatives to ask for, and how a score looks."""

from __future__ import annotations

from .chat import LogprobEntry

INCLUDE_LOGPROBS = "message.output_text.logprobs"
SPEC_MAX_TOP_LOGPROBS = 20
# SGLang writes a -inf score as null; the Responses schema needs a number.
NULL_LOGPROB = -9999.0


def effective_top_logprobs(requested: int | None, cap: int) -> int:
    """The one number sent upstream and echoed back: what the client asked, capped by the route."""
    return min(requested or 0, cap)


def _token_score(token: str, logprob: float | None, token_bytes: list[int] | None) -> dict:
    return {
        "token": token,
        "logprob": NULL_LOGPROB if logprob is None else logprob,
        "bytes": list(token.encode()) if token_bytes is None else token_bytes,
    }


def response_logprob(entry: LogprobEntry) -> dict:
    """A chat `logprobs.content[]` entry as a Responses `output_text.logprobs[]` entry."""
    score = _token_score(entry.token, entry.logprob, entry.bytes)
    score["top_logprobs"] = [_token_score(t.token, t.logprob, t.bytes) for t in entry.top_logprobs or ()]
    return score
