"""Files a request gives (design.md 8.16): an `input_file` part's bytes read into what a chat
message holds. A PDF becomes its text, page by page in order, each page marked, and for a route
whose model reads images each page's image too; a text file its text. Pure, and CPU-bound: the
turn layer hands the bytes in from a thread of its own. PDFium (`pypdfium2`) is imported on a
PDF's first read (2.6)."""

from __future__ import annotations

import base64
import binascii
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequest
from .schema import InputFile, InputImage, InputText

FilePart = InputText | InputImage
Detail = Literal["auto", "low", "high"]

# A page image's longest side, in pixels, by the part's `detail`: what a chat server's vision
# encoder reads at its own low and high detail.
_EDGE = {"low": 512, "auto": 1024, "high": 2048}
_PDF = b"%PDF-"
# PDFium is one library state per process, not safe to enter from two threads at once.
_PDFIUM = threading.Lock()


@dataclass(frozen=True, slots=True)
class FileLimits:
    max_bytes: int
    max_pages: int


def source(part: InputFile, where: str) -> str:
    """Which of its three sources a part gives (`file_data`, `file_id`, `file_url`): exactly
    one, else a 400 naming the part."""
    given = [name for name in ("file_data", "file_id", "file_url") if getattr(part, name) is not None]
    if len(given) != 1:
        raise InvalidRequest("An input_file gives exactly one of 'file_data', 'file_id' or 'file_url'.", param=where)
    return given[0]


def file_data(part: InputFile, where: str, limits: FileLimits) -> bytes:
    """A part's `file_data`: base64, alone or in a data URL; past the size limit, or not base64,
    a 400 naming it, the limit checked before anything is decoded."""
    data = part.file_data or ""
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        if not head.endswith(";base64"):
            raise InvalidRequest("A file_data data URL is base64 (data:<type>;base64,...).", param=f"{where}.file_data")
    if len(data) // 4 * 3 > limits.max_bytes + 2:
        raise too_large(where, limits.max_bytes)
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("'file_data' is not base64.", param=f"{where}.file_data") from None
    if len(decoded) > limits.max_bytes:
        raise too_large(where, limits.max_bytes)
    return decoded


def too_large(where: str, max_bytes: int) -> InvalidRequest:
    return InvalidRequest(
        f"The file is larger than the {max_bytes} bytes this proxy reads (files.max_bytes).", param=where
    )


def read(data: bytes, name: str, detail: Detail | None, images: bool, limits: FileLimits, where: str) -> list[FilePart]:
    """A file's bytes as the parts a message holds in its place: a PDF's text, each page marked
    (and its image, for a route that reads `images`), or a text file's text, between a line that
    names the file and one that ends it. What cannot be given to the route is a 400 naming the
    part: a file of another kind, a PDF past the page limit, one with no text (a scan) where the
    route reads no images."""
    if len(data) > limits.max_bytes:
        raise too_large(where, limits.max_bytes)
    if data.startswith(_PDF):
        with _PDFIUM:
            return _pdf(data, name, detail, images, limits, where)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = "\0"
    if "\0" in text:
        raise InvalidRequest(
            f"The file '{name}' is neither a PDF nor UTF-8 text: this proxy reads only those.", param=where
        )
    return [InputText(text=f"[file {name}]\n{text}\n[end of file {name}]\n")]


def _pdf(data: bytes, name: str, detail: Detail | None, images: bool, limits: FileLimits, where: str) -> list[FilePart]:
    import pypdfium2  # type: ignore[import-untyped]  # the first PDF pays for PDFium (design.md 2.6)

    try:
        document = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as exc:
        raise InvalidRequest(f"The PDF '{name}' cannot be read: {exc}.", param=where) from None
    try:
        count = len(document)
        if count > limits.max_pages:
            raise InvalidRequest(
                f"The PDF '{name}' has {count} pages, more than the {limits.max_pages} this proxy reads "
                "(files.max_pages).",
                param=where,
            )
        pages = [_page_text(document[index]) for index in range(count)]
        if not any(pages) and not images:
            raise InvalidRequest(
                f"The PDF '{name}' has no text (a scan?), and this route's model reads no images: "
                "send its text, or use a route that reads images (files.image_upstreams).",
                param=where,
            )
        parts: list[FilePart] = [InputText(text=f"[file {name}: PDF, {count} page{'s' if count != 1 else ''}]\n")]
        for index, text in enumerate(pages):
            parts.append(InputText(text=f"[page {index + 1}]\n{text}\n" if text else f"[page {index + 1}]\n"))
            if images:
                parts.append(_page_image(document[index], detail or "auto"))
        parts.append(InputText(text=f"[end of file {name}]\n"))
        return parts
    finally:
        document.close()


def _page_text(page: Any) -> str:
    text = page.get_textpage().get_text_bounded()
    return str(text).replace("\r\n", "\n").strip()


def _page_image(page: Any, detail: Detail) -> InputImage:
    """A page drawn with its longest side `_EDGE[detail]` pixels, as a PNG data URL."""
    width, height = page.get_size()
    bitmap = page.render(scale=_EDGE[detail] / max(width, height, 1), rev_byteorder=True)  # RGB
    png = _png(bitmap.width, bitmap.height, bitmap.stride, bytes(bitmap.buffer), bitmap.n_channels)
    return InputImage(image_url="data:image/png;base64," + base64.b64encode(png).decode(), detail=detail)


def _png(width: int, height: int, stride: int, pixels: bytes, channels: int) -> bytes:
    """Rows of 8-bit RGB (or RGBA) pixels as a PNG: no image library needed for one format."""
    row = width * channels
    rows = b"".join(b"\0" + pixels[y * stride : y * stride + row] for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    colour = 6 if channels == 4 else 2
    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")
