"""The two logprob decisions: how many alternatives to ask for, and how a score looks."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import orjson

from ..errors import UpstreamProtocolError
from .chat import LogprobEntry

INCLUDE_LOGPROBS = "message.output_text.logprobs"
SPEC_MAX_TOP_LOGPROBS = 20
# SGLang writes a -inf score as null, llama.cpp as the lowest float; the Responses schema needs
# a number.
NULL_LOGPROB = -9999.0
ZERO_PROBABILITY = -1e30

_NULL_VALUE = re.compile(rb":\s*null\b")
# llama.cpp's token id, first or last among an entry's keys: a key is `"id":` only outside a
# string, since a quote inside one is escaped.
_TOKEN_ID = re.compile(rb'"id":-?\d+,|,"id":-?\d+(?=})')
_decode = msgspec.json.Decoder(LogprobEntry).decode


def effective_top_logprobs(requested: int | None, cap: int) -> int:
    """The one number sent upstream and echoed back: what the client asked, capped by the route."""
    return min(requested or 0, cap)


def response_logprobs(content: list[msgspec.Raw]) -> list[orjson.Fragment]:
    """A chat `logprobs.content` array as Responses `output_text.logprobs` entries, each
    encoded (scores are only ever written out, so they are kept as JSON).

    A chat entry and a Responses entry have the same four keys (design.md 3.5), so when every
    entry and every alternative has exactly those and nothing is null or a zero probability
    (what SGLang and vLLM send) the entries pass through as they came: on the hottest path of
    the proxy a score costs a copy, not six dicts. llama.cpp adds a token `id` to each: cut out
    of the bytes, it costs a substitution. Anything else is decoded and mapped entry by entry.
    (An entry that is not an object has no `top_logprobs` key: it fails the count and the
    decoder refuses it.)
    """
    entries = [bytes(entry) for entry in content]
    data = entries[0] if len(entries) == 1 else b",".join(entries)
    if b'"id":' in data:
        entries = [_TOKEN_ID.sub(b"", entry) for entry in entries]
        data = entries[0] if len(entries) == 1 else b",".join(entries)
    if _exactly_the_four_keys(data, len(entries)):
        return [orjson.Fragment(entry) for entry in entries]
    try:
        return [orjson.Fragment(orjson.dumps(_mapped(_decode(entry)))) for entry in entries]
    except msgspec.MsgspecError as exc:
        raise UpstreamProtocolError(f"unreadable upstream logprobs: {exc}") from None


def _exactly_the_four_keys(data: bytes, entries: int) -> bool:
    """Whether the entries in `data` hold the four keys and no other, nothing null, no zero
    probability. Every key ends in `":`, so the keys add up; a string that holds `":` or
    `null` or `e+3` adds to a count and only sends the array the slow, sure way."""
    tokens = data.count(b'"token":')
    return (
        data.count(b'":') == 3 * tokens + entries
        and data.count(b'"bytes":') == tokens
        and data.count(b'"logprob":') == tokens
        and data.count(b'"top_logprobs":') == entries
        and (b"null" not in data or not _NULL_VALUE.search(data))  # a token may be "null"
        and b"e+3" not in data  # the lowest float, llama.cpp's zero probability
    )


def _mapped(entry: LogprobEntry) -> dict[str, Any]:
    score = _token_score(entry.token, entry.logprob, entry.bytes)
    score["top_logprobs"] = [_token_score(t.token, t.logprob, t.bytes) for t in entry.top_logprobs or ()]
    return score


def _token_score(token: str, logprob: float | None, token_bytes: list[int] | None) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": NULL_LOGPROB if logprob is None or logprob <= ZERO_PROBABILITY else logprob,
        "bytes": list(token.encode()) if token_bytes is None else token_bytes,
    }
