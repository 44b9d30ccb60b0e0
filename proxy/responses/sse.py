"""Incremental Server-Sent Events decoder (sans-I/O).

`feed(bytes)` takes whatever arrived and returns the `data` payload of every event it
completes. Lines end in `\\n` or `\\r\\n`; comments, `event:`, `id:` and `retry:` lines are
skipped; multi-line `data:` is joined with `\\n`; one byte order mark before the first line is
dropped, as the SSE standard says. Bytes after the last newline wait in a list of pieces that
hold no newline, so each byte is searched, joined and split once: an event of any size costs
O(size) however it is split.
"""

from __future__ import annotations

from ..errors import UpstreamProtocolError

# A few tokens with their scores make an event; this bounds what one stream can hold unfinished.
DEFAULT_MAX_EVENT = 8 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"  # dropped before the first line (design.md 6.8)


class SSEDecoder:
    def __init__(self, max_event_size: int = DEFAULT_MAX_EVENT) -> None:
        self._head: bytes | None = b""  # the stream's first bytes, until they show whether a BOM leads
        self._partial: list[bytes] = []  # the unfinished line, in pieces
        self._partial_size = 0
        self._data: list[bytes] = []  # the `data:` lines of the unfinished event
        self._event_size = 0  # the bytes of the unfinished event's lines so far
        self._max_event_size = max_event_size
        # An event over the size limit ends the input there (design.md 6.11): the events before
        # it are still returned, whichever read it came in.
        self.failure: UpstreamProtocolError | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._head is not None:
            chunk = self._past_bom(chunk)
        if self.failure is not None:
            return []
        if not self._partial and not self._event_size and len(chunk) <= self._max_event_size:
            events, stop = _whole_events(chunk)
            if stop == len(chunk):
                return events
            if stop:
                chunk = chunk[stop:]  # from an event's start: nothing of the decoder's is unfinished
        else:
            events = []
        end = chunk.rfind(b"\n") + 1
        if not end:
            self._hold(chunk)
            return events
        if self._partial:
            self._partial.append(chunk[:end])
            text = b"".join(self._partial)
            self._partial = []
            self._partial_size = 0
        else:
            text = chunk[:end] if end < len(chunk) else chunk
        self._lines(text.split(b"\n"), events)
        if end < len(chunk) and self.failure is None:
            self._hold(chunk[end:])
        return events

    def close(self) -> list[bytes]:
        """End of input: an event cut short of its blank line still counts."""
        events: list[bytes] = []
        if self.failure is None:
            tail = b"".join(self._partial)
            self._partial = []
            self._lines([tail, b"", b""], events)
        return events

    def _past_bom(self, chunk: bytes) -> bytes:
        """The stream's first bytes without a byte order mark; none while they may be one."""
        if self._head:
            chunk = self._head + chunk
        if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
            self._head = chunk
            return b""
        self._head = None
        return chunk[len(_BOM) :] if chunk.startswith(_BOM) else chunk

    def _hold(self, piece: bytes) -> None:
        if not piece:  # an empty read: the `\r` ending what is held still ends it
            return
        self._partial.append(piece)
        self._partial_size += len(piece)
        # A `\r` that ends the piece may end its line: `_lines` does not count it then.
        if self._partial_size - (piece[-1:] == b"\r") + self._event_size > self._max_event_size:
            self._refuse()

    def _lines(self, lines: list[bytes], events: list[bytes]) -> None:
        """Every line but the last, which is what followed the final newline (nothing); the
        events they complete go to `events`."""
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
                continue
            self._event_size += len(line)
            if self._event_size > self._max_event_size:
                self._refuse()
                return
            if line[:5] == b"data:":
                data.append(line[6:] if line[5:6] == b" " else line[5:])

    def _refuse(self) -> None:
        self.failure = UpstreamProtocolError(
            f"upstream answer too large (an SSE event over {self._max_event_size} bytes)"
        )
        self._partial = []
        self._data.clear()


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
