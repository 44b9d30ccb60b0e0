"""Real PDFs for the tests (design.md 8.16), written here byte by byte: each page's lines of text
in Helvetica, or (None) a page drawn with no text, as a scan is; objects, cross-reference table
and trailer as the PDF 1.4 specification lays them out, so that any reader opens them."""

from __future__ import annotations

from collections.abc import Sequence


def pdf(pages: Sequence[Sequence[str] | None]) -> bytes:
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    contents = [add(_stream(_drawn(lines))) for lines in pages]
    tree = len(objects) + len(pages) + 1  # the page tree, after the pages
    kids = [
        add(
            b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (tree, content, font)
        )
        for content in contents
    ]
    assert add(b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % kid for kid in kids), len(kids))) == tree
    catalog = add(b"<< /Type /Catalog /Pages %d 0 R >>" % tree)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    table = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, catalog, table)
    return bytes(out)


def _drawn(lines: Sequence[str] | None) -> bytes:
    if lines is None:  # a scan: marks, no text
        return b"0.2 0.2 0.2 rg 72 600 300 100 re f 72 400 200 50 re f"
    shown = b" ".join(b"(%s) Tj T*" % _escaped(line) for line in lines)
    return b"BT /F1 12 Tf 72 720 Td 14 TL " + shown + b" ET"


def _escaped(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def _stream(data: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n%s\nendstream" % (len(data), data)
