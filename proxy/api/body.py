"""A request's body, read strictly before anything is sent upstream (design.md 5.8): within
the size limit counted on what it inflates, decompressed by the proxy itself, in time."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from typing import Any

import zstandard
from aiohttp import hdrs, web

from ..appkeys import RUNTIME
from ..errors import InvalidRequest, PayloadTooLarge, RequestTimeout, UnsupportedMediaType

_JSON_TYPES = {"application/json", "application/octet-stream"}  # the latter: no Content-Type sent
# zlib's window bits for each Content-Encoding: gzip with its header and trailer checked;
# deflate as the zlib stream HTTP means by it (or gzip: zlib tells them apart).
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 47}


async def read_body(request: web.Request) -> bytes:
    """The JSON body, decompressed, within the configured size (counted decompressed). The
    proxy decompresses itself, strictly: a gzip body must end with its checksum and size, and
    an encoding it does not know is refused, not read as plain bytes (design.md 5.8)."""
    if request.content_type not in _JSON_TYPES:
        raise UnsupportedMediaType(f"Content-Type must be application/json, not {request.content_type}.")
    config = request.app[RUNTIME].config
    limit = config.max_body_bytes
    decompressor = _decompressor(request.headers.get(hdrs.CONTENT_ENCODING, ""))
    content = request.content
    if decompressor is None and content.is_eof():
        # Most bodies: plain, and whole with the headers. Nothing to time or to build.
        body = content.read_nowait()
        if len(body) > limit:
            raise _too_large(limit)
        return body
    if decompressor is None and (request.content_length or 0) > limit:
        raise _too_large(limit)
    pieces: list[bytes] = []
    size = 0

    def take(piece: bytes) -> None:
        nonlocal size
        for data in _decompressed(decompressor, piece, limit - size + 1):
            size += len(data)
            if size > limit:
                raise _too_large(limit)
            pieces.append(data)
        if decompressor is not None and decompressor.unused_data:
            raise _cut()  # at once: what follows the compressed stream is neither read nor kept

    timeout = config.connections.body_timeout
    try:
        if content.is_eof():  # a compressed body that came whole: no timer either
            take(content.read_nowait())
        else:
            async with asyncio.timeout(timeout):  # a body trickled in holds a connection (design.md 5.11)
                async for piece in content.iter_any():
                    take(piece)
    except web.RequestPayloadError:  # a broken chunked transfer
        raise InvalidRequest("The request body could not be read: its transfer encoding is broken.") from None
    except (zlib.error, zstandard.ZstdError):
        raise InvalidRequest("The request body could not be decompressed: it is corrupt.") from None
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {timeout:g} s.") from None
    if decompressor is not None and not decompressor.eof:
        raise _cut()
    return b"".join(pieces)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")


def _cut() -> InvalidRequest:
    return InvalidRequest("The compressed request body is cut short or followed by other data.")


def _decompressor(encoding: str) -> Any:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in _WBITS:
        return zlib.decompressobj(wbits=_WBITS[encoding])
    if encoding == "zstd":
        return _Zstd()
    raise UnsupportedMediaType(
        f"Content-Encoding {encoding!r} is not supported: send zstd, gzip, deflate or none.", param="Content-Encoding"
    )


class _Zstd:
    """A zstd frame's decompressor with the interface of zlib's, `max_length` included (Codex
    can send zstd bodies). zstandard's own object inflates all it is given at once, and a few
    bytes of zstd can be megabytes: the input goes in in slices, each of which inflates to a few
    megabytes at most, until `max_length` is reached, so that a bomb is caught as early as
    with gzip (design.md 5.8)."""

    _SLICE = 64

    def __init__(self) -> None:
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self.unconsumed_tail = b""
        self.unused_data = b""

    @property
    def eof(self) -> bool:
        return bool(self._frame.eof)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out, size, at = [], 0, 0
        while at < len(data) and size < max_length and not self._frame.eof:
            piece = self._frame.decompress(data[at : at + self._SLICE])
            at += self._SLICE
            out.append(piece)
            size += len(piece)
        if self._frame.eof:
            self.unused_data, self.unconsumed_tail = self._frame.unused_data + data[at:], b""
        else:
            self.unconsumed_tail = data[at:]
        return b"".join(out)


def _decompressed(decompressor: Any, data: bytes, room: int) -> Iterator[bytes]:
    """`data` through the decompressor, in pieces of at most `room` bytes: a bomb is caught
    before it is inflated."""
    if decompressor is None:
        yield data
        return
    while data:
        yield decompressor.decompress(data, room)
        data = decompressor.unconsumed_tail
