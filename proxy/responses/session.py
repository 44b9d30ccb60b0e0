"""The session a call belongs to (design.md 11.1): the key that sends every turn of a
conversation to the replica holding its prefix cache. Pure: the turn layer hands in the request,
the session its headers name (read where its caller is built) and the session of the response it
continues."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from .schema import ContentPart, CreateResponse, InputFile, InputImage, Message, Refusal

# How much of the first turn's text the prefix key reads: enough to tell sessions apart, a
# bounded cost for a prompt of any size.
PREFIX_BYTES = 64 * 1024
_LEADING_ROLES = ("system", "developer", "user")
_MAX_KEY = 128  # characters of a client's own key kept as they came


def from_headers(headers: Mapping[str, str], names: Iterable[str]) -> str | None:
    """The first of the configured session headers the request carries, if any."""
    for name in names:
        value = headers.get(name, "").strip()
        if value:
            return value
    return None


def response_session(request: CreateResponse, header: str | None, chained: str | None) -> str:
    """A Responses call's session, in this order: its `prompt_cache_key`; a session header; the
    session of the response it continues (`previous_response_id`); else a digest of its first
    turn, so that a client that sends none of these still sticks."""
    explicit = request.prompt_cache_key or header or chained
    if explicit:
        return _bounded(explicit)
    items = request.items()
    first_turn = []
    for item in items:
        if not (isinstance(item, Message) and item.role in _LEADING_ROLES):
            break
        content = item.content
        first_turn.append(content if isinstance(content, str) else "".join(_text(part) for part in content))
    return prefix_key([request.instructions or "", *first_turn])


def chat_session(body: Any, header: str | None) -> str | None:
    """A relayed chat call's session: its `prompt_cache_key`, a session header, its `user`, else
    a digest of its first turn; None for a body that is no chat request."""
    if not isinstance(body, dict):
        return None
    for explicit in (body.get("prompt_cache_key"), header, body.get("user")):
        if isinstance(explicit, str) and explicit:
            return _bounded(explicit)
    messages = body.get("messages")
    if not isinstance(messages, list):
        prompt = body.get("prompt")
        return prefix_key([prompt]) if isinstance(prompt, str) else None
    first_turn = []
    for message in messages:
        if not (isinstance(message, dict) and message.get("role") in _LEADING_ROLES):
            break
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        first_turn.append(content if isinstance(content, str) else "")
    return prefix_key(first_turn)


def _bounded(key: str) -> str:
    """A client's own key as routing, the session map and an upstream's header take it: as it
    came when short and printable ASCII, else its digest (a header cannot carry a line break,
    and the map holds many)."""
    if len(key) <= _MAX_KEY and key.isascii() and key.isprintable():
        return key
    return "key:" + hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


def prefix_key(texts: Iterable[str]) -> str:
    """A digest of the texts, the first `PREFIX_BYTES` of them, each told apart from the next."""
    digest = hashlib.blake2b(digest_size=12)
    budget = PREFIX_BYTES
    for text in texts:
        data = text[:budget].encode()[:budget] + b"\0"
        digest.update(data)
        budget -= len(data)
        if budget <= 0:
            break
    return "prefix:" + digest.hexdigest()


def _text(part: ContentPart) -> str:
    if isinstance(part, InputImage):
        return part.image_url
    if isinstance(part, InputFile):  # the file as named: its bytes are read later (design.md 8.16)
        return part.file_id or part.file_url or part.filename or ""
    return part.refusal if isinstance(part, Refusal) else part.text
