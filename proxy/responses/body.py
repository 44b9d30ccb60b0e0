"""A request body as JSON, for every endpoint that takes one, nested within bounds
(design.md 5.8). Pure: the HTTP layer reads the bytes."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import InvalidRequest


def load_json(body: bytes, max_depth: int) -> Any:
    """A request body as JSON, for every endpoint that takes one, nested at most `max_depth`
    levels (design.md 5.8)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    # Nesting needs an opening bracket a level: a body with fewer is not walked.
    too_deep = _too_deep(data, max_depth) if body.count(b"{") + body.count(b"[") > max_depth else None
    if too_deep is not None:
        raise InvalidRequest(f"'{too_deep}' is nested more than {max_depth} levels deep.", param=too_deep)
    return data


def _too_deep(data: Any, limit: int) -> str | None:
    """The field under which `data` nests deeper than `limit` (its path told down to the third
    level), or None."""
    stack = [(data, 1, "")] if isinstance(data, dict | list) else []
    while stack:
        node, depth, path = stack.pop()
        for key, child in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(child, dict | list):
                if depth <= 3:
                    at = f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
                    child_path = path + at
                else:
                    child_path = path
                if depth >= limit:
                    return child_path
                stack.append((child, depth + 1, child_path))
    return None
