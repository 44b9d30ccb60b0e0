"""The two logprob decisions: how many alternatives to ask for, and how a score looks."""

from __future__ import annotations

import msgspec
import orjson

from ..errors import UpstreamProtocolError
from .chat import LogprobEntry

INCLUDE_LOGPROBS = "message.output_text.logprobs"
SPEC_MAX_TOP_LOGPROBS = 20
# SGLang writes a -inf score as null; the Responses schema needs a number.
NULL_LOGPROB = -9999.0

_decode_entry = msgspec.json.Decoder(LogprobEntry).decode


def effective_top_logprobs(requested: int | None, cap: int) -> int:
    """The one number sent upstream and echoed back: what the client asked, capped by the route."""
    return min(requested or 0, cap)


def response_logprob(raw: msgspec.Raw) -> orjson.Fragment:
    """A chat `logprobs.content[]` entry as a Responses `output_text.logprobs[]` entry, encoded.

    The two have the same four keys, so an entry with every key present and no null in it
    (what SGLang and vLLM send, compact) passes through as it came: a score costs a copy,
    not six dicts, on the hottest path of the proxy. Any other entry is decoded and mapped.
    """
    data = bytes(raw)
    tokens = data.count(b'"token":')
    if (
        tokens
        and data[:1] == b"{"
        and b"null" not in data
        and data.count(b'"bytes":') == tokens
        and data.count(b'"logprob":') == tokens
        and b'"top_logprobs":' in data
    ):
        return orjson.Fragment(data)
    try:
        entry = _decode_entry(data)
    except msgspec.MsgspecError as exc:
        raise UpstreamProtocolError(f"unreadable upstream logprob entry: {exc}") from None
    score = _token_score(entry.token, entry.logprob, entry.bytes)
    score["top_logprobs"] = [_token_score(t.token, t.logprob, t.bytes) for t in entry.top_logprobs or ()]
    return orjson.Fragment(orjson.dumps(score))


def _token_score(token: str, logprob: float | None, token_bytes: list[int] | None) -> dict:
    return {
        "token": token,
        "logprob": NULL_LOGPROB if logprob is None else logprob,
        "bytes": list(token.encode()) if token_bytes is None else token_bytes,
    }
