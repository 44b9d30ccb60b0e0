"""SSEDecoder: the same events however the bytes are split, and linear work on big events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import UpstreamProtocolError
from proxy.responses.sse import SSEDecoder
from tests.events import split


def decode(pieces: list[bytes], decoder: SSEDecoder | None = None) -> list[bytes]:
    decoder = decoder or SSEDecoder()
    events = [event for piece in pieces for event in decoder.feed(piece)]
    return events + decoder.close()


# A data value: any text without line breaks (a trailing \r would read as a line ending).
values = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
# Lines that carry no data: the decoder must skip them.
noise = st.sampled_from([b":", b": keep-alive", b"event: message", b"id: 7", b"retry: 1000", b"event:"])


@st.composite
def streams(draw) -> tuple[bytes, list[bytes]]:
    """An SSE body with its expected data payloads: events of one or more data lines with
    comments and other fields mixed in, blank-line runs, either line ending."""
    nl = draw(st.sampled_from([b"\n", b"\r\n"]))
    lines: list[bytes] = []
    expected: list[bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        data = [v.encode() for v in draw(st.lists(values, max_size=3))]
        for value in data:
            lines += draw(st.lists(noise, max_size=2))
            # "data:" then one optional space, which is not part of the value.
            spaced = value.startswith(b" ") or draw(st.booleans())
            lines.append((b"data: " if spaced else b"data:") + value)
        lines += draw(st.lists(noise, max_size=1))
        lines += [b""] * draw(st.integers(1, 2))
        if data:
            expected.append(b"\n".join(data))
    body = b"".join(line + nl for line in lines)
    return body, expected


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_any_split_gives_the_same_events(stream: tuple[bytes, list[bytes]], data: st.DataObject) -> None:
    body, expected = stream
    if data.draw(st.booleans()):
        body = b"\xef\xbb\xbf" + body  # a byte order mark, which the standard drops
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=20))
    assert decode(split(body, cuts)) == expected
    assert decode([body[i : i + 1] for i in range(len(body))]) == expected


@pytest.mark.parametrize("nl", [b"\n", b"\r\n"])
def test_fields_comments_and_multiline_data(nl: bytes) -> None:
    body = nl.join([b": comment", b"event: chunk", b"id: 1", b"data: a", b"data:b", b"data: ", b"", b"", b"data: [DONE]", b"", b""])
    assert decode([body]) == [b"a\nb\n", b"[DONE]"]


@pytest.mark.parametrize("tail", [b"data: last", b"data: last\n", b"data: last\r\n"])
def test_end_without_blank_line_still_counts(tail: bytes) -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: first\n\n" + tail) == [b"first"]
    assert decoder.close() == [b"last"]


def test_close_with_nothing_pending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\n\n: trailing comment\n") == [b"x"]
    assert decoder.close() == []


class CountingBytes(bytes):
    """Bytes that count what their newline searches look at."""

    scanned = 0

    def rfind(self, sub, *args):  # type: ignore[override]
        CountingBytes.scanned += len(self)
        return super().rfind(sub, *args)


def test_whole_events_before_a_cut_are_split_by_their_newlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """design.md 7.5: a read that ends within an event hands only that event's bytes to the
    line decoder; the whole events before it are found by a newline search each."""
    monkeypatch.setattr(CountingBytes, "scanned", 0)
    decoder = SSEDecoder()
    assert decoder.feed(CountingBytes(b"data: a\n\ndata: b\n\ndata: c")) == [b"a", b"b"]
    assert CountingBytes.scanned == 0  # the line decoder got the cut event alone, as a copy
    assert decoder.feed(b"\n\n") == [b"c"]


@pytest.mark.parametrize(
    ("size", "piece"),
    [(2 * 1024 * 1024 + 3, 64 * 1024), (200_000, 1)],
    ids=["2MiB-in-64KiB-pieces", "200KB-in-1-byte-pieces"],
)
def test_big_event_in_small_pieces_is_linear(size: int, piece: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """design.md 6.8 (as h11's receive buffer): each piece is searched once, when it arrives, and held
    as it came; the held pieces are joined once, when their line completes."""
    value = bytes(range(32, 127)) * (size // 95 + 1)
    value = value[:size]
    body = b": hello\ndata: " + value + b"\ndata: tail\n\n"
    monkeypatch.setattr(CountingBytes, "scanned", 0)
    decoder = SSEDecoder()
    pieces = [CountingBytes(body[i : i + piece]) for i in range(0, len(body), piece)]
    held_most = 0
    events = []
    for chunk in pieces:
        events += decoder.feed(chunk)
        held_most = max(held_most, len(decoder._partial))
    assert events == [value + b"\ntail"]
    assert CountingBytes.scanned == len(body)
    # Pieces are kept, not copied into a growing buffer on every feed.
    assert held_most >= size // piece - 1


LIMIT = 1000


@st.composite
def an_event_near_the_limit(draw) -> tuple[bytes, list[bytes] | None]:
    """An event a few bytes either side of the limit in its lines (data or comments, their
    ends aside), between small ones, with either line ending; and the payloads it gives, None
    when the event is over."""
    nl = draw(st.sampled_from([b"\n", b"\r\n"]))
    size = draw(st.integers(LIMIT - 3, LIMIT + 3))
    first = draw(st.integers(0, size))
    lines, values = [], []
    for length, fill in ((first, b"y"), (size - first, b"z")):
        if length >= 6 and draw(st.booleans()):
            lines.append(b"data: " + fill * (length - 6))
            values.append(fill * (length - 6))
        elif length:
            lines.append(b":" + fill * (length - 1))
    body = nl.join([b"data: a", b"", b": ping", b"", *lines, b"", b"data: after", b"", b""])
    return body, None if size > LIMIT else [b"a", *([b"\n".join(values)] if values else []), b"after"]


@settings(max_examples=300, deadline=None)
@given(an_event_near_the_limit(), st.data())
def test_an_event_over_the_size_limit_ends_the_input_however_it_is_split(stream: tuple[bytes, list[bytes] | None], data: st.DataObject) -> None:
    """design.md 6.11: the events before it come out, none after it, whichever read holds it."""
    body, expected = stream
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=20))
    at_lines = [i + 1 for i, byte in enumerate(body) if byte == 10]
    for pieces in (split(body, cuts), [body], *(split(body, [cut]) for cut in at_lines), [body[i : i + 1] for i in range(len(body))]):
        decoder = SSEDecoder(max_event_size=LIMIT)
        events = decode(pieces, decoder)
        if expected is None:
            assert events == [b"a"] and isinstance(decoder.failure, UpstreamProtocolError)
        else:
            assert events == expected and decoder.failure is None


def test_an_empty_read_after_a_held_carriage_return_counts_it_no_more() -> None:
    """design.md 6.11: an event of exactly the limit, its line held up to the `\\r` of its CRLF,
    then a read of nothing: the `\\r` still ends the line, and the event passes (hypothesis found
    it counted again, and the stream failed)."""
    line = b":" + b"z" * (LIMIT - 1)
    body = b"\r\n".join([b"data: a", b"", line, b"", b"data: after", b"", b""])
    cut = body.index(line) + len(line) + 1  # just past the `\r`
    decoder = SSEDecoder(max_event_size=LIMIT)
    assert decode([body[:cut], b"", body[cut:]], decoder) == [b"a", b"after"] and decoder.failure is None
