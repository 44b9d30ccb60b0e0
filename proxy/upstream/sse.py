"""Incremental Server-Sent Events decoder (sans-I/O).

`feed(bytes)` takes whatever arrived and returns the `data` payload of every event it
completes. Lines end in `\\n` or `\\r\\n`; comments, `event:`, `id:` and `retry:` lines are
skipped; multi-line `data:` is joined with `\\n`. The buffer keeps only the unfinished line and
each byte is searched once, so an event of any size costs O(size) however it is split.
"""

from __future__ import annotations

from ..errors import UpstreamProtocolError


class SSEDecoder:
    def __init__(self, max_event_size: int = 64 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._event_size = 0
        self._max_event_size = max_event_size

    def feed(self, chunk: bytes) -> list[bytes]:
        events: list[bytes] = []
        buffer = self._buffer
        searched = len(buffer)  # the held bytes hold no newline: only new bytes need a look
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", searched)) >= 0:
            self._line(bytes(buffer[start:end]), events)
            start = searched = end + 1
        if start:
            del buffer[:start]
        if len(buffer) + self._event_size > self._max_event_size:
            raise UpstreamProtocolError(f"upstream SSE event larger than {self._max_event_size} bytes")
        return events

    def close(self) -> list[bytes]:
        """End of input: an event cut short of its blank line still counts."""
        events: list[bytes] = []
        if self._buffer:
            self._line(bytes(self._buffer), events)
            self._buffer.clear()
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            if self._data:
                events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                self._data = []
                self._event_size = 0
        elif line.startswith(b"data:"):
            value = line[6:] if line.startswith(b"data: ") else line[5:]
            self._data.append(value)
            self._event_size += len(value)
