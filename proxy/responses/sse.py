"""Incremental Server-Sent Events decoder (sans-I/O).

`feed(bytes)` takes whatever arrived and returns the `data` payload of every event it
completes. Lines end in `\\n` or `\\r\\n`; comments, `event:`, `id:` and `retry:` lines are
skipped; multi-line `data:` is joined with `\\n`. Bytes after the last newline wait in a list
of pieces that hold no newline, so each byte is searched, joined and split once: an event of
any size costs O(size) however it is split.
"""

from __future__ import annotations

from ..errors import UpstreamProtocolError

# A few tokens with their scores make an event; this bounds what one stream can hold unfinished.
DEFAULT_MAX_EVENT = 8 * 1024 * 1024


class SSEDecoder:
    def __init__(self, max_event_size: int = DEFAULT_MAX_EVENT) -> None:
        self._partial: list[bytes] = []  # the unfinished line, in pieces
        self._partial_size = 0
        self._data: list[bytes] = []  # the `data:` lines of the unfinished event
        self._event_size = 0
        self._max_event_size = max_event_size

    def feed(self, chunk: bytes) -> list[bytes]:
        whole: list[bytes] = []
        if not self._partial and not self._data and len(chunk) <= self._max_event_size:
            whole, stop = _whole_events(chunk)
            if stop == len(chunk):
                return whole
            if stop:
                chunk = chunk[stop:]  # from an event's start: nothing of the decoder's is unfinished
        end = chunk.rfind(b"\n") + 1
        if not end:
            self._hold(chunk)
            return whole
        if self._partial:
            self._partial.append(chunk[:end])
            text = b"".join(self._partial)
            self._partial = []
            self._partial_size = 0
        else:
            text = chunk[:end] if end < len(chunk) else chunk
        if end < len(chunk):
            self._hold(chunk[end:])
        return whole + self._lines(text.split(b"\n"))

    def close(self) -> list[bytes]:
        """End of input: an event cut short of its blank line still counts."""
        tail = b"".join(self._partial)
        self._partial = []
        return self._lines([tail, b"", b""])

    def _hold(self, piece: bytes) -> None:
        self._partial.append(piece)
        self._partial_size += len(piece)
        if self._partial_size + self._event_size > self._max_event_size:
            raise UpstreamProtocolError(f"upstream answer too large (an SSE event over {self._max_event_size} bytes)")

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        """Every line but the last, which is what followed the final newline (nothing)."""
        events = []
        data = self._data
        for index in range(len(lines) - 1):
            line = lines[index]
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
                    self._event_size = 0
            elif line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                data.append(value)
                self._event_size += len(value)
        if self._event_size > self._max_event_size:
            raise UpstreamProtocolError(f"upstream answer too large (an SSE event over {self._max_event_size} bytes)")
        return events


def _whole_events(chunk: bytes) -> tuple[list[bytes], int]:
    """The payloads of the whole one-line `data:` events ending in `\n\n` that a chunk starts
    with, and where they end: all of it, nearly always, as that is how upstreams write. A
    newline search per event, where the general way splits and walks every line (design.md
    7.5); what follows them (an event cut by the read, a comment, `\r\n`) goes the general way."""
    events = []
    start, size = 0, len(chunk)
    while start < size:
        end = chunk.find(b"\n", start)
        if end < 0 or chunk[end + 1 : end + 2] != b"\n" or chunk[start : start + 5] != b"data:" or chunk[end - 1] == 13:
            break
        events.append(chunk[start + 6 if chunk[start + 5] == 32 else start + 5 : end])
        start = end + 2
    return events, start
