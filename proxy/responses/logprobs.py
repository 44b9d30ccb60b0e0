"""The logprob decisions: how many alternatives to ask for, how a score looks, and where the
scores of a response wait for their delta (the pending-score buffer, design.md 3.7)."""

from __future__ import annotations

import re
from typing import Annotated, Any

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

# llama.cpp's token id, first or last among an entry's keys: a key is `"id":` only outside a
# string, since a quote inside one is escaped.
_TOKEN_ID = re.compile(rb'"id":-?\d+,|,"id":-?\d+(?=})')
_Logprob = Annotated[float, msgspec.Meta(gt=ZERO_PROBABILITY)]


class _Alternative(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    token: str
    logprob: _Logprob
    bytes: list[int]


class _Score(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A chat score that already is a Responses score, key for key (design.md 3.5)."""

    token: str
    logprob: _Logprob
    bytes: list[int]
    top_logprobs: list[_Alternative]


_decode_exact = msgspec.json.Decoder(list[_Score]).decode
_decode_any = msgspec.json.Decoder(list[LogprobEntry] | None).decode


def effective_top_logprobs(requested: int | None, cap: int) -> int:
    """The one number sent upstream and echoed back: what the client asked, capped by the route."""
    return min(requested or 0, cap)


def _mapped_scores(content: bytes, alternatives: int | None) -> tuple[bytes, int]:
    try:
        entries = _decode_any(content)
    except msgspec.MsgspecError as exc:
        raise UpstreamProtocolError(f"unreadable upstream logprobs: {exc}") from None
    return b"[%s]" % b",".join(orjson.dumps(_mapped(entry, alternatives)) for entry in entries or ()), len(
        entries or ()
    )


def exact_scores(content: bytes) -> tuple[bytes, int] | None:
    """`content` as it came and its number of entries, if it is one JSON array of entries that
    already are Responses scores (design.md 3.5): checked by one typed decode, so that on the
    hottest path of the proxy a score costs a check, not six dicts and an encode. llama.cpp adds
    a token `id` to each: cut out of the bytes, it costs a substitution. An array split over
    lines (a multi-line `data:` field) is not passed on as it is: its line breaks would end the
    event that carries it. None for anything else."""
    content = content.strip()
    if content.find(b"\n") >= 0 or content.find(b"\r") >= 0:
        return None
    try:
        return content, len(_decode_exact(content))
    except msgspec.MsgspecError:
        pass
    if b'"id":' in content:
        try:
            content = _TOKEN_ID.sub(b"", content)
            return content, len(_decode_exact(content))
        except msgspec.MsgspecError:
            pass
    return None


class ScoreBuffer:
    """Every score of a response in arrival order, as the JSON arrays they came in; those past
    `_delivered` are the pending scores (design.md 3.7). Scores are only ever written out, so
    they are never decoded into objects, and a delta whose scores came in one chunk sends that
    chunk's array as it is (design.md 7.2)."""

    __slots__ = ("_alternatives", "_arrays", "_delivered", "count")

    def __init__(self, alternatives: int | None = None) -> None:
        """`alternatives`: how many of a score's alternatives to keep, where the upstream was
        asked for more (design.md 3.1); its scores are then all mapped."""
        self._alternatives = alternatives
        self._arrays: list[bytes] = []
        self._delivered = 0
        self.count = 0

    def add(self, content: bytes) -> bool:
        """A chat `logprobs.content` array, as its bytes; whether it needed no mapping.

        A chat entry and a Responses entry have the same four keys (design.md 3.5), so entries
        that hold exactly those, nothing null and no zero probability (what SGLang and vLLM
        send) are kept as the upstream's own bytes (`exact_scores`). Anything else is mapped
        entry by entry."""
        if self.add_exact(content):
            return True
        self._keep(*_mapped_scores(content, self._alternatives))
        return False

    def add_exact(self, content: bytes) -> bool:
        """As `add`, for scores that need no mapping (`exact_scores`); False, and nothing kept,
        for any other bytes: the chunk they came in is then decoded in full (design.md 7.4)."""
        exact = exact_scores(content) if self._alternatives is None else None
        if exact is not None:
            self._keep(*exact)
        return exact is not None

    def _keep(self, array: bytes, count: int) -> None:
        if count:
            self._arrays.append(array)
            self.count += count

    def take(self) -> bytes:
        """The pending scores as a JSON array; from now on they are delivered."""
        if self._delivered == len(self._arrays):
            return b"[]"
        pending = self._arrays[self._delivered :]
        self._delivered = len(self._arrays)
        return pending[0] if len(pending) == 1 else _joined(pending)

    def whole(self) -> orjson.Fragment:
        """Every score so far, as a JSON array for orjson to write as it is."""
        return orjson.Fragment(_joined(self._arrays))


def _joined(arrays: list[bytes]) -> bytes:
    return b"[%s]" % b",".join([array[1:-1] for array in arrays])  # a Raw array starts and ends with its brackets


def _mapped(entry: LogprobEntry, alternatives: int | None) -> dict[str, Any]:
    score = _token_score(entry.token, entry.logprob, entry.bytes)
    score["top_logprobs"] = [
        _token_score(t.token, t.logprob, t.bytes) for t in (entry.top_logprobs or ())[:alternatives]
    ]
    return score


def _token_score(token: str, logprob: float | None, token_bytes: list[int] | None) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": NULL_LOGPROB if logprob is None or logprob <= ZERO_PROBABILITY else logprob,
        "bytes": list(token.encode()) if token_bytes is None else token_bytes,
    }
