"""Logging setup: plain text, or JSON lines for log collectors."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# Characters that would end a text log line or drive a terminal: shown as escapes.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    return _UNPRINTABLE.sub(lambda match: match[0].encode("unicode_escape").decode(), text)


class TextFormatter(logging.Formatter):
    """One line a record: the values put into a message (where whatever a client sent lands:
    paths, field names, header values) have their line breaks and control characters escaped,
    so that no client can forge a line or drive a terminal. The message's own text is ours."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if args:
            record = logging.makeLogRecord(vars(record))
            if isinstance(args, Mapping):  # `%(name)s` arguments, as logging allows
                record.args = {key: _escaped(value) for key, value in args.items()}
            else:
                record.args = tuple(_escaped(arg) for arg in args)
        return super().format(record)


class Throttle:
    """At most one line a `period` about something a client can make happen at will."""

    def __init__(self, period: float = 1.0) -> None:
        self._period = period
        self._next = 0.0
        self._held = 0

    def allow(self) -> int | None:
        """How many were held back since the last one let through, or None: hold this one."""
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return None
        self._next = now + self._period
        held, self._held = self._held, 0
        return held


def _escaped(value: Any) -> Any:
    return value if isinstance(value, int | float) else printable(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object a line; `extra=` fields (request_id, status...) become keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((key, value) for key, value in vars(record).items() if key not in _STANDARD)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup(format: str, level: str) -> None:
    handler = logging.StreamHandler()
    if format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # Below a warning, the MCP client's libraries log every URL a client named and the servers'
    # session ids (design.md 14.2).
    for name in ("httpx2", "httpcore2", "mcp"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
